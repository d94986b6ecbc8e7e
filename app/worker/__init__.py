"""The gradient-check worker, in rooms that say which process each part runs in and what it
may import (import-linter holds the rules; docs/architecture.md draws the map):

- `contract/`  torch-free data both processes share: the check spec and request, the mesh
               spec, the pipe messages, the typed result, the rank program's command line.
- `service/`   the web process: jobs, admission, execution, the warm rank pool. Never torch.
- `rank/`      a rank process: the rank program (what torchrun starts) and the warm server.
- `checks/`    the check kinds (DDP, tokens, mesh), their controls and their verdicts.
- `measure/`   memory and gradient-noise measurement.
- `training/`  what a rank trains: workloads, the synthetic and token models, samplers,
               gradients, a mesh rank's share of the model.
- `zoo/`       example check models, reached only through registry strings.

The modules at this level are the names users, exports and docs already give: the rank
program (`python -m app.worker.gradcheck`), the example factories
(`app.worker.example_models:mlp`, ...), the token model's factory and the samplers. Each
only re-exports its room's module.
"""
