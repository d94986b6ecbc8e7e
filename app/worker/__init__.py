"""The gradient-check worker, in rooms that say which process each part runs in and what it
may import (import-linter holds the rules; docs/architecture.md draws the map). What both
processes share (the spec, the request, the result, the pipe's messages) is the check
contract, `app.contract`, below the worker.

- `service/`   the web process: jobs, admission, execution, the warm rank pool. Never torch.
- `rank/`      a rank process: the rank program (what torchrun starts) and the warm server.
- `checks/`    the check kinds (DDP, tokens, mesh, runs) behind one driver, their controls and
               their verdicts.
- `measure/`   memory and gradient-noise measurement.
- `training/`  what a rank trains: workloads, the synthetic and token models, samplers,
               gradients, a mesh rank's share of the model.
- `zoo/`       example check models, reached only through registry strings.

The modules at this level are the entry points users name: the rank program (`python -m
app.worker.gradcheck`) and the example factories (`app.worker.example_models:mlp`, ...). Each
only re-exports its room's module.
"""
