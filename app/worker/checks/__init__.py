"""The check kinds: one DDP step of a plan (`ddp_check`), the tokens workload
(`token_check`) and the plan's own device mesh (`mesh_check`), each against a single-process
gradient, with the controls (deliberately wrong setups) each must tell apart and the verdict
on DDP equivalence. `check_kinds.run_spec` picks one.

Import rule: torch, `app.core`, `measure`, `training` and `contract`. Never `rank` or
`service`, never the web stack.
"""
