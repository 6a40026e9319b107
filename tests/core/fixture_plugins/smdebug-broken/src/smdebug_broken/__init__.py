"""A plugin package whose entry-point module cannot be imported."""
