"""HTTP models of POST /v1/plans/elastic (DeepSpeed-style elasticity), with Swagger examples."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from app.core.errors.domain import InvalidValue
from app.core.records.plan_request import MAX_SAFE_INTEGER, DatasetSpec
from app.core.request import parse as core_request
from app.core.request.dataset import dataset_spec
from app.core.resume import elastic as core_elastic
from app.core.resume.elastic_resume import ElasticResumeSpec
from app.schemas.checked_suggestions import checked_suggestions_validator
from app.schemas.plan_recipe_in import LearningRateIn
from app.schemas.plan_requests import DatasetIn
from app.schemas.types import WHOLE, Count, GpuCount, RequestModel, ResponseModel, with_examples

ELASTIC_REQUEST_EXAMPLE: dict[str, Any] = {
    "min_gpus": 32,
    "max_gpus": 1500,
    "micro_batch_sizes": [8, 12, 16, 17],
    "max_global_batch_size": 10000,
    "prefer_larger": True,
    "learning_rate": {"base_lr": 0.0003, "base_batch_size": 256, "optimizer": "adamw"},
}

# 7 GPUs with micro-batch 2 divide no batch of at most 8: refused (the documented 422).
ELASTIC_INFEASIBLE_EXAMPLE: dict[str, Any] = {
    "min_gpus": 7,
    "max_gpus": 7,
    "micro_batch_sizes": [2],
    "max_global_batch_size": 8,
}


class ElasticRequestIn(RequestModel):
    """DeepSpeed-style elasticity: one global batch for a range of data-parallel GPU counts."""

    model_config = with_examples(ELASTIC_REQUEST_EXAMPLE)

    min_gpus: GpuCount = Field(description="Fewest data-parallel GPUs the job may run on.")
    max_gpus: GpuCount = Field(description="Most data-parallel GPUs the job may run on.")
    micro_batch_sizes: list[Annotated[int, Field(ge=1, le=core_elastic.MAX_MICRO_BATCH), WHOLE]] = Field(
        min_length=1,
        max_length=core_elastic.MAX_MICRO_CHOICES,
        description="Micro-batches a GPU may take.",
    )
    max_global_batch_size: Count = Field(description="The target: the global batch is at most this.")
    prefer_larger: bool = Field(True, strict=True, description="Break ties toward the larger batch.")
    learning_rate: LearningRateIn | None = None
    dataset: DatasetIn | None = Field(None, description="The data the run reads; needed for resume.")
    resume: ElasticResumeIn | None = Field(
        None,
        description="Where a run of this plan was checkpointed: each count then says where it goes on when "
        "restarted there, and whether it sees the uninterrupted run's global batches (docs/resume.md).",
    )

    # On a schema error, suggest only values with which the search succeeds.
    _checked = checked_suggestions_validator(core_elastic.elastic_plan)

    def to_core(self) -> core_elastic.ElasticRequest:
        lr = self.learning_rate
        return core_elastic.ElasticRequest(
            min_gpus=self.min_gpus,
            max_gpus=self.max_gpus,
            micro_batch_sizes=tuple(self.micro_batch_sizes),
            max_global_batch_size=self.max_global_batch_size,
            prefer_larger=self.prefer_larger,
            learning_rate=core_request.learning_rate(lr.model_dump() if lr else None),
            dataset=_map_dataset(self.dataset) if self.dataset else None,
            resume=ElasticResumeSpec(self.resume.optimizer_step, self.resume.data_parallel_size)
            if self.resume
            else None,
        )


def _map_dataset(dataset: DatasetIn) -> DatasetSpec:
    """The dataset as the core reads it; a stream is refused: the elastic table resumes through
    DistributedSampler's epoch, which a stream has not."""
    spec = dataset_spec(dataset)
    if spec.kind == "stream":
        raise InvalidValue(
            "the elastic table resumes a map-style dataset's sampler; a stream's readers keep their state",
            pointer="/dataset/kind",
        )
    return spec


class ElasticResumeIn(RequestModel):
    optimizer_step: Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER), WHOLE] = Field(
        description="Optimizer steps taken before the checkpoint."
    )
    data_parallel_size: GpuCount = Field(
        description="The count the run was checkpointed on: one of the counts."
    )


class CountResumeOut(ResponseModel):
    epoch: int = Field(
        description="The uninterrupted run's epoch at the step: call sampler.set_epoch(epoch)."
    )
    step_in_epoch: int
    skip_micro_batches: int = Field(description="Each rank's, from the epoch's start, on this count.")
    same_global_batches: bool = Field(
        description="Every later step sees the uninterrupted run's global batch (the epoch ends alike here)."
    )


class ElasticCountOut(ResponseModel):
    gpus: int
    micro_batch_size: int
    gradient_accumulation_steps: int
    resume: CountResumeOut | None = Field(
        None, description="With the request's resume: the resume on this count."
    )


class ElasticLearningRateOut(ResponseModel):
    rule: str
    base_lr: float
    base_batch_size: int
    factor: float
    lr: float = Field(description="The same at every GPU count: the global batch does not change.")


class ElasticOut(ResponseModel):
    model_config = with_examples(
        {
            "global_batch_size": 9792,
            "valid_gpus": [32, 34, 36],
            "counts": [{"gpus": 32, "micro_batch_size": 17, "gradient_accumulation_steps": 18}],
            "candidates": [9792],
            "coverage": 0.0157,
            "learning_rate": None,
            "warnings": [],
            "deepspeed": {"elasticity": {"enabled": True, "max_train_batch_size": 10000}},
        }
    )

    global_batch_size: int
    valid_gpus: list[int]
    counts: list[ElasticCountOut] = Field(description="Per GPU count: batch = micro x accumulation x gpus.")
    candidates: list[int] = Field(description="The batches DeepSpeed's search considers.")
    coverage: float = Field(description="Share of the counts in [min_gpus, max_gpus] that work.")
    learning_rate: ElasticLearningRateOut | None
    warnings: list[str]
    deepspeed: dict[str, Any] = Field(description="The `elasticity` block for a DeepSpeed config.")
