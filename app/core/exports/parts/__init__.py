"""The pieces export formats are built from; formats import these, never each other."""
