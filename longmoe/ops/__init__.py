"""longmoe.ops."""
