"""What the web process and the rank processes share, as plain data: the check request and
its spec, the mesh spec, the pipe messages, the typed result and the rank program's command
line.

Import rule: the standard library and `app.core` only. Never torch, never another room of
the worker: both sides import this, and the web side must stay torch-free.
"""
