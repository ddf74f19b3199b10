"""Recipes: end-to-end experiments runnable as ``python -m longmoe.recipes.<name>``."""
