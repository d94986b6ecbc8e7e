"""The lr-scaling probe kind (docs/lr-scaling.md): the base run and each rule's run spread over
the ranks (`probe.LrScalingProbe`), and their judgement (`verdict`)."""
