"""What the web process and the rank processes share, as plain data: the check request, its
options and the one builder of its spec, the mesh spec, the pipe messages, the typed result,
the rank program's command line, and the one dynamic import (`targets`).

Import rule: the standard library and `app.core` only. Never torch, never another room of
the worker: both sides import this, and the web side must stay torch-free.
"""
