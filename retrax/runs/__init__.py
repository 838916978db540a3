"""A run directory read back: the settings (`config`) and data (`data`) it
records, and its model with its latest weights (`loading.load_run`, also
`retrax.load_run`)."""
