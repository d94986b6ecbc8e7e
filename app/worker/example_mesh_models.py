"""`app.worker.example_mesh_models:<factory>`, as registries, exports and docs name these
factories; they live in `app.worker.zoo.example_mesh_models`."""

from app.worker.zoo.example_mesh_models import *  # noqa: F403
