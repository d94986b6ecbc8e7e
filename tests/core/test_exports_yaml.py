"""The YAML exports (the Kubeflow PyTorchJob, Accelerate's config) read by PyYAML, and the
hand-written YAML writer against PyYAML on arbitrary values."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from export_helpers import MIXED, export_input
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed.run import get_args_parser

from app.core.exports.parts.export_types import ExportUnsupported
from app.core.exports.parts.yaml_writer import to_yaml
from app.core.exports.registry import export
from app.schemas.examples import PLAN_EXAMPLES as EXAMPLES


def test_kubernetes_manifest_parses_and_matches_the_cluster() -> None:
    x = export_input(EXAMPLES["dataset_and_lr"]["value"])
    manifest = yaml.safe_load(export("kubernetes", x).text)
    assert manifest["apiVersion"] == "kubeflow.org/v1" and manifest["kind"] == "PyTorchJob"
    specs = manifest["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 1
    assert manifest["spec"]["nprocPerNode"] == "8"
    container = specs["Worker"]["template"]["spec"]["containers"][0]
    assert container["name"] == "pytorch"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    args = get_args_parser().parse_args(container["command"][1:])
    assert args.nnodes == "2" and args.nproc_per_node == "8"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["MICRO_BATCH_SIZE"] == "32"


def test_kubernetes_refuses_node_groups_of_different_shapes() -> None:
    with pytest.raises(ExportUnsupported, match="GPUs per node"):
        export("kubernetes", export_input(MIXED))


def test_accelerate_config_parses_with_total_process_count() -> None:
    x = export_input(EXAMPLES["dataset_and_lr"]["value"])
    config = yaml.safe_load(export("accelerate", x).text)
    assert config["num_machines"] == 2 and config["num_processes"] == 16
    assert config["mixed_precision"] == "no"  # quoted: a bare `no` is YAML 1.1 false
    assert config["distributed_type"] == "MULTI_GPU"


yaml_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)


yaml_values = st.recursive(
    yaml_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(
    st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9_.]{0,8}", fullmatch=True), yaml_values, min_size=1, max_size=5
    )
)
def test_hand_written_yaml_reads_back_identically_with_pyyaml(value: dict[str, Any]) -> None:
    assert yaml.safe_load(to_yaml(value)) == value
