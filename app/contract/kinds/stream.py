"""A stream check, the contract half: what a check of a stream plan (dataset kind "stream")
carries to its ranks (`StreamCheck`), the rules that refuse what it cannot run (`StreamPart`,
each a 422 at its field), and what it returns (`StreamOutcome`).

The ranks read the plan's stream through real DataLoader worker processes and the real
splitter (app.worker.checks.stream_check); the samples each trains are held to the plan's
prediction (app.core.split.stream.ids) and every step's gradient to the single-process mean.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from app.contract.kinds.part import RequestPart, Trained
from app.contract.spec_error import SpecError
from app.contract.targets import missing_module
from app.core.records.stream import StreamSpec

if TYPE_CHECKING:
    from app.contract.request import CheckRequest
    from app.contract.spec import CheckSpec

# Each rank's DataLoader starts its workers for the plan and again for each control that
# reads differently: a check spawns at most this many worker processes at once, so a 2-core
# host is not swamped (a job's 8 workers x 64 ranks is checked on fewer).
MAX_CHECK_LOADER_WORKERS = 16
# The library each splitter's check reads through (rank_worker's reader is torch's own).
LIBRARIES = {"hf_datasets": "datasets", "webdataset": "webdataset"}
# Every sample's id is listed, gathered on rank 0 and compared: a check reads a small stream.
MAX_CHECK_STREAM_SAMPLES = 65_536


@dataclass(frozen=True, slots=True)
class StreamCheck:
    """The stream every rank reads (the plan request's), each data-parallel rank's micro-batch
    size, and the micro-batches of an optimizer step."""

    dataset: StreamSpec
    micro_batch_sizes: tuple[int, ...]
    accumulation: int


class StreamPart(RequestPart):
    """A stream plan's check: the stream's own epoch in place of the sampler's, on one process
    per data-parallel rank; what it cannot run alongside is refused at its field."""

    option: ClassVar[str] = "plan"  # no option of its own: the plan's dataset is a stream

    def apply(self, request: CheckRequest, trained: Trained, spec: CheckSpec) -> CheckSpec:
        dataset = trained.request.dataset
        stream = dataset.stream if dataset is not None else None
        if stream is None:
            return spec
        _refuse_with_a_stream(request, spec)
        library = LIBRARIES.get(stream.splitter or "")
        if library is not None and missing_module(library) is not None:
            raise SpecError(
                f"this server's worker cannot check a stream split by {stream.splitter}: {library!r} is not "
                f"installed here (pip install {library}, the version the project's dev dependencies pin); "
                'splitter "rank_worker" needs torch alone',
                "/plan/dataset/splitter",
            )
        readers = spec.data_parallel_size * stream.num_workers
        if readers > MAX_CHECK_LOADER_WORKERS:
            fits = MAX_CHECK_LOADER_WORKERS // spec.data_parallel_size
            raise SpecError(
                f"a stream check starts {spec.data_parallel_size} x {stream.num_workers} DataLoader worker "
                f"processes, more than the {MAX_CHECK_LOADER_WORKERS} it runs at once: check with "
                f"num_workers {fits} (the split over workers is the same rule)",
                "/plan/dataset/num_workers",
            )
        total = sum(stream.shard_samples) if stream.shard_samples is not None else stream.num_samples or 0
        if total > MAX_CHECK_STREAM_SAMPLES:
            raise SpecError(
                f"a stream check lists every sample it trains: give at most {MAX_CHECK_STREAM_SAMPLES} "
                f"samples (num_samples {MAX_CHECK_STREAM_SAMPLES}), not {total}",
                "/plan/dataset/num_samples",
            )
        planned = trained.plan.stream
        if planned is not None and planned.optimizer_steps_per_epoch == 0:
            raise SpecError(
                "a stream check trains one pass of the stream, which fills no optimizer step here: give "
                "more samples or a smaller global batch",
                "/plan/dataset/num_samples",
            )
        micro = tuple(spec.micro_batch_sizes())
        return replace(spec, stream=StreamCheck(stream, micro, spec.gradient_accumulation_steps))


def _refuse_with_a_stream(request: CheckRequest, spec: CheckSpec) -> None:
    """What a stream check does not run with it: each refused at the option that asks it."""
    options = request.options
    refusals = (
        (spec.mesh is not None, "/plan/parallelism", "a device mesh (tensor, pipeline or context above 1)"),
        (spec.workload == "tokens", "/workload", 'the tokens workload (workload "synthetic")'),
        (options.steps > 1, "/steps", "a run of several steps (steps 1: it trains every step of the epoch)"),
        (options.fit_micro_batch is not None, "/fit_micro_batch", "a micro-batch search"),
        (
            options.resume is not None,
            "/resume",
            "a resume (the resume check checkpoints a sampler's run and resumes it; a rank_worker stream's "
            "resume is answered by POST /v1/plans with resume, in resume.stream, and not run by a check)",
        ),
        (options.lr_scaling is not None, "/lr_scaling", "an lr-scaling probe"),
        (spec.packing is not None or request.plan.packing is not None, "/plan/packing", "packed rows"),
    )
    for refused, pointer, what in refusals:
        if refused:
            raise SpecError(
                f"a stream check reads the stream's own epoch; it does not run with {what}", pointer
            )


@dataclass(frozen=True, slots=True)
class StreamRanks:
    """Consecutive ranks [rank, stop) that trained the same figures in the epoch."""

    rank: int
    stop: int
    samples: int  # samples each trained, repeats included
    micro_batches: int


@dataclass(frozen=True, slots=True)
class SampleCounts:
    """The stream's samples by how often the epoch trained them."""

    seen_once: int
    seen_more: int
    missing: int


@dataclass(frozen=True, slots=True)
class StreamOutcome:
    """What the ranks read and trained from the real stream, against the plan's prediction."""

    splitter: str
    ranks: tuple[StreamRanks, ...]
    seen_once: int
    seen_more: int
    missing: int
    predicted: SampleCounts  # what the plan says the same epoch trains
    matches_plan: bool  # every rank trained exactly the planned micro-batches, in order
    optimizer_steps: int  # steps trained, each step's gradient held against the reference
    worst_step: int  # the step whose gradient is furthest from it (the result's `gradient`)
    loader_workers: int  # DataLoader worker processes each reading of the stream started
