"""The check kinds: one DDP step of a plan (`ddp_check`), the tokens workload
(`token_check`) and the plan's own device mesh (`mesh_check`), each against a single-process
gradient, with the controls (deliberately wrong setups) each must tell apart and the verdict
on DDP equivalence; and, for `steps` above 1, the run that follows (`run_check` on DDP
replicas, `mesh_run` on a mesh) against the reference run (`run_referee`), with the run-level
controls (`run_controls`). `check_kinds.run_spec` picks them.

Import rule: torch, `app.core`, `measure`, `training` and `contract`. Never `rank` or
`service`, never the web stack.
"""
