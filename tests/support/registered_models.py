"""The operator models the worker tests' shared warm app registers (tests/worker/conftest.py):
the examples, three broken entries, the token model as `tiny_lm` and the mesh model as `mesh_mlp`."""

from __future__ import annotations

EXAMPLES = "app.worker.example_models"
GOOD = [
    "mlp",
    "batchnorm_mlp",
    "dropout_mlp",
    "rank_dependent_mlp",
    "unused_parameter_mlp",
    "quadratic",
    "wide_mlp",
]
BROKEN = {
    # A module that is not installed stops start-up (test_check_model_startup.py); one whose
    # factory is not there is found by the ranks' probe, as the other two are.
    "missing": f"{EXAMPLES}:no_such_factory",
    "not_callable": f"{EXAMPLES}:FEATURES",
    "wrong_return": f"{EXAMPLES}:quadratic_data",
}
TOKEN_MODEL = f"{EXAMPLES}:tiny_language_model"
MESH_MODEL = "app.worker.example_mesh_models:mesh_mlp"  # a factory with parallelize() beside it


def registry() -> str:
    """BATCHPLAN_CHECK_MODELS for all of them."""
    entries = [f"{name}={EXAMPLES}:{name}" for name in GOOD]
    entries += [f"{name}={target}" for name, target in BROKEN.items()]
    return ",".join([*entries, f"tiny_lm={TOKEN_MODEL}", f"mesh_mlp={MESH_MODEL}"])
