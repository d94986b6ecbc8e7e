"""Process helpers of the reliability suite."""

from __future__ import annotations

from pathlib import Path


def session_processes(sid: int) -> list[int]:
    """Pids of live (not zombie) processes whose session id is `sid`, from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            pids.append(int(entry.name))
    return pids
