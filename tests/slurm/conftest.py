"""The real Slurm cluster, one per test session (see slurm_cluster.py). Skipped, with the
reason, only where it cannot start; CI installs slurm-wlm and munge so that it runs there."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from slurm_cluster import Cluster, SlurmUnavailable, running_cluster


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    try:
        with running_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
            yield cluster
    except SlurmUnavailable as err:
        pytest.skip(str(err))
