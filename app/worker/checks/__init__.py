"""The check kinds behind one driver: the `CheckKind` protocol and the context every phase
reads (`kind`), the driver that runs a spec's kinds stage by stage (`driver.run_spec`), and the
registry of kinds (`registry`). A kind with helpers is a folder, named without its prefix
inside; a kind of one module stays a module; what kinds share stays here.

- step kinds: one DDP step of a plan (`ddp_check`), the tokens workload (`token_check`) and
  the plan's own device mesh (`mesh/`), each against a single-process gradient, with the
  controls (deliberately wrong setups) each must tell apart and the verdict on DDP
  equivalence (`controls`, `result_parts`, `shards`, `equivalence*`, `probe_answers`);
- run kinds, for `steps` above 1: the run that follows on DDP replicas or on a mesh (`run/`),
  or resumed on fewer replicas (`resume/`), against the reference run;
- after kinds: the throughput curve (`throughput_check`), the lr-scaling probe (`lr_scaling/`).

Import rule: torch, `app.core`, `app.contract`, `measure` and `training`. Never `rank` or
`service`, never the web stack.
"""
