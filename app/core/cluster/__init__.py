"""Floor 2: the cluster: GPUs into data-parallel replicas (topology) and the device mesh."""
