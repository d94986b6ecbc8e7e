"""`from app.worker.samplers import ProportionalSampler`, as the docs give it to training
scripts; the samplers live in `app.worker.training.samplers`."""

from app.worker.training.samplers import *  # noqa: F403
