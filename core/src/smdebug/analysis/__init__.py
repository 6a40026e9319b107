"""Helpers for analysing trials (smdebug 1.0's ``smdebug.analysis``)."""
