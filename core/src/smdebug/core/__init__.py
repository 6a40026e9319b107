"""smdebug 1.0's ``smdebug.core`` module paths (``from smdebug.core.modes import ModeKeys``, as its analysis
documentation writes them), resolving to this package's modules."""
