"""One step's gradient on a mesh rank's share of the model, for the plan and for each control
that must run through the real wrappers: the micro-batches under `fully_shard` (reduced once,
on the last), or the pipeline schedule with the plan's micro-batches as its own.

Each step builds its own stage and schedule, which infer the stages' shapes over the pipeline
group first (pickled metadata, a third of a step). Building the schedule once per check and
stepping it again for each control (another loss scale, `scale_grads` switched) failed with a
gloo size mismatch on 1F1B with two micro-batches of summed losses (not narrowed down further),
and the controls share passes without a schedule where they can (mesh_gradients): only the
plan's step, or the controls of a model whose micro-batches cannot be stacked, run here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from app.worker.training.mesh_models import accumulate, full_gradients
from app.worker.training.synthetic_model import backward
from app.worker.training.workload import Workload


class MeshSteps:
    def __init__(
        self,
        module: nn.Module,
        mesh: DeviceMesh,
        place: dict[str, int],
        workload: Workload,
        *,
        accumulation: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.module, self.mesh, self.place, self.workload = module, mesh, place, workload
        self.g, self.dtype, self.device = accumulation, dtype, device
        self.pp = mesh["pp"].size() if "pp" in (mesh.mesh_dim_names or ()) else 1

    def gradients(
        self, reads: Sequence[Sequence[int]], scale: float, reduction: str, scale_grads: bool = True
    ) -> dict[str, torch.Tensor]:
        """The step's gradient of the micro-batches `reads`, each loss times `scale`,
        gathered whole and by name."""
        self.backward(reads, scale, reduction, scale_grads)
        return full_gradients(self.module)

    def backward(
        self, reads: Sequence[Sequence[int]], scale: float, reduction: str, scale_grads: bool = True
    ) -> None:
        """The step's backward passes: the gradient is left on this rank's share."""
        self.module.zero_grad(set_to_none=True)
        if self.pp > 1:
            schedule = self._schedule(scale, reduction, scale_grads)
            x, y = self.workload.batch([i for batch in reads for i in batch], self.dtype, self.device)
            stage = self.place["pp"]
            if stage == 0:
                schedule.step(x)
            elif stage == self.pp - 1:
                schedule.step(target=y)
            else:
                schedule.step()
        else:
            for k, batch in enumerate(reads):
                accumulate(self.module, k == self.g - 1)
                x, y = self.workload.batch(batch, self.dtype, self.device)
                backward(self.workload.loss(self.module, x, y, reduction) * scale)

    def _schedule(self, scale: float, reduction: str, scale_grads: bool) -> Schedule1F1B | ScheduleGPipe:
        stage = PipelineStage(
            self.module, self.place["pp"], self.pp, self.device, group=self.mesh["pp"].get_group()
        )

        def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            # The schedule divides by its micro-batches (scale_grads): undo it in the plan's scale.
            return _loss_of(self.workload, output, target, reduction) * (scale * self.g)

        kind = Schedule1F1B if self.g >= self.pp else ScheduleGPipe
        return kind(stage, n_microbatches=self.g, loss_fn=loss_fn, scale_grads=scale_grads)


def _loss_of(workload: Workload, output: torch.Tensor, target: torch.Tensor, reduction: str) -> torch.Tensor:
    """The workload's loss of an output the schedule computed (its loss_fn is a mean)."""
    if workload.loss_fn is None:
        # The schedule calls the loss on the last stage's output; a model's own outputs.loss
        # has no place in it.
        raise ValueError(
            f"model {workload.name!r}: a pipeline-parallel check needs a loss_fn from its factory"
        )
    mean: torch.Tensor = workload.loss_fn(output, target)
    return mean if reduction == "mean" else mean * output.shape[0]
