"""The check kinds over HTTP, one module a kind: its request model (with `to_core()`, the
contract's options), its result models, the fields `CheckRequestIn` and `CheckResultOut` take
(each with its description, one line there) and its Swagger examples.

- `run`: `steps` above 1 (its keys stand in the result's own object);
- `resume`: the run checkpointed and resumed on other replicas;
- `throughput`: one replica's micro-step timed at each micro-batch;
- `lr_scaling`: the lr-scaling probe.
"""
