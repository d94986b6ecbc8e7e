"""The check kinds behind one driver: the `CheckKind` protocol and the context every phase
reads (`kind`), the driver that runs a spec's kinds in order (`driver.run_spec`), and the
registry of kinds (`registry`). Step kinds: one DDP step of a plan (`ddp_check`), the tokens
workload (`token_check`) and the plan's own device mesh (`mesh_check`), each against a
single-process gradient, with the controls (deliberately wrong setups) each must tell apart
and the verdict on DDP equivalence. After kinds, for `steps` above 1: the run that follows
(`run_check` on DDP replicas, `mesh_run` on a mesh) against the reference run
(`run_referee`), with the run-level controls (`run_controls`).

Import rule: torch, `app.core`, `app.contract`, `measure` and `training`. Never `rank` or
`service`, never the web stack.
"""
