"""longmoe.layers."""
