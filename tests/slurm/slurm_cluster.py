"""A real Slurm cluster on this host for the tests: munged, slurmctld and two slurmd "nodes",
each with its own folder, port and munge socket, so that nothing else on the machine (another
Slurm, another munged) is touched. Each node declares two fake GPUs (symlinks to /dev/null),
which is enough for Slurm to allocate them and set CUDA_VISIBLE_DEVICES per job.

The node names must resolve (the Slurm export uses the first one as MASTER_ADDR), so the nodes
are named after this host and `localhost`; both answer on 127.0.0.1 where slurmd listens. Two
such clusters would both call themselves these nodes on this host, so one runs at a time: a
lock that every test run on the host takes (two pytest-xdist workers, or two checkouts).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from app.ports import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
# Host-wide, not per run: it is what keeps two runs' clusters apart.
LOCK = Path(tempfile.gettempdir()) / "batchplan-test-slurm-cluster.lock"
LOCK_WAIT_S = 240  # another run's jobs take about a minute; the test's own timeout is 300 s
CPUS_PER_NODE = 8  # declared, not real: config_overrides keeps slurmd from draining the node
GPUS_PER_NODE = 2


class SlurmUnavailable(RuntimeError):
    """Why no cluster could start here; the tests skip with it."""


@dataclass
class Cluster:
    root: Path
    nodes: tuple[str, ...]
    env: dict[str, str]
    pids: dict[str, int] = field(default_factory=dict)

    def run(self, *args: str, timeout: float = 30) -> str:
        done = subprocess.run(
            args, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode:
            raise AssertionError(f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def submit(self, script: Path, *options: str) -> str:
        """The job id of `sbatch --parsable script`, run in the script's folder."""
        out = self.run("sbatch", "--parsable", f"--chdir={script.parent}", *options, str(script))
        return out.strip().split(";")[0]

    def state(self, job: str) -> str:
        # squeue forgets a job soon after it ends; scontrol keeps it for MinJobAge seconds.
        out = self.run("scontrol", "show", "job", job, "--oneliner")
        states = {word.split("=", 1)[1] for word in out.split() if word.startswith("JobState=")}
        # A heterogeneous job shows a line per component: it is finished when all of them are.
        if states <= {"COMPLETED"}:
            return "COMPLETED"
        if states & {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING"}:
            return "RUNNING"
        return ",".join(sorted(states))

    def wait(self, job: str, timeout: float = 240) -> str:
        deadline = time.monotonic() + timeout
        while (state := self.state(job)) == "RUNNING":
            if time.monotonic() > deadline:
                self.run("scancel", job)
                raise AssertionError(f"job {job} still running after {timeout} s")
            time.sleep(0.5)
        return state


def _hostnames() -> tuple[str, str]:
    """Two names of this host that resolve to a local address."""
    names = []
    for name in (socket.gethostname(), "localhost"):
        with contextlib.suppress(OSError):
            if socket.gethostbyname(name).startswith("127.") and name not in names:
                names.append(name)
    if len(names) < 2:
        raise SlurmUnavailable(f"two names of this host must resolve to 127.0.0.1; found {names}")
    return names[0], names[1]


def _config(root: Path, nodes: tuple[str, str], host: str) -> str:
    ctld_port = free_port()
    lines = [
        "ClusterName=batchplan-test",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={free_port()}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge/munge.sock",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/slurmctld.log",
        f"SlurmdLogFile={root}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",  # heterogeneous jobs need it
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "MpiDefault=none",
        "GresTypes=gpu",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MinJobAge=600",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "KillWait=5",
    ]
    for name in nodes:
        lines.append(
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} "
            f"CPUs={CPUS_PER_NODE} Boards=1 SocketsPerBoard=1 CoresPerSocket={CPUS_PER_NODE} "
            f"ThreadsPerCore=1 RealMemory=1000 Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
        )
    lines.append("PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _gres(root: Path, nodes: tuple[str, ...]) -> str:
    lines = []
    for name in nodes:
        for i in range(GPUS_PER_NODE):
            device = root / "dev" / f"{name}-gpu{i}"
            device.symlink_to("/dev/null")
        lines.append(f"NodeName={name} Name=gpu File={root}/dev/{name}-gpu[0-{GPUS_PER_NODE - 1}]")
    return "\n".join(lines) + "\n"


def _start(args: list[str], env: dict[str, str], log: Path) -> None:
    with log.open("ab") as out:
        done = subprocess.run(args, env=env, stdout=out, stderr=out, timeout=30, check=False)
    if done.returncode:
        raise SlurmUnavailable(f"{args[0]} did not start ({done.returncode}): {log.read_text()[-600:]}")


def _pid(path: Path, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # IndexError: the daemon has created the file but not yet written its pid.
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int(path.read_text().split()[0])
        time.sleep(0.05)
    raise SlurmUnavailable(f"no pid file {path}")


def _stop(pid: int, timeout: float = 10) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _wait_idle(cluster: Cluster, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    out = ""
    while time.monotonic() < deadline:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            out = cluster.run("sinfo", "--noheader", "--Node", "--format=%N %t")
            states = dict(line.split() for line in out.splitlines())
            if sorted(states) == sorted(cluster.nodes) and set(states.values()) == {"idle"}:
                return
        time.sleep(0.2)
    raise SlurmUnavailable(f"the nodes did not become idle in {timeout} s: {out.strip()!r}")


@contextlib.contextmanager
def host_lock(path: Path = LOCK, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold `path` exclusively (flock: released if this process dies), waiting up to `wait_s`
    while another process holds it."""
    with path.open("a+") as lock:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    lock.seek(0)
                    raise RuntimeError(
                        f"another test cluster held {path} for {wait_s} s (its pid: {lock.read().strip()})"
                    ) from None
                time.sleep(0.5)
        try:
            lock.truncate(0)
            lock.write(str(os.getpid()))
            lock.flush()
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def running_cluster(root: Path) -> Iterator[Cluster]:
    """Start the cluster in `root`; stop each daemon by its PID on the way out."""
    missing = [d for d in DAEMONS if shutil.which(d, path="/usr/sbin:/sbin:" + os.environ["PATH"]) is None]
    if missing or os.geteuid() != 0:
        why = f"{', '.join(missing)} not installed" if missing else "the daemons run as root"
        raise SlurmUnavailable(f"no Slurm here ({why}): apt-get install slurm-wlm munge, as .ci/run does")
    with host_lock():
        yield from _run_cluster(root)


def _run_cluster(root: Path) -> Iterator[Cluster]:
    nodes = _hostnames()
    host = socket.gethostname()
    for sub in ("munge", "state", "dev", *(f"spool/{n}" for n in nodes)):
        (root / sub).mkdir(parents=True, exist_ok=True, mode=0o755)
    (root / "slurm.conf").write_text(_config(root, nodes, host))
    (root / "gres.conf").write_text(_gres(root, nodes))
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf"), "PATH": f"/usr/sbin:{os.environ['PATH']}"}
    cluster = Cluster(root, nodes, env)
    try:
        _start(
            [
                "munged",
                "--force",
                f"--socket={root}/munge/munge.sock",
                f"--key-file={key}",
                f"--pid-file={root}/munge/munged.pid",
                f"--log-file={root}/munge/munged.log",
                f"--seed-file={root}/munge/munged.seed",
            ],
            env,
            root / "start.log",
        )
        cluster.pids["munged"] = _pid(root / "munge" / "munged.pid")
        _start(["slurmctld", "-c", "-i"], env, root / "start.log")
        cluster.pids["slurmctld"] = _pid(root / "slurmctld.pid")
        for name in nodes:
            _start(["slurmd", "-N", name], env, root / "start.log")
            cluster.pids[f"slurmd {name}"] = _pid(root / f"slurmd-{name}.pid")
        _wait_idle(cluster)
        yield cluster
    finally:
        # Nodes first, then the controller, then munge: each by the PID it wrote.
        for name in reversed(list(cluster.pids)):
            _stop(cluster.pids[name])
