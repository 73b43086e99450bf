"""WALQueue."""
