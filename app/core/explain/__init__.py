"""Floor 3: what a plan says in words: its explanation, throughput sentences and run-scale warnings."""
