"""Floor 3: plans counted in tokens."""
