"""Catalog data files (GPUs, models, presets); loaded by clustersim.catalog."""
