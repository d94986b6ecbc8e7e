"""Floor 3: the batch split: global = micro x accumulation x replicas, shares by throughput or
measured curves, the sampler's arithmetic and the micro-batch search."""
