"""The python skeleton's resume, as source text written into it (the skeleton is a file users
copy, so it cannot import this project): the plan for whatever world size the script starts
with (its elastic table, app.core.exports.parts.elastic_table), its sampler with the consumed
samples skipped, and its own checkpoint (model, optimizer, scheduler, the step and where it
lies in its epoch), saved by rank 0 and read by every rank of the next start.

The skip is app.core.resume.plan_resume's arithmetic: after a checkpoint at step s of epoch e, each rank
calls set_epoch(e) and skips its first s x accumulation micro-batches, accumulation being the
new size's: on every size that keeps the global batch, those are the samples of the steps
already taken (docs/resume.md). tests/core/test_python_resume.py runs it.
"""

RESUME_SOURCE = '''
# ---- resuming: this script's own checkpoint, on whatever world size it starts with ---------
# Data-parallel sizes the run may go on with after a restart, the global batch kept:
# {size: (micro-batch, accumulation, exact)}; exact: every later step sees the global batch the
# uninterrupted run would have seen (False: the epoch ends elsewhere on that size, where
# padding or drop_last depend on it; None: the plan has no dataset to tell).
ELASTIC_TABLE = __ELASTIC__
# The run's identity: its global batch, data and recipe, whatever the world size. A checkpoint
# of another run is refused, and the default checkpoint file is named by it.
RUN_ID = __RUN_ID__


def replica_settings(rank: int, world: int):
    """(micro-batch, accumulation, loss scale or None under token normalisation) of `rank`
    when `world` processes run: the plan's own replica groups, or the elastic table's."""
    if world == DATA_PARALLEL_SIZE:
        for first, stop, micro, scale in REPLICA_GROUPS:
            if first <= rank < stop:
                return micro, GRADIENT_ACCUMULATION_STEPS, scale
        raise ValueError(f"rank {rank} is in no replica group")
    if world not in ELASTIC_TABLE:
        raise SystemExit(
            f"this plan keeps its global batch of {GLOBAL_BATCH_SIZE} on {sorted(ELASTIC_TABLE)} "
            f"processes, not {world}: plan again for {world}"
        )
    micro, accumulation, _ = ELASTIC_TABLE[world]
    if LOSS_NORMALIZATION == "token":
        return micro, accumulation, None
    # As the plan's loss_scale: data_parallel_size x micro / global for a mean, x 1 / global for a sum.
    return micro, accumulation, world * (micro if LOSS_REDUCTION == "mean" else 1) / GLOBAL_BATCH_SIZE


def check_launch_env(micro_batch_size: int, accumulation: int) -> None:
    """The launch script (torchrun, slurm, kubernetes exports) exports the plan's batch sizes: a
    launch script from another plan would start a batch this loop's loss scales do not fit. An
    elastic launch exports only the global batch: the rest follows the world size."""
    planned = {"GLOBAL_BATCH_SIZE": GLOBAL_BATCH_SIZE, "MICRO_BATCH_SIZE": micro_batch_size,
               "GRADIENT_ACCUMULATION_STEPS": accumulation}
    for name, value in planned.items():
        if os.environ.get(name, str(value)) != str(value):
            raise SystemExit(f"the launch script sets {name}={os.environ[name]}, this script's plan has "
                             f"{value}: export both from the same plan")


class SkipSampler(Sampler):
    """A sampler's indices after its first `skip` (the samples of the steps a checkpoint took),
    so that the skipped micro-batches are never loaded."""

    def __init__(self, sampler, skip: int = 0):
        self.sampler, self.skip = sampler, skip

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return max(len(self.sampler) - self.skip, 0)

    def __iter__(self):
        return itertools.islice(iter(self.sampler), self.skip, None)


def make_sampler(dataset: Dataset, rank: int, world: int) -> SkipSampler:
__MAKE_SAMPLER__

def save_checkpoint(path: str, model, optimizer, scheduler, position: dict) -> None:
    """Rank 0's: written to a temporary file and renamed, so a process killed while saving
    leaves the last whole checkpoint."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state(), "run_id": RUN_ID, **position}
    torch.save(state, f"{path}.tmp")
    os.replace(f"{path}.tmp", path)


def load_checkpoint(path: str, model, optimizer, scheduler):
    """The saved position (step, epoch, step_in_epoch, data_parallel_size), the states
    restored; None without a checkpoint. The same rng state on every rank: the data order comes
    from the sampler's seed + epoch, so nothing here depends on the old ranks' states."""
    if not os.path.exists(path):
        return None
    saved = torch.load(path, map_location="cpu", weights_only=False)
    if saved.get("run_id") != RUN_ID:
        raise SystemExit(f"{path} is the checkpoint of another run ({saved.get('run_id')}, this one is "
                         f"{RUN_ID}): give this run's own with --checkpoint")
    model.load_state_dict(saved.pop("model"))
    optimizer.load_state_dict(saved.pop("optimizer"))
    scheduler.load_state_dict(saved.pop("scheduler"))
    torch.set_rng_state(saved.pop("rng"))
    return saved
'''
