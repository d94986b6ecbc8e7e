"""The worker inside the web process: the check service, admission, execution, the job
store, the limits and the warm rank pool that runs checks in forked rank processes.

Import rule: `app.core`, `app.logging_setup`, `app.ports` and `worker.contract`. Never torch,
directly or through another room: the rank processes import torch, this side only names them
(see `fork_server.RANK_SERVER`).
"""
