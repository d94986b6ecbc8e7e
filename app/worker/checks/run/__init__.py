"""The run kinds (`steps` above 1): after the first step, the plan's recipe trained step by step
on DDP replicas (`check.DdpRun`) or on the plan's mesh (`mesh.MeshRun`), held against the
single-process reference run on rank 0 (`referee`), with the run-level controls (`controls`).
`check.run_workload` is what every kind that trains after the first step trains."""
