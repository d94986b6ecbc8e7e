"""The lr-scaling probe (issue 39): does the scaled lr train as well as the base batch did?

After the first step's check, the ranks train, from the workload's one initialisation and one
sample stream, the base run (base_batch_size at base_lr) and one run per rule (the plan's
global batch at that rule's lr, with the plan's warmup and decay counted in samples:
contract/kinds/lr_scaling.py), each over the same samples, and evaluate every run on the same
held-out batch at the same sample counts. The runs are independent: each rank trains its share
in its own process (no DDP inside a run), the longest runs first on the least loaded rank, and
rank 0 gathers the curves. The rank that trains the first seed's base run also measures the
gradient noise scale (McCandlish et al. 2018's two-batch estimate) at its start, halfway and at
its end. Every run is trained from `seeds` initialisations and sample streams (the first the
workload's own), each rule paired with its seed's base run. Rank 0 judges
them (verdict.py).

The sample stream: the built-in model's samples in index order (any index is a sample), its
held-out batch far beyond them; a dataset's samples reshuffled every pass with the check's
seed, its held-out batch set aside from a seeded permutation first, or, where the factory
gives a referee (app.worker.training.referee), the referee's held-out set, by whose metric the
runs are then judged. The built-in model learns a
teacher: a fixed network of its own shape (seed + 1) on its own inputs gives the targets (its
check targets are no function of the inputs it could learn, so its loss would not fall).
`label_noise` adds Gaussian noise of that standard deviation to the training targets (a fixed
draw per sample), which raises the gradient noise; the held-out targets stay clean.

Over 300 lines: one concept, the runs of one probe from their schedule over the ranks to their
curves; its pieces that stand alone (gradients, updates, seeds, the noise reading) are apart.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from app.contract.check_options import MAX_LR_PROBE_SAMPLES
from app.contract.check_result import CheckResult
from app.contract.kinds.lr_scaling import LrScalingSpec, ProbeRunSpec, run_cost
from app.contract.spec import CheckSpec
from app.core.learning_rate.noise_scale import step_estimate
from app.core.learning_rate.recipe_summary import lr_of
from app.worker.checks.kind import AfterKind, Context, Laps
from app.worker.checks.lr_scaling.fused import together_key, train_together
from app.worker.checks.lr_scaling.gradients import NormSq, squared_norm_of, trainable
from app.worker.checks.lr_scaling.noise_reading import NoiseAlong, WhyNot
from app.worker.checks.lr_scaling.updates import Update
from app.worker.checks.lr_scaling.verdict import Judged, LossCurve, judge
from app.worker.checks.run.check import run_workload
from app.worker.training.synthetic_model import OUTPUTS, build_model
from app.worker.training.workload import SyntheticWorkload, Workload, collate, model_code, to_device

HELD_OUT = 1024  # samples in the held-out batch (at most a fifth of a dataset)
REFEREE_HELD_OUT = 4096  # a factory's own held-out set: its first samples, at most these
_HELD_OUT_AT = 1 << 29  # the built-in model's held-out indices start here
_NOISE_AT = 1 << 28  # and those its noise scale is measured on
_NOISE_GROUPS, _NOISE_REPEATS = 8, 16  # small batches per big one, big batches per estimate
_NOISE_BLOCK = 4096
_CHUNK_SAMPLES = 4096  # samples made at once for a run of the built-in model


@functools.lru_cache(maxsize=256)
def _label_noise_block(seed: int, block: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed * 1_000_003 + block + 17)
    return torch.randn(_NOISE_BLOCK, OUTPUTS, generator=generator, dtype=torch.float64)


def label_noise(indices: list[int], seed: int) -> torch.Tensor:
    """A fixed standard Gaussian draw per sample index (the same on every rank)."""
    at = torch.tensor(indices, dtype=torch.int64)
    blocks = at // _NOISE_BLOCK
    out = torch.empty(len(indices), OUTPUTS, dtype=torch.float64)
    for block in sorted({i // _NOISE_BLOCK for i in indices}):
        mine = blocks == block
        out[mine] = _label_noise_block(seed, block)[at[mine] % _NOISE_BLOCK]
    return out


def _clipped(grads: Sequence[torch.Tensor], max_norm: float) -> list[torch.Tensor]:
    """torch.nn.utils.clip_grad_norm_'s arithmetic on gradients that are no parameter's .grad."""
    total = torch.nn.utils.get_total_norm(list(grads), 2.0)
    factor = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return [g.mul(factor) for g in grads]


@functools.lru_cache(maxsize=8)
def teacher(seed: int, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """The built-in model's probe task: a fixed network of its own shape (seed + 1) on its own
    inputs gives the targets, so the loss can fall and the gradient noise is the knob's."""
    return build_model(seed + 1, dtype, device)


def seeded_module(work: Workload, ctx: Context, draw: int) -> torch.nn.Module:
    """Seed `draw`'s initialisation: the workload's own for the first seed; the built-in model's
    weights from another seed (never the teacher's); a factory's every layer's
    reset_parameters under a seeded generator (a model without them keeps its one
    initialisation, and its seeds differ by their samples only)."""
    module = work.module(ctx.dtype, ctx.device)
    if draw == 0:
        return module
    mixed = ctx.spec.seed * 1_000_003 + 7919 * draw
    if isinstance(work, SyntheticWorkload):
        module.load_state_dict(build_model(mixed + 2, torch.float64, ctx.device).state_dict())
        return module
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(mixed)
        for layer in module.modules():
            reset = getattr(layer, "reset_parameters", None)
            if callable(reset):
                reset()
    return module


class Stream:
    """The probe's samples: training position p's index, and the held-out batch."""

    def __init__(self, work: Workload, seed: int, samples: int, batch: int) -> None:
        size = work.dataset_size
        self.size, self.seed = size, seed
        if size is None:
            self.held_out = list(range(_HELD_OUT_AT, _HELD_OUT_AT + HELD_OUT))
            self.train: list[int] | None = None
        elif work.referee is not None:  # the factory's own held-out set: every sample trains
            self.held_out = list(range(min(work.referee.size, REFEREE_HELD_OUT)))
            self.train = torch.randperm(
                size, generator=torch.Generator().manual_seed(seed + 104_729)
            ).tolist()
        else:
            order = torch.randperm(size, generator=torch.Generator().manual_seed(seed + 104_729)).tolist()
            kept = min(HELD_OUT, max(1, size // 5))
            self.held_out, self.train = order[:kept], order[kept:]
        self._epochs: dict[tuple[int, int], list[int]] = {}

    def indices(self, start: int, count: int, draw: int = 0) -> list[int]:
        """Training positions start.. of seed `draw`'s stream (the held-out batch is every
        seed's): the built-in model's seeds take disjoint index ranges, a dataset's its own
        order every pass."""
        if self.train is None:
            start += draw * MAX_LR_PROBE_SAMPLES
            return list(range(start, start + count))
        out: list[int] = []
        n = len(self.train)
        while len(out) < count:
            epoch, at = divmod(start + len(out), n)
            order = self._epochs.get((draw, epoch))
            if order is None:
                mixed = self.seed + 7919 * (epoch + 1) + 1_000_003 * draw
                perm = torch.randperm(n, generator=torch.Generator().manual_seed(mixed))
                order = self._epochs[(draw, epoch)] = [self.train[i] for i in perm.tolist()]
            out += order[at : at + count - len(out)]
        return out

    def noise_indices(self, count: int) -> list[int]:
        return list(range(_NOISE_AT, _NOISE_AT + count)) if self.train is None else self.indices(0, count)


@dataclass
class _Probe:
    probe: LrScalingSpec
    work: Workload
    stream: Stream
    mine: list[tuple[int, int]]  # (seed, index into runs()) of the runs this rank trains
    curves: dict[tuple[int, int], LossCurve] = field(default_factory=dict)
    metrics: dict[tuple[int, int], float | None] = field(default_factory=dict)  # final, by the referee
    noise: NoiseAlong = (None, None, None)
    noise_why: WhyNot = (None, None, None)  # why a noise value is None
    gathered: list[Any] | None = None


def runs(probe: LrScalingSpec) -> list[ProbeRunSpec]:
    return [probe.base, *probe.runs]


def share(probe: LrScalingSpec, ranks: int) -> list[list[tuple[int, int]]]:
    """Each rank's (seed, run) pairs: the costliest first onto the least loaded rank (the first
    seed's base run counts its noise measurement), so that ranks finish together."""
    everything = runs(probe)
    jobs = [(k, i) for k in range(probe.seeds) for i in range(len(everything))]

    def cost(job: tuple[int, int]) -> float:
        return run_cost(probe, everything[job[1]]) * (1.0 if job[0] == 0 or job[1] else 2 / 3)

    load = [0.0] * ranks
    out: list[list[tuple[int, int]]] = [[] for _ in range(ranks)]
    for job in sorted(jobs, key=lambda job: (-cost(job), job)):
        r = min(range(ranks), key=lambda r: (load[r], r))
        out[r].append(job)
        load[r] += cost(job)
    return out


def _together(state: _Probe) -> list[tuple[int, tuple[int, ...]]]:
    """This rank's runs as it trains them: the built-in model's rule runs of one seed with the
    same batches and optimizer together (fused.py), every other run alone."""
    everything = runs(state.probe)
    jobs: dict[tuple[Any, ...], list[int]] = {}
    order: list[tuple[int, tuple[Any, ...]]] = []
    for k, i in state.mine:
        alone = i == 0 or not isinstance(state.work, SyntheticWorkload)
        key = (i,) if alone else ("together", *together_key(everything[i]))
        if (k, key) not in jobs:
            jobs[(k, key)] = []
            order.append((k, key))
        jobs[(k, key)].append(i)
    return [(k, tuple(jobs[(k, key)])) for k, key in order]


class LrScalingProbe(AfterKind[_Probe]):
    """After the first step: the base run and every rule's run, spread over the ranks."""

    name: ClassVar[str] = "lr_scaling"
    laps: ClassVar[Laps] = Laps(plan="lr_scaling", controls=None, reference=None)

    def applies(self, spec: CheckSpec) -> bool:
        return spec.lr_scaling is not None

    def prepare(self, ctx: Context) -> _Probe:
        probe = ctx.spec.lr_scaling
        assert probe is not None
        work = run_workload(ctx.spec, ctx.workload)
        stream = Stream(work, ctx.spec.seed, probe.samples, probe.global_batch_size)
        return _Probe(probe, work, stream, share(probe, ctx.group.world)[ctx.group.rank])

    def plan(self, ctx: Context, state: _Probe) -> None:
        everything = runs(state.probe)
        for k, group in _together(state):
            if len(group) > 1:
                specs = [everything[i] for i in group]
                modules = [seeded_module(state.work, ctx, k) for _ in specs]
                batches = self._batches(ctx, state, specs[0].batch_size, k)
                held_out = self._held_out(state, ctx)
                probe = state.probe
                curves = train_together(
                    specs, modules, batches, held_out, probe.samples, probe.global_batch_size, probe.points
                )
                for i, curve in zip(group, curves, strict=True):
                    state.curves[(k, i)], state.metrics[(k, i)] = curve, None
                continue
            i = group[0]
            curve, metric = self._train(ctx, state, everything[i], k, noise=(k, i) == (0, 0))
            state.curves[(k, i)], state.metrics[(k, i)] = curve, metric
        payload = (state.curves, (state.noise, state.noise_why), state.metrics)
        gathered: list[Any] | None = [None] * ctx.group.world if ctx.leader else None
        dist.gather_object(payload, gathered, dst=0)
        state.gathered = gathered

    def result(self, ctx: Context, state: _Probe, prior: CheckResult | None) -> CheckResult:
        assert prior is not None and state.gathered is not None
        curves: dict[tuple[int, int], LossCurve] = {}
        metrics: dict[tuple[int, int], float | None] = {}
        noise: NoiseAlong = (None, None, None)
        why: WhyNot = (None, None, None)
        for rank_curves, (rank_noise, rank_why), rank_metrics in state.gathered:
            curves.update(rank_curves)
            metrics.update(rank_metrics)
            if rank_noise != (None, None, None) or rank_why != (None, None, None):
                noise, why = rank_noise, rank_why
        everything = runs(state.probe)
        jobs = [[(k, i) for i in range(len(everything))] for k in range(state.probe.seeds)]
        trained = [[(everything[i], curves[(k, i)]) for k, i in seed] for seed in jobs]
        referee = state.work.referee
        judged = None
        if referee is not None:
            finals = [[metrics[job] for job in seed] for seed in jobs]
            judged = Judged(referee.name, referee.higher_is_better, finals)
        found = judge(state.probe, trained, noise, judged, why)
        return replace(prior, lr_scaling=found)

    # ------------------------------------------------------------------------------ a run

    def _batch(self, state: _Probe, indices: list[int], ctx: Context, noisy: bool) -> tuple[Any, Any]:
        x, y = state.work.batch(indices, ctx.dtype, ctx.device)
        if not isinstance(state.work, SyntheticWorkload):
            return x, y
        with torch.no_grad():
            y = teacher(ctx.spec.seed, ctx.dtype, ctx.device)(x)
        if noisy and state.probe.label_noise:
            y = y + state.probe.label_noise * label_noise(indices, ctx.spec.seed).to(y)
        return x, y

    def _train(
        self, ctx: Context, state: _Probe, run: ProbeRunSpec, draw: int, *, noise: bool
    ) -> tuple[LossCurve, float | None]:
        """The run's held-out loss curve, and its final metric where the factory gives a referee."""
        probe, work = state.probe, state.work
        module = seeded_module(work, ctx, draw)
        # Aliases of the module's weights: the update writes them, the evaluation reads the module.
        params, gradient, written_out = trainable(work, module)
        update = Update(run.recipe, params)
        held_x, held_y = self._held_out(state, ctx)

        def held_out_loss() -> float | None:
            with torch.no_grad():
                value = float(work.loss(module, held_x, held_y, "mean"))
            return value if math.isfinite(value) else None

        def held_out_metric() -> float | None:
            if work.referee is None or diverged:
                return None
            with torch.no_grad(), model_code():
                return work.referee.score(work.forward(module, held_x), held_y)

        norm_sq = squared_norm_of(work, module, gradient if written_out else None)
        # The noise scale at the start, halfway (where the run spends its steps) and at the end.
        along: list[tuple[float | None, str | None]] = (
            [self._noise_scale(ctx, state, norm_sq, run.batch_size)] if noise else []
        )
        halfway = probe.samples // 2
        b, G = run.batch_size, probe.global_batch_size
        curve: LossCurve = [(0, held_out_loss())]
        points = list(probe.points[1:])
        diverged = False
        batches = self._batches(ctx, state, b, draw)
        rate, rate_step = 0.0, -1
        with torch.no_grad():
            for j in range(probe.samples // b):
                if diverged:
                    break
                if (j * b) // G != rate_step:  # the lr moves once per optimizer step of the plan
                    rate_step = (j * b) // G
                    rate = lr_of(run.recipe, rate_step)
                x, y = next(batches)
                grads = gradient(x, y)
                if run.recipe.max_grad_norm is not None:
                    grads = _clipped(grads, run.recipe.max_grad_norm)
                update.step(grads, rate)
                consumed = (j + 1) * b
                if len(along) == 1 and consumed >= halfway:
                    along.append(self._noise_scale(ctx, state, norm_sq, run.batch_size))
                while points and points[0] <= consumed:
                    points.pop(0)
                    value = held_out_loss()
                    curve.append((consumed, value))
                    diverged = value is None
        curve += [(p, None) for p in points]  # after a divergence: no loss to show
        if noise:
            self._noise_at_end(ctx, state, norm_sq, run.batch_size, along, diverged)
        return curve, held_out_metric()

    def _held_out(self, state: _Probe, ctx: Context) -> tuple[Any, Any]:
        """The held-out batch: the factory's own held-out samples where it gives a referee."""
        referee = state.work.referee
        if referee is None:
            return self._batch(state, state.stream.held_out, ctx, noisy=False)
        with model_code():
            x, y = collate([referee.held_out[i] for i in state.stream.held_out])
        return to_device(x, ctx.device, ctx.dtype), to_device(y, ctx.device, ctx.dtype)

    def _batches(self, ctx: Context, state: _Probe, b: int, draw: int) -> Iterator[tuple[Any, Any]]:
        """Step j's batch, in order. Where a sample's inputs and targets are its own (the
        built-in model), many steps' samples are made at once and sliced: the per-call cost of
        making a batch of 8 was a quarter of a probe step."""
        steps = state.probe.samples // b
        chunk = max(1, _CHUNK_SAMPLES // b) if state.work.independent_samples else 1
        for first in range(0, steps, chunk):
            count = min(chunk, steps - first)
            x, y = self._batch(state, state.stream.indices(first * b, count * b, draw), ctx, noisy=True)
            if count == 1:
                yield x, y
                continue
            yield from zip(x.split(b), y.split(b), strict=True)

    def _noise_at_end(
        self,
        ctx: Context,
        state: _Probe,
        norm_sq: NormSq,
        small: int,
        along: list[tuple[float | None, str | None]],
        diverged: bool,
    ) -> None:
        """The base run's three noise scales (and why each missing one is missing) into `state`."""
        gone = (None, "the base run diverged before it")
        along += [gone] * (2 - len(along))  # a run that diverged before halfway
        along.append(gone if diverged else self._noise_scale(ctx, state, norm_sq, small))
        state.noise = (along[0][0], along[1][0], along[2][0])
        state.noise_why = (along[0][1], along[1][1], along[2][1])

    def _noise_scale(
        self, ctx: Context, state: _Probe, norm_sq: NormSq, small: int
    ) -> tuple[float | None, str | None]:
        """B_simple at the module's weights: |G|^2 and tr(S) from small batches of the base
        batch (8 to 256) and the big batch they make, averaged over repeats, then divided; None
        with the reason where the estimate cannot be divided."""
        small = max(8, min(small, 256))
        indices = state.stream.noise_indices(small * _NOISE_GROUPS * _NOISE_REPEATS)
        if state.work.independent_samples:  # made at once and sliced, as a run's batches are
            x, y = self._batch(state, indices, ctx, noisy=True)

            def of(lo: int, hi: int) -> float:
                return norm_sq(x[lo:hi], y[lo:hi])
        else:

            def of(lo: int, hi: int) -> float:
                return norm_sq(*self._batch(state, indices[lo:hi], ctx, noisy=True))

        with torch.enable_grad():  # halfway, the run's loop holds no_grad
            return self._noise_of(of, small, len(indices))

    def _noise_of(
        self, squared_norm: Callable[[int, int], float], small: int, count: int
    ) -> tuple[float | None, str | None]:
        big = small * _NOISE_GROUPS
        sq, trace = 0.0, 0.0
        for k in range(_NOISE_REPEATS):
            at = k * big
            ends = [at + i * small for i in range(_NOISE_GROUPS + 1)]
            smalls = [(squared_norm(lo, hi), float(small)) for lo, hi in itertools.pairwise(ends)]
            estimate = step_estimate(smalls, squared_norm(at, at + big), big)
            sq += estimate.gradient_sq
            trace += estimate.trace
        if not (math.isfinite(sq) and math.isfinite(trace)):
            return None, "its gradients are not finite"
        if sq <= 0:
            # The unbiased |G|^2 subtracts the noise from the big batch's squared norm: near a
            # minimum the mean gradient is smaller than its noise, and the difference goes below 0.
            return None, (
                f"the mean gradient is within its own noise ({count:,} samples estimate |G|^2 "
                "at or below 0): the run is near a minimum, where B_noise grows beyond what they resolve"
            )
        if trace <= 0:
            return (
                None,
                "the samples' gradients agree (tr(S) estimated at or below 0): there is no noise to measure",
            )
        return trace / sq, None
