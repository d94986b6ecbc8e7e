"""`app.worker.example_hf_models:<factory>`, as registries, exports and docs name these
factories; they live in `app.worker.zoo.example_hf_models`."""

from app.worker.zoo.example_hf_models import *  # noqa: F403
