"""longmoe.data."""
