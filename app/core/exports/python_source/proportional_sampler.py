"""The proportional sampler as source text, written into the python skeleton of an uneven
plan: the skeleton is a file users copy, so it cannot import this project. It reads the
indices `app.worker.training.samplers.ProportionalSampler` reads (tests/core/test_exports_python_run.py
compares the two)."""

PROPORTIONAL_SAMPLER = '''

class ProportionalSampler(Sampler):
    """Replica `rank`'s indices when replicas take micro-batches of different sizes.

    Micro-step k covers positions [k*S, (k+1)*S) of the epoch's index list, S the sum of all
    micro-batch sizes; replica r reads the slice of length micro[r] after the lower ranks'.
    The list is shuffled with seed + epoch (as DistributedSampler does), padded by repeating
    from the start, or truncated with drop_last, to a whole number of micro-steps.
    """

    def __init__(self, num_samples, micro_batch_sizes, rank, *, shuffle=True, seed=0, drop_last=False):
        self.num_samples, self.shuffle, self.seed, self.epoch = num_samples, shuffle, seed, 0
        self.micro_batch_size = micro_batch_sizes[rank]
        self.samples_per_micro_step = sum(micro_batch_sizes)
        self.offset = sum(micro_batch_sizes[:rank])
        per_step = self.samples_per_micro_step
        self.micro_steps = num_samples // per_step if drop_last else -(-num_samples // per_step)
        self.total_size = self.micro_steps * per_step

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.micro_steps * self.micro_batch_size

    def __iter__(self):
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            indices = torch.randperm(self.num_samples, generator=generator).tolist()
        else:
            indices = list(range(self.num_samples))
        while len(indices) < self.total_size:
            indices += indices[: self.total_size - len(indices)]
        indices = indices[: self.total_size]
        for step in range(self.micro_steps):
            start = step * self.samples_per_micro_step + self.offset
            yield from indices[start : start + self.micro_batch_size]
'''


# The body of the skeleton's make_sampler(dataset, rank, world). An even split: every replica
# the same micro-batch, torch's own sampler, on the plan's world or any other the elastic table
# allows.
EVEN_SAMPLER_BODY = """\
    return SkipSampler(DistributedSampler(
        dataset, num_replicas=world, rank=rank, shuffle=SHUFFLE, seed=SEED, drop_last=DROP_LAST,
    ))
"""
# An uneven split: on the plan's world the micro-batches differ by replica; any other world the
# elastic table allows is an even split of its own.
PROPORTIONAL_SAMPLER_BODY = """\
    if world != DATA_PARALLEL_SIZE:
        return SkipSampler(DistributedSampler(
            dataset, num_replicas=world, rank=rank, shuffle=SHUFFLE, seed=SEED, drop_last=DROP_LAST,
        ))
    # Each micro-step's samples are shared out by micro-batch size, rank by rank.
    micro_batch_sizes = [micro for first, stop, micro, _ in REPLICA_GROUPS for _ in range(first, stop)]
    return SkipSampler(ProportionalSampler(
        len(dataset), micro_batch_sizes, rank, shuffle=SHUFFLE, seed=SEED, drop_last=DROP_LAST
    ))
"""
