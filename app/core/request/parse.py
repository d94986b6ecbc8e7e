"""A plan request as JSON (the body of POST /v1/plans) to the core's PlanRequest: the one
place that knows how the JSON fields map to core types.

The HTTP schema validates first and hands over its validated model itself, read through its
`vars()` (`_fields`); the rank program reads the check's stored JSON (the same schema's
`model_dump(mode="json")`). Either way this only builds:
the planner's own checks apply afterwards. Numbers the core holds as floats are made floats
here, so that a JSON `2` plans (and serialises) exactly as pydantic's `2.0` does. JSON that no
schema read is refused at its field where it leaves out what the planner needs.

Over 300 lines: one concept, the JSON-to-core mapping of every section of the request (and
back, for the stored request); split by section it would spread one mapping over files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import fields as dataclass_fields
from dataclasses import is_dataclass
from enum import Enum
from typing import Any, TypeVar, cast

from app.core.errors.domain import InvalidValue
from app.core.records import plan_request as core
from app.core.records.recommendation import Architecture, Law, RecommendSpec
from app.core.records.resume import ResumeSpec
from app.core.records.throughput_curve import ThroughputCurve
from app.core.request.dataset import dataset_json, dataset_spec

E = TypeVar("E", bound=Enum)


def plan_request(body: Mapping[str, Any] | object) -> core.PlanRequest:
    data = _fields(body)
    dataset = data.get("dataset")
    return core.PlanRequest(
        topology=topology(_fields(_required(data, "topology", "/topology"))),
        global_batch_size=data.get("global_batch_size"),
        micro_batch_size=data.get("micro_batch_size"),
        gradient_accumulation_steps=data.get("gradient_accumulation_steps"),
        max_micro_batch_size=data.get("max_micro_batch_size"),
        divisibility=_member(
            core.Divisibility, data.get("divisibility", core.Divisibility.EXACT), "/divisibility"
        ),
        parallelism=core.Parallelism(**_fields(data.get("parallelism") or {})),
        loss_reduction=_member(
            core.LossReduction, data.get("loss_reduction", core.LossReduction.MEAN), "/loss_reduction"
        ),
        dataset=dataset_spec(dataset) if dataset else None,
        learning_rate=learning_rate(data.get("learning_rate")),
        gradient_noise_scale=_float_or_none(data.get("gradient_noise_scale")),
        gradient_noise_scale_stderr=_float_or_none(data.get("gradient_noise_scale_stderr")),
        sequence_length=data.get("sequence_length"),
        global_batch_tokens=data.get("global_batch_tokens"),
        micro_batch_tokens=data.get("micro_batch_tokens"),
        loss_normalization=_member(
            core.LossNormalization,
            data.get("loss_normalization", core.LossNormalization.SAMPLE),
            "/loss_normalization",
        ),
        packing=packing(data.get("packing")),
        resume=resume(data.get("resume")),
        recommend=recommend(data.get("recommend")),
    )


def packing(body: Mapping[str, Any] | object | None) -> core.PackingSpec | None:
    """The request's `packing` (app.core.tokens.packing checks it against the rest)."""
    if body is None:
        return None
    data = _fields(body)
    lengths = data.get("document_length")
    known = _fields(lengths) if lengths is not None else None
    return core.PackingSpec(
        mode=_member(core.PackingMode, _required(data, "mode", "/packing/mode"), "/packing/mode"),
        max_tokens_per_micro_batch=data.get("max_tokens_per_micro_batch"),
        document_length=None
        if known is None
        else core.DocumentLength(mean=_float_or_none(known.get("mean")), max=known.get("max")),
    )


def recommend(body: Mapping[str, Any] | object | None) -> RecommendSpec | None:
    """The request's `recommend` (app.core.learning_rate.recommend checks its numbers)."""
    if body is None:
        return None
    data = _fields(body)
    architecture = data.get("architecture")
    arch = _fields(architecture) if architecture is not None else None
    return RecommendSpec(
        law=_member(Law, _required(data, "law", "/recommend/law"), "/recommend/law"),
        train_tokens=_required(data, "train_tokens", "/recommend/train_tokens"),
        non_embedding_params=data.get("non_embedding_params"),
        flops_per_token=_float_or_none(data.get("flops_per_token")),
        architecture=None
        if arch is None
        else Architecture(
            layers=_required(arch, "layers", "/recommend/architecture/layers"),
            hidden_size=_required(arch, "hidden_size", "/recommend/architecture/hidden_size"),
            ffn_hidden_size=_required(arch, "ffn_hidden_size", "/recommend/architecture/ffn_hidden_size"),
            num_heads=_required(arch, "num_heads", "/recommend/architecture/num_heads"),
            num_kv_heads=arch.get("num_kv_heads"),
            vocab_size=arch.get("vocab_size"),
            gated_ffn=bool(arch.get("gated_ffn", True)),
        ),
        measured_noise_scale=_float_or_none(data.get("measured_noise_scale")),
        noise_scale_check=data.get("noise_scale_check"),
    )


def resume(body: Mapping[str, Any] | object | None) -> ResumeSpec | None:
    if body is None:  # an empty object is a resume that names no step: the planner says so
        return None
    data = _fields(body)
    return ResumeSpec(
        optimizer_step=data.get("optimizer_step"),
        consumed_samples=data.get("consumed_samples"),
        data_parallel_size=data.get("data_parallel_size"),
    )


def topology(data: Mapping[str, Any]) -> core.Topology:
    groups = data.get("node_groups")
    if not groups:
        nodes, gpus = data.get("num_nodes"), data.get("gpus_per_node")
        if nodes is None or gpus is None:  # JSON the schema did not read: said as it says it
            raise InvalidValue("give num_nodes and gpus_per_node (or node_groups)", pointer="/topology")
        return core.Topology.homogeneous(nodes, gpus, _curve(data.get("throughput_curve")))
    return core.Topology(
        tuple(
            core.NodeGroup(
                # An unnamed group is named by its place in the request, as errors point to it.
                g.get("name") or f"group{i}",
                g["num_nodes"],
                g["gpus_per_node"],
                float(g.get("relative_throughput", 1.0)),
                g.get("max_micro_batch_size"),
                _curve(g.get("throughput_curve")),
            )
            for i, g in enumerate(map(_fields, groups))
        ),
        listed_groups=True,
    )


def _curve(points: Any) -> ThroughputCurve | None:
    """A throughput curve's points as the core's two tuples; app.core.split.curve_checks checks them.
    A value that is not a list of objects is left for those checks to name."""
    if points is None:
        return None
    sizes: list[Any] = []
    rates: list[Any] = []
    for point in points:
        fields = _fields(point)
        sizes.append(fields.get("micro_batch_size"))
        rate = fields.get("samples_per_s")
        rates.append(float(rate) if isinstance(rate, (int, float)) and not isinstance(rate, bool) else rate)
    return ThroughputCurve(tuple(sizes), tuple(rates))


def curve_json(curve: ThroughputCurve) -> list[dict[str, Any]]:
    """A curve as the request writes it: a list of {micro_batch_size, samples_per_s}."""
    return [
        {"micro_batch_size": b, "samples_per_s": r}
        for b, r in zip(curve.micro_batch_sizes, curve.samples_per_s, strict=True)
    ]


def lr_scaling_json(probe: core.LrScaling) -> dict[str, Any]:
    """What the plan read of a probe's result, as the request writes it (`_lr_scaling` reads it)."""
    out: dict[str, Any] = {
        "best_rule": probe.best_rule,
        "rules": [{k: v for k, v in dataclasses.asdict(r).items() if v is not None} for r in probe.rules],
    }
    if probe.base_batch_size is not None and probe.base_lr is not None:
        out["base"] = {"batch_size": probe.base_batch_size, "lr": probe.base_lr}
    for key in ("plan_rule_holds", "regime", "verdict"):
        if getattr(probe, key) is not None:
            out[key] = getattr(probe, key)
    return out


def learning_rate(body: Mapping[str, Any] | object | None) -> core.LearningRateSpec | None:
    """Also the elastic request's `learning_rate`, which has the same shape."""
    if not body:
        return None
    data = _fields(body)
    beta1, beta2 = data.get("betas", _LR_DEFAULTS.betas)  # a JSON list, or pydantic's tuple
    return core.LearningRateSpec(
        base_lr=_float_or_none(data.get("base_lr")),
        base_batch_size=data.get("base_batch_size", _LR_DEFAULTS.base_batch_size),
        rule=_member(core.LRRule, data.get("rule", _LR_DEFAULTS.rule), "/learning_rate/rule"),
        optimizer=_member(
            core.Optimizer, data.get("optimizer", _LR_DEFAULTS.optimizer), "/learning_rate/optimizer"
        ),
        warmup_epochs=_float_or_none(data.get("warmup_epochs")),
        warmup_steps=data.get("warmup_steps"),
        betas=(float(beta1), float(beta2)),
        eps=float(data.get("eps", _LR_DEFAULTS.eps)),
        base_batch_tokens=data.get("base_batch_tokens"),
        warmup_start_lr=_float_or_none(data.get("warmup_start_lr")),
        decay=_member(core.Decay, data["decay"], "/learning_rate/decay")
        if data.get("decay") is not None
        else None,
        min_lr=_float_or_none(data.get("min_lr")),
        milestones=_tuple_or_none(data.get("milestones"), int),
        milestone_epochs=_tuple_or_none(data.get("milestone_epochs"), float),
        gamma=float(data.get("gamma", _LR_DEFAULTS.gamma)),
        train_steps=data.get("train_steps"),
        train_samples=data.get("train_samples"),
        momentum=_float_or_none(data.get("momentum")),
        nesterov=bool(data.get("nesterov", _LR_DEFAULTS.nesterov)),
        weight_decay=float(data.get("weight_decay", _LR_DEFAULTS.weight_decay)),
        max_grad_norm=_float_or_none(data.get("max_grad_norm")),
        lr_scaling=_lr_scaling(data.get("lr_scaling")),
        lr_scaling_check=data.get("lr_scaling_check"),
    )


def _lr_scaling(body: Mapping[str, Any] | object | None) -> core.LrScaling | None:
    """What the plan reads of an lr-scaling probe's result (its curves and noise scale are
    for people and charts)."""
    if body is None:
        return None
    data = _fields(body)
    base = _fields(data.get("base") or {})
    return core.LrScaling(
        best_rule=data.get("best_rule"),
        rules=tuple(
            core.ProbeRun(
                rule=r["rule"],
                lr=_float_or_none(r.get("lr")),
                final_loss_ratio=_float_or_none(r.get("final_loss_ratio")),
                holds=r.get("holds"),
            )
            for r in map(_fields, data.get("rules") or ())
        ),
        base_batch_size=base.get("batch_size"),
        base_lr=_float_or_none(base.get("lr")),
        plan_rule_holds=data.get("plan_rule_holds"),
        regime=data.get("regime"),
        verdict=data.get("verdict"),
    )


# The dataclass's defaults, read where a field is absent (base_lr has none; any will do).
_LR_DEFAULTS = core.LearningRateSpec(base_lr=1.0)


def _fields(data: Mapping[str, Any] | object) -> Mapping[str, Any]:
    """A JSON object as a mapping: a mapping as it is; a validated schema model as its vars(),
    field name to value, nested models left as they are. Reading the model's own fields skips
    `model_dump`, which cost a quarter of building the request (bench/bench_instructions.py)."""
    kind = type(data)
    mapping = _IS_MAPPING.get(kind)
    if mapping is None:  # asked once per type: isinstance against an ABC costs ~0.25 us a time
        mapping = _IS_MAPPING[kind] = isinstance(data, Mapping)
    return cast(Mapping[str, Any], data) if mapping else vars(data)


_IS_MAPPING: dict[type, bool] = {}


def _member(kind: type[E], value: Any, pointer: str) -> E:
    """`kind(value)`; a member as such (the HTTP schema hands its enums over as members)
    skips the enum machinery, which costs more than the rest of a field. JSON that no schema
    read (the rank program's --request) is refused at `pointer` with the choices."""
    if type(value) is kind:
        return value
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(str(member.value) for member in kind)
        name = pointer.rsplit("/", 1)[-1]
        raise InvalidValue(f"{name} must be one of {choices}, not {value!r}", pointer=pointer) from None


def _required(data: Mapping[str, Any], key: str, pointer: str) -> Any:
    """`data[key]`, refused at `pointer` when JSON that no schema read leaves it out."""
    value = data.get(key)
    if value is None:
        raise InvalidValue(f"give {key}", pointer=pointer)
    return value


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _tuple_or_none(values: Any, kind: type[int] | type[float]) -> tuple[Any, ...] | None:
    return None if values is None else tuple(kind(v) for v in values)


def request_json(request: core.PlanRequest) -> dict[str, Any]:
    """`request` as POST /v1/plans takes it, null fields left out: `plan_request` reads it
    back as the same request (a re-planned request a user can send as it is)."""
    data: dict[str, Any] = _json_of(request)
    topology = request.topology
    if not topology.listed_groups:
        (group,) = topology.node_groups
        data["topology"] = {"num_nodes": group.num_nodes, "gpus_per_node": group.gpus_per_node}
    return data


def section_json(value: Any) -> Any:
    """One section of a request (its packing, its resume, ...) as the request gives it."""
    return _json_of(value)


def _json_of(value: Any) -> Any:
    # A curve and a probe's numbers are written as the request gives them, not as records.
    if isinstance(value, ThroughputCurve):
        return curve_json(value)
    if isinstance(value, core.LrScaling):
        return lr_scaling_json(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, core.DatasetSpec):
        return dataset_json(value, _json_of)
    if is_dataclass(value) and not isinstance(value, type):
        items = ((f.name, getattr(value, f.name)) for f in dataclass_fields(value))
        return {name: _json_of(v) for name, v in items if v is not None and name != "listed_groups"}
    if isinstance(value, tuple | list):
        return [_json_of(v) for v in value]
    return value
