"""`app.worker.token_model:tiny_language_model`, as registries and docs name the tokens
workload's example factory; it lives in `app.worker.training.token_model`."""

from app.worker.training.token_model import *  # noqa: F403
