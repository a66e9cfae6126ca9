"""The plan IR: operators tagged with an engine, grouped into per-layer plans, in one Plan.

Why a separate module: the executor, the bench and `explain()` all read this structure, and it
must survive a JSON round trip (plans are logged next to benchmark results and can be replayed),
so it holds data only — no cost logic, no strategy logic.

The plan is a DAG: every operator lists its `children` (its inputs, Spark-explain style). Inside
a layer the operators form a chain in execution order; static inputs built once (the cached edge
partitionings, per-vertex graph statistics) are shared children of the operators that read them,
possibly from later layers. `to_dict()` therefore writes children as operator ids and
`from_dict()` re-links them, so sharing is preserved and nothing is serialised twice.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sparkgnn.planner.errors import PlanError

#: The operator vocabulary (docs/ARCHITECTURE.md "Data movement and the planner"; Materialize cuts lineage).
OPERATORS = (
    "Scan",
    "Partition",
    "Scatter",
    "Collect",
    "Pipe",
    "LocalAggregate",
    "Shuffle",
    "Merge",
    "ApplyVertex",
    "Join",
    "StorePE",
    "LoadPE",
    "SplitRequest",
    "SelectRecompute",
    "AllGather",
    "Materialize",
)
#: GRAPH = Spark, PIPE = Arrow micro-batches crossing to/from Python workers, DL = torch worker.
ENGINES = ("GRAPH", "PIPE", "DL")

#: Keys of LayerPlan.estimates (all numbers; bytes are ints, seconds a float).
ESTIMATE_KEYS = (
    "shuffle_bytes",
    "python_in_bytes",
    "python_out_bytes",
    "python_bytes",
    "passes",
    "edges",
    "seconds",
)

FORMAT_VERSION = 1


@dataclass
class Operator:
    """One node of the plan.

    `attrs` carries machine-readable details the executor and the rewrites need (JSON-safe
    values only). Keys in use:
      - Pipe: `direction` ("to_dl" | "to_graph"); to_dl: `carried` (bytes produced by the
        preceding DL op, which vanish when fused) and `side` ({name: bytes} of inputs Spark must
        still ship); to_graph: `intermediate` (bytes only the next DL op needs) and `kept`
        ({name: bytes} Spark keeps, e.g. h of the next layer).
      - DL ops: `edges` (edges whose message this op computes; drives the per-edge cost term),
        `single_batch` (True: all rows of the partition must reach the worker in one batch,
        used by the collect-all path for non-decomposable aggregations).
      - GRAPH ops: `reads` (name of a static input, e.g. "edges_by_src"), `key` ("src" | "dst"
        for Partition/Shuffle keys), `static` (built once, reused by every layer).
    `layer` is the logical layer the operator belongs to (None for shared static inputs); it
    can differ from the LayerPlan holding it when fusion hoisted the operator into the previous
    layer's Python pass.
    """

    name: str
    engine: str
    est_bytes: int = 0
    detail: str = ""
    children: list[Operator] = field(default_factory=list)
    est_rows: int = 0
    layer: int | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    id: str = ""

    def __post_init__(self) -> None:
        if self.name not in OPERATORS:
            raise PlanError(f"unknown operator {self.name!r}; the vocabulary is {', '.join(OPERATORS)}")
        if self.engine not in ENGINES:
            raise PlanError(f"operator {self.name} has unknown engine {self.engine!r}; expected one of {ENGINES}")
        if self.est_bytes < 0 or self.est_rows < 0:
            raise PlanError(
                f"operator {self.name} has a negative estimate ({self.est_bytes} bytes, {self.est_rows} rows)"
            )

    @property
    def direction(self) -> str | None:
        """For Pipe operators: "to_dl" or "to_graph"; None otherwise."""
        return self.attrs.get("direction") if self.name == "Pipe" else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "engine": self.engine,
            "est_bytes": int(self.est_bytes),
            "est_rows": int(self.est_rows),
            "detail": self.detail,
            "layer": self.layer,
            "attrs": self.attrs,
            "children": [child.id for child in self.children],
        }


@dataclass
class LayerPlan:
    """The physical plan of one GNN layer.

    `ops` are the operators this layer's stage runs, in execution order (a chain; shared static
    inputs appear in the first layer that uses them). `estimates` are the costs of exactly these
    operators. `candidates` are, per strategy, the estimated marginal seconds of running this
    layer with that strategy (including the preparation work fusion hoists into the previous
    layer's pass, and any edge partitioning the strategy adds); inf when it cannot apply. The two
    can therefore differ slightly for the chosen strategy: `estimates` say where time is spent,
    `candidates` say why the strategy was picked.
    """

    index: int
    strategy: str
    pre_transform: bool
    ops: list[Operator]
    estimates: dict[str, float]
    candidates: dict[str, float]
    reason: str
    kind: str = ""
    in_dim: int = 0
    out_dim: int = 0
    aggregator: str = ""
    rewrites: list[str] = field(default_factory=list)

    @property
    def passes(self) -> int:
        """Python round trips this stage makes (each costs a mapInArrow / messenger turn)."""
        return int(self.estimates.get("passes", 0))

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "kind": self.kind,
            "in_dim": self.in_dim,
            "out_dim": self.out_dim,
            "aggregator": self.aggregator,
            "strategy": self.strategy,
            "pre_transform": self.pre_transform,
            "reason": self.reason,
            "rewrites": list(self.rewrites),
            "estimates": dict(self.estimates),
            # JSON has no inf: a candidate that cannot apply is written as null.
            "candidates": {k: (None if math.isinf(v) else v) for k, v in self.candidates.items()},
            "ops": [op.to_dict() for op in self.ops],
        }


@dataclass
class Plan:
    """A compiled plan: partition count, one LayerPlan per GNN layer, totals and warnings."""

    partitions: int
    layers: list[LayerPlan]
    strategy: str = "auto"
    fuse: bool = True
    collect_all: bool = False
    estimates: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    cost_model: dict[str, float] = field(default_factory=dict)
    graph_stats: dict[str, Any] = field(default_factory=dict)
    # Peak task memory: estimated bytes per layer's largest task, the per-task budget, and the size of
    # the destination-range chunks messages are aggregated in (planner.partitions, dl/chunks.py).
    memory: dict[str, Any] = field(default_factory=dict)
    # With requested ids: how the k-hop pruning was chosen (planner.pruning.PruningChoice.summary):
    # the mode, why, the frontier sizes per hop and every candidate's estimate. Empty otherwise.
    pruning: dict[str, Any] = field(default_factory=dict)

    @property
    def concurrent_tasks(self) -> int:
        """How many of a step's tasks run at once (planner.partitions.choose_layout)."""
        return int(self.memory.get("concurrent_tasks", self.partitions))

    def operators(self) -> Iterator[Operator]:
        """All operators in execution order (each once)."""
        for layer in self.layers:
            yield from layer.ops

    def op(self, op_id: str) -> Operator:
        for operator in self.operators():
            if operator.id == op_id:
                return operator
        raise PlanError(f"no operator with id {op_id!r} in this plan")

    def explain(self) -> str:
        from sparkgnn.planner.explain import explain

        return explain(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "partitions": self.partitions,
            "strategy": self.strategy,
            "fuse": self.fuse,
            "collect_all": self.collect_all,
            "estimates": dict(self.estimates),
            "warnings": list(self.warnings),
            "cost_model": dict(self.cost_model),
            "graph_stats": dict(self.graph_stats),
            "memory": dict(self.memory),
            "pruning": dict(self.pruning),
            "layers": [layer.to_dict() for layer in self.layers],
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), allow_nan=False, **kwargs)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """Rebuild a plan written by `to_dict()`; children are re-linked by id (shared nodes stay
        shared). Raises PlanError on a malformed document rather than a KeyError deep inside."""
        try:
            version = data.get("format_version", FORMAT_VERSION)
            if version != FORMAT_VERSION:
                raise PlanError(f"plan format_version {version} is not supported (expected {FORMAT_VERSION})")
            by_id: dict[str, Operator] = {}
            pending: list[tuple[Operator, list[str]]] = []
            layers = []
            for layer_data in data["layers"]:
                ops = []
                for op_data in layer_data["ops"]:
                    op = Operator(
                        name=op_data["name"],
                        engine=op_data["engine"],
                        est_bytes=int(op_data["est_bytes"]),
                        detail=op_data.get("detail", ""),
                        est_rows=int(op_data.get("est_rows", 0)),
                        layer=op_data.get("layer"),
                        attrs=dict(op_data.get("attrs", {})),
                        id=op_data["id"],
                    )
                    if op.id in by_id:
                        raise PlanError(f"duplicate operator id {op.id!r} in plan document")
                    by_id[op.id] = op
                    pending.append((op, list(op_data.get("children", []))))
                    ops.append(op)
                candidates = {k: (math.inf if v is None else float(v)) for k, v in layer_data["candidates"].items()}
                layers.append(
                    LayerPlan(
                        index=int(layer_data["index"]),
                        strategy=layer_data["strategy"],
                        pre_transform=bool(layer_data["pre_transform"]),
                        ops=ops,
                        estimates=dict(layer_data["estimates"]),
                        candidates=candidates,
                        reason=layer_data.get("reason", ""),
                        kind=layer_data.get("kind", ""),
                        in_dim=int(layer_data.get("in_dim", 0)),
                        out_dim=int(layer_data.get("out_dim", 0)),
                        aggregator=layer_data.get("aggregator", ""),
                        rewrites=list(layer_data.get("rewrites", [])),
                    )
                )
            for op, child_ids in pending:
                missing = [c for c in child_ids if c not in by_id]
                if missing:
                    raise PlanError(f"operator {op.id} refers to unknown children {missing}")
                op.children = [by_id[c] for c in child_ids]
            return cls(
                partitions=int(data["partitions"]),
                layers=layers,
                strategy=data.get("strategy", "auto"),
                fuse=bool(data.get("fuse", True)),
                collect_all=bool(data.get("collect_all", False)),
                estimates=dict(data.get("estimates", {})),
                warnings=list(data.get("warnings", [])),
                cost_model=dict(data.get("cost_model", {})),
                graph_stats=dict(data.get("graph_stats", {})),
                memory=dict(data.get("memory", {})),
                pruning=dict(data.get("pruning", {})),
            )
        except KeyError as exc:
            raise PlanError(f"plan document is missing key {exc.args[0]!r}") from None
        except (TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, PlanError):
                raise
            raise PlanError(f"malformed plan document: {exc}") from None
