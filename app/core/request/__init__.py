"""Floor 2: a plan request from JSON (the one parser), its limits, and JSON text as a body is read."""
