"""Small utilities: configuration checks, result files, library compatibility."""
