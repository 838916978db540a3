"""A run directory read back: the settings (`config`) and data (`data`) it
records."""
