"""Turn the plain-dict inputs (layers from Model.plan_info(), graph stats from Spark, the task)
into checked, typed specs.

Why a module of its own: the planner is fed by three other components written independently
(models, the Spark statistics job, the CLI/API), so every malformed input must be refused here,
once, with a PlanError that names the layer/key at fault — not surface later as a KeyError or a
silently absurd cost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from sparkgnn.planner.errors import PlanError

LAYER_KEYS = (
    "index",
    "kind",
    "in_dim",
    "out_dim",
    "aggregator",
    "src_width",
    "dst_width",
    "msg_width",
    "state_width",
    "needs_dst_in_message",
    "can_pre_transform",
    "self_loops",
    "uses_edge_weight",
    "required_stats",
    "decomposable",
)
WIDTH_KEYS = ("raw", "pre_transform")

#: Graph statistics every plan needs.
CORE_STAT_KEYS = ("num_vertices", "num_edges", "feature_dim", "partitions")
#: Statistics only some strategies need; when absent those strategies are not applicable.
OPTIONAL_STAT_KEYS = ("mirror_rows", "combine_rows", "in_mirror_rows", "max_partition_edges", "local_combine_rows")

TASK_DEFAULTS: dict[str, Any] = {
    "partitions": None,
    "ids": None,
    "fuse": True,
    "collect_all": False,
    "mapped_payloads": False,
    "concurrent_tasks": None,
    # True when the session has the sparkgnn JVM functions (engine.jvm), else why it has not
    "native_aggregates": "the session was not checked for the sparkgnn JVM functions",
}
TASK_REQUIRED = ("strategy", "cores", "memory_per_task_bytes")


@dataclass(frozen=True)
class Widths:
    raw: int
    pre_transform: int

    def pick(self, pre_transform: bool) -> int:
        return self.pre_transform if pre_transform else self.raw


@dataclass(frozen=True)
class LayerSpec:
    """One conv layer as the planner sees it (see Model.plan_info())."""

    index: int
    kind: str
    in_dim: int
    out_dim: int
    aggregator: str
    src_width: Widths
    dst_width: int
    msg_width: Widths
    state_width: Widths
    needs_dst_in_message: bool
    can_pre_transform: bool
    self_loops: str
    uses_edge_weight: bool
    required_stats: tuple[str, ...]
    decomposable: bool
    # The DL step runs this layer on destination ranges (layers/rowwise.py): its state and update
    # temporaries never exist for the whole partition. Optional in plan_info (False: counted whole).
    range_wise: bool = False
    # The message is a scaled source payload (MergeableConv.message_scale): weight x payload, no
    # destination, no non-linearity, so an engine without the layer's code can form it (pushdown).
    # Optional in plan_info (False: only the DL engine can form the messages).
    message_scaled: bool = False
    # The layer runs as a whole over each destination's in-edges with every source once (the generic
    # fallback, sparkgnn.layers.generic): no partial states, so only a strategy that brings a
    # destination's whole in-edge neighbourhood to its partition can run it (replicate).
    # Optional in plan_info (False: an ordinary mergeable layer).
    whole_neighbourhoods: bool = False
    # Width of the edge attributes the messages read (MergeableConv.edge_attr_dim; 0: none): they
    # travel with each edge, which only the strategies that ship edges as they are can do
    # (replicate, edge_join). Optional in plan_info (0).
    edge_attr_dim: int = 0

    @property
    def label(self) -> str:
        return f"layer {self.index} ({self.kind}, aggregator {self.aggregator!r})"


@dataclass(frozen=True)
class GraphStats:
    """Statistics Spark computed once for a partition count P (see docs/ARCHITECTURE.md, planner, for each)."""

    num_vertices: int
    num_edges: int
    feature_dim: int
    partitions: int
    mirror_rows: int | None = None
    combine_rows: int | None = None
    in_mirror_rows: int | None = None
    max_partition_edges: int | None = None
    local_combine_rows: int | None = None

    def single_partition(self) -> GraphStats:
        """The stats of the same graph on one partition: nothing is ever remote."""
        return replace(
            self,
            partitions=1,
            mirror_rows=0,
            combine_rows=0,
            in_mirror_rows=0,
            max_partition_edges=self.num_edges,
            local_combine_rows=min(self.num_vertices, self.num_edges),
        )

    def as_dict(self) -> dict[str, int]:
        keys = CORE_STAT_KEYS + OPTIONAL_STAT_KEYS
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


@dataclass(frozen=True)
class Task:
    strategy: str
    partitions: int | None
    cores: int
    memory_per_task_bytes: int
    ids: int | None
    fuse: bool
    collect_all: bool
    # remote payloads stay in memory-mapped exchange files, outside the task's memory (partitions.py)
    mapped_payloads: bool = False
    # how many of a step's tasks run at once (partitions.choose_layout); None: min(cores, P)
    concurrent_tasks: int | None = None
    # why the session lacks the sparkgnn JVM functions the pushdown strategy needs (None: it has them)
    native_aggregates_missing: str | None = "the session was not checked for the sparkgnn JVM functions"


def check_int(value: Any, what: str, minimum: int = 0) -> int:
    """An integer >= minimum. bool is refused (True would silently mean 1)."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer() and math.isfinite(value):
            value = int(value)
        else:
            raise PlanError(f"{what} must be an integer, got {value!r}")
    if value < minimum:
        bound = "positive" if minimum == 1 else f">= {minimum}"
        raise PlanError(f"{what} must be {bound}, got {value}")
    return value


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise PlanError(f"{what} must be a bool, got {value!r}")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise PlanError(f"{what} must be a non-empty string, got {value!r}")
    return value


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise PlanError(f"{what} must be a dict, got {type(value).__name__}")
    return value


def _widths(value: Any, what: str) -> Widths:
    value = _mapping(value, what)
    missing = [k for k in WIDTH_KEYS if k not in value]
    if missing:
        raise PlanError(f"{what} is missing key(s) {missing} (expected {list(WIDTH_KEYS)})")
    return Widths(
        check_int(value["raw"], f"{what}['raw']", 1), check_int(value["pre_transform"], f"{what}['pre_transform']", 1)
    )


def parse_layer(data: Any, position: int) -> LayerSpec:
    where = f"layers[{position}]"
    data = _mapping(data, where)
    missing = [k for k in LAYER_KEYS if k not in data]
    if missing:
        raise PlanError(f"{where} is missing key(s) {missing}; Model.plan_info() must provide {list(LAYER_KEYS)}")
    stats = data["required_stats"]
    if isinstance(stats, str) or not isinstance(stats, (list, tuple)):
        raise PlanError(f"{where}['required_stats'] must be a list of names, got {stats!r}")
    spec = LayerSpec(
        index=check_int(data["index"], f"{where}['index']"),
        kind=_str(data["kind"], f"{where}['kind']"),
        in_dim=check_int(data["in_dim"], f"{where}['in_dim']", 1),
        out_dim=check_int(data["out_dim"], f"{where}['out_dim']", 1),
        aggregator=_str(data["aggregator"], f"{where}['aggregator']"),
        src_width=_widths(data["src_width"], f"{where}['src_width']"),
        dst_width=check_int(data["dst_width"], f"{where}['dst_width']"),
        msg_width=_widths(data["msg_width"], f"{where}['msg_width']"),
        state_width=_widths(data["state_width"], f"{where}['state_width']"),
        needs_dst_in_message=_bool(data["needs_dst_in_message"], f"{where}['needs_dst_in_message']"),
        can_pre_transform=_bool(data["can_pre_transform"], f"{where}['can_pre_transform']"),
        self_loops=str(data["self_loops"]),
        uses_edge_weight=_bool(data["uses_edge_weight"], f"{where}['uses_edge_weight']"),
        required_stats=tuple(_str(s, f"{where}['required_stats'] entry") for s in stats),
        decomposable=_bool(data["decomposable"], f"{where}['decomposable']"),
        range_wise=_bool(data.get("range_wise", False), f"{where}['range_wise']"),
        message_scaled=_bool(data.get("message_scaled", False), f"{where}['message_scaled']"),
        whole_neighbourhoods=_bool(data.get("whole_neighbourhoods", False), f"{where}['whole_neighbourhoods']"),
        edge_attr_dim=check_int(data.get("edge_attr_dim", 0), f"{where}['edge_attr_dim']"),
    )
    phases = check_int(data.get("phases", 1), f"{where}['phases']", 1)
    if phases != 1:  # optional in plan_info; a plan's layer is one pass over the in-edges
        raise PlanError(
            f"{where} ({spec.kind}): aggregator {spec.aggregator!r} takes {phases} passes over the in-edges "
            "and a planned layer runs one; pass the model's rounds (Model.plan_info expands such a layer "
            "into one layer per pass, sparkgnn.layers.phases)"
        )
    if spec.needs_dst_in_message and spec.dst_width == 0:
        raise PlanError(f"{where} ({spec.kind}) needs the destination in its message but reports dst_width 0")
    return spec


def parse_layers(layers: Any) -> list[LayerSpec]:
    """Check every layer and that they are listed in order (indices 0..L-1). Widths need not
    chain: node-wise ops between convs (a Linear, a head) may change them, and the model checks
    its own chain."""
    if isinstance(layers, (str, bytes)) or not isinstance(layers, (list, tuple)):
        raise PlanError(f"layers must be a list of layer dicts, got {type(layers).__name__}")
    if not layers:
        raise PlanError("layers is empty: a model needs at least one conv layer to plan")
    specs = [parse_layer(layer, i) for i, layer in enumerate(layers)]
    for position, spec in enumerate(specs):
        if spec.index != position:
            raise PlanError(
                f"layers[{position}] has index {spec.index}; "
                f"layers must be listed in order with indices 0..{len(specs) - 1}"
            )
    return specs


def parse_graph_stats(stats: Any) -> GraphStats:
    stats = _mapping(stats, "graph_stats")
    missing = [k for k in CORE_STAT_KEYS if k not in stats]
    if missing:
        raise PlanError(f"graph_stats is missing key(s) {missing}")
    core = {
        "num_vertices": check_int(stats["num_vertices"], "graph_stats['num_vertices']", 1),
        "num_edges": check_int(stats["num_edges"], "graph_stats['num_edges']"),
        "feature_dim": check_int(stats["feature_dim"], "graph_stats['feature_dim']", 1),
        "partitions": check_int(stats["partitions"], "graph_stats['partitions']", 1),
    }
    optional = {
        key: check_int(stats[key], f"graph_stats[{key!r}]") for key in OPTIONAL_STAT_KEYS if stats.get(key) is not None
    }
    parsed = GraphStats(**core, **optional)
    # A (vertex, remote partition) pair needs at least one edge and a remote partition, so these
    # bounds hold for any partitioning; violating them means the stats were swapped or stale.
    cross_bound = min(parsed.num_edges, parsed.num_vertices * (parsed.partitions - 1))
    for key in ("mirror_rows", "combine_rows", "in_mirror_rows"):
        value = getattr(parsed, key)
        if value is not None and value > cross_bound:
            raise PlanError(
                f"graph_stats[{key!r}] = {value} is impossible: it cannot exceed "
                f"min(num_edges, num_vertices x (partitions - 1)) = {cross_bound}"
            )
    for key in ("max_partition_edges", "local_combine_rows"):
        value = getattr(parsed, key)
        limit = parsed.num_edges if key == "max_partition_edges" else min(parsed.num_edges, parsed.num_vertices)
        if value is not None and value > limit:
            raise PlanError(f"graph_stats[{key!r}] = {value} exceeds its bound {limit}")
    return parsed


def parse_task(task: Any, strategy_names: tuple[str, ...]) -> Task:
    task = _mapping(task, "task")
    unknown = sorted(set(task) - set(TASK_REQUIRED) - set(TASK_DEFAULTS))
    if unknown:
        raise PlanError(
            f"task has unknown key(s) {unknown}; accepted keys are {sorted(TASK_REQUIRED + tuple(TASK_DEFAULTS))}"
        )
    missing = [k for k in TASK_REQUIRED if k not in task]
    if missing:
        raise PlanError(f"task is missing key(s) {missing}")
    merged = {**TASK_DEFAULTS, **task}
    strategy = merged["strategy"]
    choices = ("auto",) + strategy_names
    if strategy not in choices:
        raise PlanError(f"unknown strategy {strategy!r}; choose one of {', '.join(choices)}")
    partitions = merged["partitions"]
    ids = merged["ids"]
    return Task(
        strategy=strategy,
        partitions=None if partitions is None else check_int(partitions, "task['partitions']", 1),
        cores=check_int(merged["cores"], "task['cores']", 1),
        memory_per_task_bytes=check_int(merged["memory_per_task_bytes"], "task['memory_per_task_bytes']", 1),
        ids=None if ids is None else check_int(ids, "task['ids'] (count of requested ids)", 1),
        fuse=_bool(merged["fuse"], "task['fuse']"),
        collect_all=_bool(merged["collect_all"], "task['collect_all']"),
        mapped_payloads=_bool(merged["mapped_payloads"], "task['mapped_payloads']"),
        concurrent_tasks=None
        if merged["concurrent_tasks"] is None
        else check_int(merged["concurrent_tasks"], "task['concurrent_tasks']", 1),
        native_aggregates_missing=_native_aggregates(merged["native_aggregates"]),
    )


def _native_aggregates(value: Any) -> str | None:
    """task['native_aggregates']: True when the session has the JVM functions (None: nothing
    missing), or a non-empty string saying why it has not."""
    if value is True:
        return None
    if isinstance(value, str) and value:
        return value
    raise PlanError(f"task['native_aggregates'] must be True or a reason string, got {value!r}")
