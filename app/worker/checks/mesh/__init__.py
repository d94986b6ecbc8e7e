"""The mesh step kind: the plan's first step on its own device mesh, one real process per mesh
rank (`check.MeshStep`), through the real wrappers (`steps`), with what each mesh rank reads
and the control runs (`reads`) and the mesh's mistakes (`controls`)."""
