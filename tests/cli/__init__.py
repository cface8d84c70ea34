"""The commands end to end, and their views."""
