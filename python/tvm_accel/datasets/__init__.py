"""Real data sets for accuracy checks of the whole chain (nothing is downloaded)."""
