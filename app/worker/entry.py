"""The target the pool forks: torch-free here, so the web process never imports torch to
name it; the fork server has already imported `app.worker.rank_server`."""

from __future__ import annotations

from multiprocessing.connection import Connection


def serve(conn: Connection, describe: dict[str, str] | None = None) -> None:
    from app.worker.rank_server import serve as serve_ranks

    serve_ranks(conn, describe)
