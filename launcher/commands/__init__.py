"""One module per CLI verb that needs more than a few lines."""
