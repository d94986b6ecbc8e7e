"""`app.worker.example_models:<factory>`, as registries, exports and docs name these
factories; they live in `app.worker.zoo.example_models`."""

from app.worker.zoo.example_models import *  # noqa: F403
