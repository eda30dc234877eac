"""Data sources: random-access readers of records."""
