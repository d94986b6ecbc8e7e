"""The check kinds' contract, one module a kind: its request options, its spec and its rules
against the plan (each refusal a 422 at its field), and its result record.

- `run`: `steps` above 1, a run of the plan's recipe after the first step;
- `resume`: that run checkpointed and resumed on other replicas;
- `throughput`: one replica's micro-step timed at each micro-batch;
- `lr_scaling`: the lr-scaling probe.

`part.RequestPart` is what `request.build_spec` runs of each, in `registry.REQUEST_PARTS`'
order. A kind's module imports neither the request, the spec nor the result (they import
it, for its records' types): it names them for mypy only.
"""
