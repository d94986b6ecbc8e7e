"""Whether this worker takes a check: the request planned and held against its limits,
its registered models and its host. Runs before a job exists (blocking: call it in a thread)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from app.contract.mesh_spec import refusal as mesh_refusal
from app.contract.model_registry import SYNTHETIC, sync_batch_norm_refusal, unknown_model
from app.contract.request import CheckRequest, build_spec, echoed
from app.contract.sequence_length import refuse_another_sequence_length
from app.contract.spec import CheckSpec, spec_from_plan
from app.contract.spec_error import SpecError
from app.core.errors.domain import DomainError, field_key
from app.core.planner import plan
from app.core.records.plan_request import PlanRequest
from app.worker.service.limits import Limits
from app.worker.service.probe_cost import ProbeCost, work
from app.worker.service.runner import CheckRunner
from app.worker.service.submission import Submission


class Admission:
    def __init__(
        self, limits: Limits, models: dict[str, str], runner: CheckRunner, probe_cost: ProbeCost | None = None
    ) -> None:
        self.limits = limits
        self.models = models  # registered check models: name -> package.module:factory
        self.runner = runner
        self.probe_cost = probe_cost or ProbeCost()

    def prepare(self, request: CheckRequest, body: Mapping[str, Any]) -> Submission:
        """The job to submit for a check request (POST /v1/checks: `CheckRequestIn.to_core()`,
        and `body`, the request as its schema read it, which the job shows): the spec every
        rank runs (`build_spec`, as the rank program builds it), held against this worker's
        limits, registered models and host."""
        spec = build_spec(request, factory=self.models.get(request.model))
        self._check_model(spec, has_dataset=request.plan.dataset is not None)
        if spec.workload == "tokens":
            known = self.runner.models_info.get(spec.model)  # the probe read its sequences
            refuse_another_sequence_length(request, spec, known.sequence_length if known else None)
        if spec.data_parallel_size > self.limits.max_replicas_per_check:
            raise SpecError(
                f"the plan has {spec.data_parallel_size} data-parallel replicas; this worker "
                f"checks at most {self.limits.max_replicas_per_check}",
                "/plan/topology",
            )
        if spec.stream is not None:
            self._check_stream_ranks(request.plan, spec)
        self._check_memory(request.plan, spec)
        options = request.options
        nnodes = options.rendezvous.nnodes if options.rendezvous else 1
        if spec.mesh is not None:
            self._check_mesh(spec, nnodes)
        if nnodes > spec.data_parallel_size:
            raise SpecError(
                f"{nnodes} nodes for {spec.data_parallel_size} replicas: every node needs one",
                "/rendezvous/nnodes",
            )
        if spec.backend == "nccl" and self.runner.host_info.gpus == 0:
            raise SpecError("backend nccl needs GPUs; this host has none (use gloo or auto)", "/backend")
        timeout = self.limits.check_timeout_s if options.timeout_s is None else options.timeout_s
        if timeout > self.limits.check_timeout_s:
            raise SpecError(
                f"timeout_s is at most {self.limits.check_timeout_s:g} on this worker", "/timeout_s"
            )
        if options.rendezvous is not None:
            self.limits.check_rendezvous_endpoint(options.rendezvous.endpoint)
        self._check_probe_time(spec, timeout)
        return Submission(echoed(body, spec), spec, timeout, options.rendezvous)

    def _check_memory(self, request: PlanRequest, spec: CheckSpec) -> None:
        """What grows with the request: the global batch, and a shuffled dataset's permutation.
        An unshuffled dataset of any size costs nothing (its order is arithmetic)."""
        cap = self.limits.max_check_samples
        if spec.global_batch_size > cap:
            largest = largest_checkable_batch(request, spec, cap)
            fix = (
                f"use global_batch_size at most {largest}, the largest this plan takes here"
                if largest
                else "no global batch within it plans on this topology: check fewer replicas"
            )
            pointer = "/plan/global_batch_size"
            raise SpecError(
                f"a check materialises the global batch: {spec.global_batch_size} samples is more than "
                f"this worker's limit of {cap} (BATCHPLAN_MAX_CHECK_SAMPLES); the plan itself has no such "
                f"limit: {fix}",
                pointer,
                suggestions={field_key(pointer): [largest]} if largest else {},
            )
        sizes = spec.throughput.micro_batch_sizes if spec.throughput else None
        if sizes and sizes[-1] > cap:
            raise SpecError(
                f"a throughput measurement materialises each micro-batch: {sizes[-1]} samples is more than "
                f"this worker's limit of {cap} (BATCHPLAN_MAX_CHECK_SAMPLES): measure sizes up to {cap}",
                f"/throughput/micro_batch_sizes/{len(sizes) - 1}",
            )
        shuffled_cap = self.limits.max_shuffled_samples
        if (
            request.dataset is not None
            and request.dataset.shuffle
            and request.dataset.num_samples > shuffled_cap
        ):
            smaller = dataclasses.replace(request.dataset, num_samples=shuffled_cap)
            works = _checked_size(dataclasses.replace(request, dataset=smaller)) is not None
            pointer = "/plan/dataset/num_samples"
            raise SpecError(
                f"a shuffled dataset's order is torch.randperm(num_samples), drawn on every rank as "
                f"DistributedSampler draws it: dataset.num_samples {spec.num_samples} is more than this "
                f"worker's limit of {shuffled_cap}; use at most {shuffled_cap}, or check with "
                f"dataset.shuffle false, which has no limit",
                pointer,
                suggestions={field_key(pointer): [shuffled_cap]} if works else {},
            )

    def probe_ranks(self, spec: CheckSpec) -> int:
        """The ranks a probe runs on: one per replica, leaving one of the pool to short checks."""
        return min(spec.data_parallel_size, max(1, self.runner.size - 1))

    def probe_estimate_s(self, spec: CheckSpec) -> float | None:
        """How long the check's lr-scaling probe trains on this worker (None: it has none):
        its busiest rank's samples at the cost per sample measured here."""
        if spec.lr_scaling is None:
            return None
        per_sample, _ = self.probe_cost.per_sample_s()
        return per_sample * work(spec.lr_scaling, self.probe_ranks(spec))

    def _check_probe_time(self, spec: CheckSpec, timeout: float) -> None:
        """A probe that cannot finish within the check's timeout is refused now, with the
        estimate, rather than failed after the whole timeout."""
        estimate = self.probe_estimate_s(spec)
        probe = spec.lr_scaling
        if estimate is None or probe is None or estimate <= timeout:
            return
        per_sample, measured = self.probe_cost.per_sample_s()
        source = "measured from its finished probes" if measured else "the default until one finishes here"
        runs_per_rank = work(probe, self.probe_ranks(spec)) // probe.samples
        G = probe.global_batch_size
        fits = math.floor(timeout / (per_sample * runs_per_rank) / G) * G
        least = max(G, probe.base.batch_size)
        pointer = "/lr_scaling/samples"
        fix = f"lower lr_scaling.samples to at most {fits:,}" if fits >= least else "lower lr_scaling.samples"
        if timeout < self.limits.check_timeout_s:
            fix += f", or raise timeout_s (at most {self.limits.check_timeout_s:g} on this worker)"
        raise SpecError(
            f"an lr-scaling probe of {probe.samples:,} samples would train for about {estimate:,.0f} s on "
            f"this worker ({runs_per_rank} runs of {probe.samples:,} samples on its busiest rank, "
            f"{per_sample * 1e6:.3g} us a sample, {source}), more than the check's timeout_s={timeout:g}: "
            f"{fix}",
            pointer,
            suggestions={field_key(pointer): [fits]} if fits >= least else {},
        )

    def _check_stream_ranks(self, plan: PlanRequest, spec: CheckSpec) -> None:
        """A stream check reads each rank's share in a process of its own (the DataLoader's workers
        fork from it): a plan of more ranks than the worker's processes cannot run. A stream
        check runs no mesh, so its ranks are its GPUs: one node's are named by gpus_per_node."""
        most = self.runner.size
        if spec.data_parallel_size > most:
            one_node = not plan.topology.listed_groups and plan.topology.node_groups[0].num_nodes == 1
            pointer = "/plan/topology/gpus_per_node" if one_node else "/plan/topology"
            raise SpecError(
                f"a stream check runs one process per data-parallel rank: the plan has "
                f"{spec.data_parallel_size} data-parallel ranks, this worker runs {most} rank processes "
                f"(BATCHPLAN_PROCESSES_PER_HOST); check a plan of at most {most} data-parallel ranks",
                pointer,
                suggestions={field_key(pointer): [most]} if one_node else {},
            )

    def _check_mesh(self, spec: CheckSpec, nnodes: int) -> None:
        """One warm process per mesh rank, on this host; the model must split as the mesh does."""
        assert spec.mesh is not None
        if nnodes > 1:
            raise SpecError(
                "a mesh check runs on this worker's own processes; across hosts, run the rank program "
                "under torchrun on every node (python -m app.worker.gradcheck), which runs the mesh too",
                "/rendezvous/nnodes",
            )
        info = self.runner.models_info.get(spec.model)
        why = mesh_refusal(
            spec.mesh,
            processes=self.runner.size,
            synthetic=spec.model == SYNTHETIC,
            parallelize=info is not None and info.parallelize,
        )
        if why is not None:
            raise SpecError(why[0], why[1])

    def _check_model(self, spec: CheckSpec, *, has_dataset: bool) -> None:
        if spec.model != SYNTHETIC and spec.model not in self.models:
            raise SpecError(unknown_model(spec.model, list(self.models)), "/model")
        info = self.runner.models_info.get(spec.model)
        if info is not None and not info.loaded:
            raise SpecError(
                f"check model {spec.model!r} cannot be built on this worker: {info.error}", "/model"
            )
        synced = info.sync_batch_norm if info else None
        if synced and (self.runner.host_info.gpus == 0 or spec.backend == "gloo"):
            pointer = "/backend" if self.runner.host_info.gpus else "/model"
            raise SpecError(sync_batch_norm_refusal(list(synced)), pointer)
        size = info.dataset_size if info else None
        if isinstance(size, int) and spec.num_samples > size:
            pointer = "/plan/dataset/num_samples" if has_dataset else "/plan/global_batch_size"
            raise SpecError(
                f"check model {spec.model!r} has {size} samples; the check's epoch needs {spec.num_samples} "
                f"(without a dataset it is one global batch): use at most {size}",
                pointer,
            )
        if spec.fit is not None and spec.fit.memory_bytes is None:
            gpus = self.runner.host_info.gpus
            if gpus == 0 or spec.backend == "gloo":
                raise SpecError(
                    "the search for the largest micro-batch runs on this worker's CPU here, whose "
                    "memory torch cannot size: give the memory of one GPU of the cluster, e.g. "
                    "85899345920 for 80 GiB",
                    "/fit_micro_batch/memory_bytes",
                )
        if spec.noise_steps and spec.data_parallel_size == 1 and spec.gradient_accumulation_steps == 1:
            raise SpecError(
                "the noise scale compares a small batch with a big one: it needs at least 2 data-parallel "
                "replicas or 2 accumulation steps; send noise_scale.steps 0 to skip it",
                "/noise_scale/steps",
            )


def _checked_size(request: PlanRequest) -> int | None:
    """The global batch a check of `request` runs, or None if the planner or the check's own
    rules refuse it."""
    try:
        planned = plan(request)
        spec_from_plan(planned, dataset=request.dataset)
    except DomainError:
        return None
    return planned.global_batch_size


def largest_checkable_batch(request: PlanRequest, spec: CheckSpec, cap: int) -> int | None:
    """The largest global batch at most `cap` that plans when it alone replaces the request's
    (the same micro-step with fewer accumulation steps first, then any multiple of the
    replicas), re-planned to be sure; None if none does."""
    per_step = spec.global_batch_size // spec.gradient_accumulation_steps
    steps = cap // per_step
    candidates = [k * per_step for k in range(steps, max(steps - 8, 0), -1)]
    candidates.append(cap // spec.data_parallel_size * spec.data_parallel_size)
    for candidate in filter(None, candidates):
        size = _checked_size(dataclasses.replace(request, global_batch_size=candidate))
        if size is not None and size <= cap:
            return size
    return None
