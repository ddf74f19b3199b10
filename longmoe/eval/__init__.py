"""longmoe.eval."""
