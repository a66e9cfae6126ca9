"""Serving requests in the plan IR: a request's per-layer sizes -> an operator Plan with cost estimates.

WHY here and torch-free: a serving request (OMEGA's FULL, NS, HE, SRPE, EXACT) is a plan like a batch
job's, only tiny — so the same IR (Operator / LayerPlan / Plan, JSON round trip) carries it, and the
same "explain" shows it. The serving code measures the sizes (sparkgnn.serving.sizes from its
computation graph or LayerWork lists, sparkgnn.serving.sketch cheaply before running anything) and
hands them over as plain data (`RequestCounts`); this module only turns sizes into operators and
seconds, so it can be tested, calibrated and replayed without torch.

Two engines run a request, and each has its own constants (their inner loops differ):
  recompute  FULL and NS: the layered forward over the k-hop computation graph (compgraph.py):
             SplitRequest (BFS) -> Scan (raw features) -> per layer LocalAggregate + ApplyVertex.
  delta      HE, SRPE, EXACT: LayerWork evaluated from stored PEs (delta.py): SplitRequest ->
             SelectRecompute -> per layer LoadPE (stored values / states) -> LocalAggregate (new and
             old messages) -> Merge (stored state + partials) -> ApplyVertex [-> AllGather when P > 1].

The cost model (`ServingCostModel`) is linear in what each layer does: a fixed cost per layer and
per request, messages x message width (the gather/scatter of propagate or the CGP kernel), dense
multiply-adds of the layer's transforms, bytes loaded from storage, per-target bookkeeping, and the
index work of planning (CSC edges gathered). `choose()` compiles every candidate and keeps the
cheapest: QueryEngine(mode="auto") uses it to pick EXACT or FULL per request.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from sparkgnn.planner.errors import PlanError
from sparkgnn.planner.explain import human_bytes, operator_tree
from sparkgnn.planner.ir import LayerPlan, Operator, Plan

#: Engine kinds a request plan can run on (see module doc).
SERVING_ENGINES = ("recompute", "delta")


@dataclass(frozen=True)
class LayerCounts:
    """What one GNN layer of a request does (layer = 1..k). Plain ints: measured by the serving code.

    targets      vertices whose layer value is computed (queries included)
    from_state   of those, how many start from their STORED merged state (delta engine)
    rows_in      rows the layer's dense transform runs on (all inputs when it transforms before
                 propagating, else the targets)
    edges        NEW messages aggregated; old_edges: OLD messages subtracted (EXACT's delta)
    rows_loaded  rows read from storage (raw features for FULL's first layer; stored PE values and
                 states for the delta engine); bytes_loaded their bytes
    index_edges  CSC entries the planning step gathers for this layer (BFS / LayerWork building)
    """

    layer: int
    kind: str
    in_dim: int
    out_dim: int
    msg_width: int
    targets: int
    from_state: int = 0
    rows_in: int = 0
    edges: int = 0
    old_edges: int = 0
    rows_loaded: int = 0
    bytes_loaded: int = 0
    index_edges: int = 0
    aggregator: str = ""
    pre_transform: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int) and not isinstance(value, bool) and value < 0:
                raise PlanError(f"layer {self.layer}: {f.name} must be >= 0, got {value}")

    @property
    def flops(self) -> int:
        """Multiply-adds of the layer's dense transforms: rows_in x in x out (the message or root
        transform) plus targets x in x out (the update's own transform)."""
        return (self.rows_in + self.targets) * self.in_dim * self.out_dim


@dataclass(frozen=True)
class RequestCounts:
    """A request's sizes for one mode. `estimated`: from the cheap sketch (before running), not
    measured from the mode's own computation graph / LayerWork lists."""

    mode: str
    engine: str
    batch: int
    request_edges: int
    layers: tuple[LayerCounts, ...]
    partitions: int = 1
    estimated: bool = False
    detail: str = ""

    def __post_init__(self) -> None:
        if self.engine not in SERVING_ENGINES:
            raise PlanError(f"unknown serving engine {self.engine!r}; expected one of {SERVING_ENGINES}")
        if not self.layers:
            raise PlanError(f"a {self.mode} request plan needs at least one layer")
        if self.partitions < 1:
            raise PlanError(f"partitions must be >= 1, got {self.partitions}")


@dataclass(frozen=True)
class ServingCostModel:
    """Per-request cost constants (seconds), fitted by least squares on single-threaded
    (torch.set_num_threads(1)) timings of QueryEngine.answer on the 2-core machine of
    docs/PLATFORM.md (bench/calibrate_serving.py: Cora 1433-d and a 30K-vertex power-law graph
    64-d, GCN and GraphSAGE with 2 and 3 layers, B 16..1024, each request answered by FULL and
    EXACT). How often the fit picks the faster mode is in docs/ARCHITECTURE.md, "Serving plans in
    the IR and mode="auto"".

    request_s          per request (prepare, validation, answer assembly)
    *_layer_s          per layer of each engine (tensor set-up, the delta engine's per-layer
                       Python of partition_partials / merge)
    *_edge_float_s     per message x float of message width (index_select + scatter-add; the
                       delta kernel also builds unique sources and per-partition partials)
    flop_s             per multiply-add of a dense transform (single-thread float32 matmul)
    load_byte_s        per byte read from storage (fancy-index copy of feature / PE rows)
    delta_target_s     per target of the delta engine (positions, stored-state merge)
    index_edge_s       per CSC entry gathered while planning (BFS / LayerWork: numpy gathers,
                       membership marks, uniques)
    """

    request_s: float = 1.13e-3
    recompute_layer_s: float = 2.65e-4
    recompute_edge_float_s: float = 1.52e-8
    delta_layer_s: float = 0.0
    delta_edge_float_s: float = 6.30e-9
    delta_target_s: float = 1.41e-6
    flop_s: float = 4.21e-11
    load_byte_s: float = 3.69e-11
    index_edge_s: float = 1.08e-7

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise PlanError(f"ServingCostModel.{f.name} must be a finite number >= 0, got {value!r}")

    def layer_seconds(self, engine: str, c: LayerCounts, partitions: int = 1) -> float:
        """Seconds of one layer on `engine` (module doc). The delta engine with P partitions runs P
        kernels one after the other in-process, so its fixed per-layer cost is paid P times."""
        common = c.flops * self.flop_s + c.bytes_loaded * self.load_byte_s + c.index_edges * self.index_edge_s
        messages = (c.edges + c.old_edges) * c.msg_width
        if engine == "recompute":
            return common + self.recompute_layer_s + messages * self.recompute_edge_float_s
        return (
            common
            + self.delta_layer_s * partitions
            + messages * self.delta_edge_float_s
            + c.targets * self.delta_target_s
        )

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServingCostModel:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PlanError(f"unknown ServingCostModel constant(s) {unknown}; known: {sorted(known)}")
        return cls(**dict(data))

    #: the feature names `features()` returns, in `fit` order (bench/calibrate_serving.py)
    FIT_ORDER = (
        "request_s",
        "recompute_layer_s",
        "recompute_edge_float_s",
        "delta_layer_s",
        "delta_edge_float_s",
        "delta_target_s",
        "flop_s",
        "load_byte_s",
        "index_edge_s",
    )

    @classmethod
    def features(cls, counts: RequestCounts) -> dict[str, float]:
        """The quantities each constant multiplies for this request (seconds = sum of constant x
        feature): the design matrix row of the calibration fit."""
        row = dict.fromkeys(cls.FIT_ORDER, 0.0)
        row["request_s"] = 1.0
        for c in counts.layers:
            messages = float((c.edges + c.old_edges) * c.msg_width)
            row["flop_s"] += c.flops
            row["load_byte_s"] += c.bytes_loaded
            row["index_edge_s"] += c.index_edges
            if counts.engine == "recompute":
                row["recompute_layer_s"] += 1
                row["recompute_edge_float_s"] += messages
            else:
                row["delta_layer_s"] += counts.partitions
                row["delta_edge_float_s"] += messages
                row["delta_target_s"] += c.targets
        return row


DEFAULT_COST = ServingCostModel()


# -- operators per engine (a registry: one builder per engine kind) -------------------------------------
OpsBuilder = Callable[[RequestCounts, LayerCounts, "Operator | None", str], list[Operator]]
_BUILDERS: dict[str, OpsBuilder] = {}


def _builder(engine: str):
    def deco(fn: OpsBuilder) -> OpsBuilder:
        _BUILDERS[engine] = fn
        return fn

    return deco


def _split(counts: RequestCounts, first: LayerCounts, prefix: str) -> Operator:
    planning = sum(c.index_edges for c in counts.layers)
    return Operator(
        "SplitRequest",
        "GRAPH",
        est_rows=counts.batch,
        detail=f"B={counts.batch} queries, {counts.request_edges:,} request edges; "
        f"{planning:,} CSC entries gathered to plan ({counts.detail or counts.mode})",
        layer=first.layer - 1,
        attrs={"request_edges": counts.request_edges, "index_edges": planning},
        id=f"{prefix}split",
    )


@_builder("recompute")
def _recompute_ops(counts: RequestCounts, c: LayerCounts, prev: Operator | None, prefix: str) -> list[Operator]:
    ops: list[Operator] = []
    if prev is None:
        split = _split(counts, c, prefix)
        scan = Operator(
            "Scan",
            "GRAPH",
            est_bytes=c.bytes_loaded,
            est_rows=c.rows_loaded,
            detail="raw features of the computation graph's vertices of G",
            layer=c.layer - 1,
            children=[split],
            id=f"{prefix}scan",
        )
        ops += [split, scan]
        prev = scan
    agg = Operator(
        "LocalAggregate",
        "DL",
        est_rows=c.edges,
        detail=f"{c.edges:,} messages x {c.msg_width} floats"
        + (", transform before propagate" if c.pre_transform else ""),
        layer=c.layer - 1,
        children=[prev],
        attrs={"edges": c.edges},
        id=f"{prefix}L{c.layer}.agg",
    )
    apply = Operator(
        "ApplyVertex",
        "DL",
        est_rows=c.targets,
        detail=f"{c.targets:,} vertices updated ({c.in_dim} -> {c.out_dim})",
        layer=c.layer - 1,
        children=[agg],
        id=f"{prefix}L{c.layer}.apply",
    )
    return [*ops, agg, apply]


@_builder("delta")
def _delta_ops(counts: RequestCounts, c: LayerCounts, prev: Operator | None, prefix: str) -> list[Operator]:
    ops: list[Operator] = []
    if prev is None:
        split = _split(counts, c, prefix)
        select = Operator(
            "SelectRecompute",
            "GRAPH",
            est_rows=c.targets - counts.batch,
            detail=f"vertices of G recomputed per layer: "
            f"{', '.join(str(max(x.targets - counts.batch, 0)) for x in counts.layers)}",
            layer=c.layer - 1,
            children=[split],
            id=f"{prefix}select",
        )
        ops += [split, select]
        prev = select
    load = Operator(
        "LoadPE",
        "GRAPH",
        est_bytes=c.bytes_loaded,
        est_rows=c.rows_loaded,
        detail=f"stored layer-{c.layer - 1} values of unchanged sources + {c.from_state:,} stored states",
        layer=c.layer - 1,
        children=[prev],
        id=f"{prefix}L{c.layer}.load",
    )
    agg = Operator(
        "LocalAggregate",
        "DL",
        est_rows=c.edges + c.old_edges,
        detail=f"{c.edges:,} new + {c.old_edges:,} old messages x {c.msg_width} floats",
        layer=c.layer - 1,
        children=[load],
        attrs={"edges": c.edges, "old_edges": c.old_edges},
        id=f"{prefix}L{c.layer}.agg",
    )
    merge = Operator(
        "Merge",
        "DL",
        est_rows=c.targets,
        detail=f"{c.from_state:,} of {c.targets:,} targets start from their stored state"
        + (f"; partials of {counts.partitions} partitions to owners" if counts.partitions > 1 else ""),
        layer=c.layer - 1,
        children=[agg],
        id=f"{prefix}L{c.layer}.merge",
    )
    apply = Operator(
        "ApplyVertex",
        "DL",
        est_rows=c.targets,
        detail=f"{c.targets:,} vertices updated ({c.in_dim} -> {c.out_dim})",
        layer=c.layer - 1,
        children=[merge],
        id=f"{prefix}L{c.layer}.apply",
    )
    ops += [load, agg, merge, apply]
    if counts.partitions > 1 and c.layer < len(counts.layers):
        ops.append(
            Operator(
                "AllGather",
                "GRAPH",
                est_bytes=c.targets * c.out_dim * 4,
                est_rows=c.targets,
                detail=f"new values to all {counts.partitions} partitions",
                layer=c.layer - 1,
                children=[apply],
                id=f"{prefix}L{c.layer}.gather",
            )
        )
    return ops


def compile_request(counts: RequestCounts, cost: ServingCostModel = DEFAULT_COST) -> Plan:
    """One LayerPlan per GNN layer, operators chained in execution order, estimates per layer and
    in total (request_s is charged to the plan, not to a layer)."""
    build = _BUILDERS[counts.engine]
    prefix = f"{counts.mode}."
    layers: list[LayerPlan] = []
    prev: Operator | None = None
    total = cost.request_s
    for c in counts.layers:
        ops = build(counts, c, prev, prefix)
        prev = ops[-1]
        seconds = cost.layer_seconds(counts.engine, c, counts.partitions)
        total += seconds
        layers.append(
            LayerPlan(
                index=c.layer - 1,
                strategy=counts.mode,
                pre_transform=c.pre_transform,
                ops=ops,
                estimates={
                    "edges": c.edges,
                    "old_edges": c.old_edges,
                    "targets": c.targets,
                    "rows_loaded": c.rows_loaded,
                    "bytes_loaded": c.bytes_loaded,
                    "flops": c.flops,
                    "seconds": round(seconds, 9),
                },
                candidates={counts.mode: seconds},
                reason=f"{counts.mode} on the {counts.engine} engine",
                kind=c.kind,
                in_dim=c.in_dim,
                out_dim=c.out_dim,
                aggregator=c.aggregator,
            )
        )
    return Plan(
        partitions=counts.partitions,
        layers=layers,
        strategy=counts.mode,
        fuse=False,
        estimates={
            "seconds": round(total, 9),
            "edges": sum(c.edges + c.old_edges for c in counts.layers),
            "bytes_loaded": sum(c.bytes_loaded for c in counts.layers),
        },
        cost_model=cost.to_dict(),
        graph_stats={
            "serving": {
                "mode": counts.mode,
                "engine": counts.engine,
                "batch": counts.batch,
                "request_edges": counts.request_edges,
                "estimated": counts.estimated,
                "candidates": {counts.mode: round(total, 9)},
                "chosen_by": "",
            }
        },
    )


@dataclass
class Choice:
    """The result of `choose`: the chosen plan and every candidate's estimated seconds."""

    mode: str
    plan: Plan
    seconds: dict[str, float] = field(default_factory=dict)


def choose(candidates: Mapping[str, RequestCounts], cost: ServingCostModel = DEFAULT_COST) -> Choice:
    """Compile every candidate and keep the cheapest (ties: the first given). The chosen plan
    records all candidates' seconds, per plan and per layer, so explain() says why."""
    if not candidates:
        raise PlanError("choose() needs at least one candidate plan")
    plans = {name: compile_request(counts, cost) for name, counts in candidates.items()}
    seconds = {name: float(p.estimates["seconds"]) for name, p in plans.items()}
    best = min(seconds, key=lambda name: seconds[name])
    plan = plans[best]
    info = plan.graph_stats["serving"]
    info["candidates"] = {name: round(s, 9) for name, s in seconds.items()}
    info["chosen_by"] = "cost"
    for i, layer in enumerate(plan.layers):
        layer.candidates = {
            name: float(p.layers[i].estimates["seconds"]) if i < len(p.layers) else math.inf
            for name, p in plans.items()
        }
        layer.reason = f"cheapest estimated plan of {', '.join(plans)} for this request"
    return Choice(best, plan, seconds)


def _ms(seconds: float) -> str:
    return "n/a" if math.isinf(seconds) else f"{seconds * 1e3:.2f} ms"


def explain_request(plan: Plan) -> str:
    """A request plan as text: mode and candidates (estimated ms), then per layer its estimate and
    its operator tree (the batch explain's tree printer)."""
    info = plan.graph_stats.get("serving")
    if info is None:
        raise PlanError("not a serving request plan (compile it with planner.serving.compile_request)")
    est = plan.estimates
    candidates = " | ".join(
        f"{name} {_ms(s)}{' (chosen)' if name == plan.strategy else ''}" for name, s in info["candidates"].items()
    )
    lines = [
        f"== sparkgnn request plan: mode={plan.strategy} ({info['engine']} engine), B={info['batch']}, "
        f"{info['request_edges']:,} request edges, {len(plan.layers)} layer(s), {plan.partitions} partition(s) ==",
        f"candidates: {candidates}" + (" — chosen by estimated cost" if info.get("chosen_by") == "cost" else ""),
        f"total: {_ms(est.get('seconds', 0.0))}, {int(est.get('edges', 0)):,} messages, "
        f"{human_bytes(est.get('bytes_loaded', 0))} loaded"
        + (" (sizes from the pre-run sketch)" if info.get("estimated") else " (sizes measured)"),
    ]
    for layer in plan.layers:
        e = layer.estimates
        lines += [
            "",
            f"== Layer {layer.index + 1}/{len(plan.layers)}: {layer.kind} {layer.in_dim} -> {layer.out_dim}, "
            f"aggregator={layer.aggregator}, {int(e['targets']):,} targets, {int(e['edges']):,} new + "
            f"{int(e['old_edges']):,} old messages, {human_bytes(e['bytes_loaded'])} loaded, {_ms(e['seconds'])} ==",
        ]
        if len(layer.candidates) > 1:
            lines.append("candidates: " + " | ".join(f"{n} {_ms(s)}" for n, s in layer.candidates.items()))
        lines += operator_tree(layer)
    return "\n".join(lines)
