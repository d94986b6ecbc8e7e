"""Floor 4: resuming a run on another world size, and elastic plans."""
