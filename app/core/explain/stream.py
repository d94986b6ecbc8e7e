"""The sentences of a stream plan: who reads which shards, what an epoch trains under the
end-of-epoch policy, and how short micro-batches keep their weight."""

from __future__ import annotations

from app.core.records.stream import StreamPlan

_SPLITTER = {
    "hf_datasets": "datasets' split_dataset_by_node (then each rank's shards over its DataLoader workers)",
    "webdataset": "WebDataset's split_by_node, then split_by_worker",
    "rank_worker": "shards dealt round-robin to the reader rank x num_workers + worker",
}

_POLICY = {
    "drop": "every rank stops at the fewest micro-batches any rank delivers",
    "pad": "ranks short of micro-batches repeat their first samples up to the most",
    "cycle": "a finished rank starts its stream again until every rank has finished",
    "steps": "the stream repeats without end and the run is counted in optimizer steps",
}


def stream_sentences(stream: StreamPlan, dp: int, model_parallel: int, accumulation: int) -> list[str]:
    workers = stream.readers // dp if stream.readers > dp else 0
    who = f"{dp} ranks x {workers} DataLoader workers" if workers else f"{dp} ranks"
    out = [
        f"The stream's {stream.num_shards} shards ({stream.num_samples} samples) are split over "
        f"{stream.readers} readers ({who}) by {_SPLITTER[stream.splitter]}; the DataLoader takes no "
        f"sampler for an IterableDataset, so the splitter is what keeps ranks from reading the same samples: "
        f"every process builds DataLoader(its share of the stream, batch_size=its micro-batch, "
        f"num_workers={workers}) with no sampler."
    ]
    if stream.branch == "examples":
        out.append(
            f"num_shards {stream.num_shards} is not a multiple of the {dp} ranks: split_dataset_by_node "
            f"keeps 1 example in {dp}, every rank reading {stream.samples_read // dp} samples."
        )
    if model_parallel > 1:
        out.append(
            "Tensor-, pipeline- and context-parallel peers of a replica read the same samples: give the "
            f"splitter the data-parallel rank and size ({dp}), not the global ones."
        )
    out.append(
        f"Each worker batches its own stream, so a rank delivers the sum over its workers of ceil(worker's "
        f"samples / micro-batch) micro-batches, short last ones included; under end_of_epoch "
        f"{stream.end_of_epoch} {_POLICY[stream.end_of_epoch]}: {stream.micro_batches_per_epoch} "
        f"micro-batches a rank, {stream.optimizer_steps_per_epoch} optimizer steps of {accumulation} a pass."
    )
    if stream.leftover_micro_batches:
        carried = (
            "open the next pass's first step"
            if stream.end_of_epoch == "steps"
            else "do not complete an optimizer step and are skipped (the next epoch starts a new step)"
        )
        out.append(f"The last {stream.leftover_micro_batches} micro-batches of a pass {carried}.")
    if any(n % g.micro_batch_size for g in stream.rank_groups for n in g.worker_samples):
        out.append(
            "Some micro-batches are short (stream.rank_groups[].short_micro_batches: where each falls): "
            "scale each micro-batch's summed loss by data_parallel_size / (the samples the whole optimizer "
            "step holds, all-reduced over the ranks), as stream.loss_scale_formula says, so that every "
            "sample weighs the same after DDP averages the ranks, where a fixed data_parallel_size x "
            "micro_batch_size / global_batch_size would not."
        )
    return out
