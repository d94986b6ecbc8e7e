"""The Dockerfile's build targets (`api`, `worker`) read as data: what each image gets from the
stages it is built FROM and the stages it copies, and its CMD and HEALTHCHECK run here, with the
target's environment mapped onto this machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.image import Stage, exec_form, parse_dockerfile
from support.servers import HOST


def named_stages() -> dict[str, Stage]:
    stages = parse_dockerfile()[1]
    assert all(stage.name for stage in stages), "every stage is named, so that it can be a target"
    return {str(stage.name): stage for stage in stages}


def lineage(target: str) -> list[Stage]:
    """`target` and the stages it is built FROM, base first."""
    stages = named_stages()
    chain = [stages[target]]
    while chain[0].base in stages:
        chain.insert(0, stages[chain[0].base])
    return chain


def copied_from(target: str) -> list[str]:
    """The stages whose files `target` copies (COPY --from=...)."""
    return [
        args.split()[0].removeprefix("--from=")
        for stage in lineage(target)
        for args in stage.all("COPY")
        if args.startswith("--from=")
    ]


def image_stages(target: str) -> list[Stage]:
    """Every stage that makes `target`'s files: its lineage and what it copies, recursively."""
    found: list[Stage] = []
    for stage in lineage(target):
        found.append(stage)
    for source in copied_from(target):
        found += image_stages(source)
    return found


def inherited(target: str, keyword: str) -> str:
    """What the image of `target` gets from its lineage's last `keyword` (CMD, USER, ...)."""
    values = [args for stage in lineage(target) for args in stage.all(keyword)]
    assert values, f"{target} has no {keyword}"
    return values[-1]


def dockerfile_env(target: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for stage in lineage(target):
        env |= stage.env()
    return env


def healthcheck_of(target: str) -> tuple[dict[str, str], list[str]]:
    head, sep, command = inherited(target, "HEALTHCHECK").partition("CMD ")
    assert sep
    return dict(opt.lstrip("-").split("=", 1) for opt in head.split()), exec_form(command)


# What the api image lacks, made so here: `import torch` fails in every process started with it.
NO_TORCH = """
import importlib.abc, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r} (the planner-only image)", name=name)
        return None

sys.meta_path.insert(0, NoTorch())
"""


def process_env(target: str, tmp_path: Path, *, torch: bool = True) -> dict[str, str]:
    """The environment `target` gives its process, mapped onto this machine: /data and /tmp
    under `tmp_path`, the venv's bin first on PATH, the user's missing home; without `torch`,
    torch cannot be imported."""
    env = dict(os.environ)
    for key, value in dockerfile_env(target).items():
        root = next((r for r in ("/data/", "/tmp/") if value.startswith(r)), None)
        env[key] = value if root is None else str(tmp_path / root.strip("/") / value.removeprefix(root))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env["HOME"] = "/nonexistent"  # the image's user has no home: nothing may write there
    if not torch:
        blocker = tmp_path / "no-torch"
        blocker.mkdir(exist_ok=True)
        (blocker / "sitecustomize.py").write_text(NO_TORCH)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(blocker), env.get("PYTHONPATH")]))
    return env


def target_argv(target: str, port: int) -> list[str]:
    """The target's CMD, on loopback and a free port instead of 0.0.0.0:8000."""
    argv = exec_form(inherited(target, "CMD"))
    for flag, value in (("--host", HOST), ("--port", str(port))):
        argv[argv.index(flag) + 1] = value
    return argv


def run_healthcheck(target: str, port: int, env: dict[str, str]) -> int:
    """The exit status of the target's HEALTHCHECK, pointed at `port`."""
    check = [arg.replace("127.0.0.1:8000", f"{HOST}:{port}") for arg in healthcheck_of(target)[1]]
    return subprocess.run(check, env=env, capture_output=True, timeout=15, check=False).returncode
