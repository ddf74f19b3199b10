"""longmoe.serve."""
