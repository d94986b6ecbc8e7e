"""Floor 0: the typed records every layer passes (the plan request, the plan, a resume, a
schedule, a throughput curve) and the integer arithmetic beneath them. Standard library only."""
