"""`app.worker.example_architectures:<factory>`, as registries, exports and docs name these
factories; they live in `app.worker.zoo.example_architectures`."""

from app.worker.zoo.example_architectures import *  # noqa: F403
