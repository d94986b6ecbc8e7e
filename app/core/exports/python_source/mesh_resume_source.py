"""The mesh skeleton's resume, as source text written into it (app.core.exports.python_source.mesh_skeleton):
the mesh for whatever world size the script starts with (its elastic table), and its own
checkpoint of sharded states with torch.distributed.checkpoint, which saves each rank's shards
and loads them resharded onto another mesh: every rank saves and loads together, rank 0 then
writes where the run stands (step, epoch, step in it, the scheduler) beside them.
tests/core/test_python_resume.py runs it (FSDP on 2 processes, resumed on 1).
"""

MESH_RESUME_SOURCE = '''
# ---- resuming: this script's own sharded checkpoint, on whatever world size it starts with --
# {data-parallel size: (micro-batch, accumulation, exact, FSDP shard group)} that keep the global
# batch; exact: every later step sees the global batch the uninterrupted run would have seen.
ELASTIC_TABLE = __ELASTIC__
RUN_ID = __RUN_ID__  # the run's identity at every size: another run's checkpoint is refused


def mesh_settings(world: int):
    """(data-parallel size, micro-batch, accumulation, shard group) when `world` processes run."""
    dp = world // MODEL_PARALLEL_SIZE
    if world % MODEL_PARALLEL_SIZE or dp not in ELASTIC_TABLE:
        sizes = sorted(size * MODEL_PARALLEL_SIZE for size in ELASTIC_TABLE)
        raise SystemExit(f"this plan keeps its global batch of {GLOBAL_BATCH_SIZE} on {sizes} processes, "
                         f"not {world}: plan again for {world}")
    micro, accumulation, _, shard = ELASTIC_TABLE[dp]
    return dp, micro, accumulation, shard


def save_checkpoint(directory: str, model, optimizer, scheduler, position: dict) -> None:
    """Every rank writes its shards (a collective); then rank 0 names the new one as the latest."""
    import json

    path = os.path.join(directory, f"step-{position['step']}")
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path)
    if dist.get_rank() == 0:
        latest = {"path": path, "run_id": RUN_ID, "scheduler": scheduler.state_dict(), **position}
        with open(os.path.join(directory, "latest.json.tmp"), "w") as out:
            json.dump(latest, out)
        os.replace(os.path.join(directory, "latest.json.tmp"), os.path.join(directory, "latest.json"))


def load_checkpoint(directory: str, model, optimizer, scheduler):
    """The saved position, the states loaded resharded onto this mesh; None without one."""
    import json

    if not os.path.exists(os.path.join(directory, "latest.json")):
        return None
    with open(os.path.join(directory, "latest.json")) as saved:
        latest = json.load(saved)
    if latest["run_id"] != RUN_ID:
        raise SystemExit(f"{directory} holds the checkpoint of another run ({latest['run_id']}, this one is "
                         f"{RUN_ID}): give this run's own with --checkpoint")
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=latest["path"])
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    scheduler.load_state_dict(latest["scheduler"])
    return latest
'''
