"""Training runs of a plan's recipe: the single-process reference every multi-step comparison uses."""
