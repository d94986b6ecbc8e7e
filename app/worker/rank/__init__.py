"""A rank process: the rank program (`python -m app.worker.gradcheck`, what torchrun starts)
and the warm rank server the pool forks, with how ranks meet (rendezvous) and report a
model's error.

Import rule: torch, `app.core` and the worker's rank side (`checks`, `measure`, `training`,
`contract`). Never the web stack or `worker.service`: it runs wherever torch runs.
"""
