"""The check contract: what the web process and the rank processes share about a check, as
plain records: the request and the one builder of its spec, the spec every rank runs, the
typed result, each check kind's options, rules and result (`kinds/`, one module a kind), a job
and its statuses, the check's options, the model registry, the host's and the models'
descriptions, the messages on the pipe between the pool and its ranks, and the one codec that
carries every record across a process (the pipe, the job store, the TCPStore).

Import rule: the standard library and `app.core` only (import-linter holds it). Never torch,
never the web stack: the HTTP schemas (`app.schemas`) and the worker (`app.worker`) both
import this, and the web side must stay torch-free.
"""
