"""Plans written out in the formats people paste into their launchers and trainers.

Each export is one pure function `(ExportInput) -> Export` in a module of its own, named in
`registry.EXPORTERS`. Shared pieces: `common` (types, summary, node facts, the refusals of
plans a format cannot express), `shell` (launch-script command lines) and `yaml_writer`
(YAML by hand: the core is standard-library only). Uneven plans are refused (422,
`ExportUnsupported`, with the nearest even split) by the formats that take one batch size
for every process; torchrun, slurm and python carry the per-rank table.
"""
