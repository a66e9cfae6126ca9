"""k-hop pruning: price inference for a subset of vertices through its upstream neighbourhood.

Why: a k-layer model needs h^k only at the requested ids, so h^(k-1) only at the ids and their
in-neighbours, ..., x only within k hops upstream. With D_0 = ids and D_(j+1) = D_j plus the
sources of D_j's in-edges, layer l (1..k) produces h^l for D_(k-l) from the in-edges of D_(k-l)
(sources in D_(k-l+1)). On a large graph and a small request these sets are a sliver of the graph;
on a power-law graph they can also swallow most of it within two hops. So the choice is priced, per
request, among the registered ways to run it (`PRUNINGS`):

  local     the frontier's in-edges and features are collected to the driver (one semi-join
            per hop, only the vertices the previous hop added) and the layers run there
            in process, each over exactly the rows and edges it needs. Bounded by LOCAL_BUDGET_BYTES
            (the frontier collection stops as soon as it would exceed it).
  subgraph  the frontier is the one collected to the driver while it fits the budget, else
            computed in Spark (engine.khop.upstream), and the normal distributed engine runs over
            the subgraph G' = (D_k, in-edges of D_(k-1)); layers whose messages read a per-vertex
            statistic of all in-edges (GCN's degree) take one more hop of edges so the statistic
            of every source is the whole graph's. Any strategy, any P.
  whole     the whole graph, the output filtered to the ids (what `ids` did before pruning). Taken
            when the frontier covers most of the graph (MOST_OF_THE_GRAPH of its edges), since then
            pruning only adds the frontier pass.

Estimates use the batch planner's CostModel for the engine's layers (planner.compile on the graph
or subgraph sizes) plus the constants of `PruningCosts` for what the batch model does not cover
(frontier scans, the driver's collection and in-process layers, the layout preparation), so a
pruned plan and the whole-graph plan are priced in the same seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkgnn.planner.errors import PlanError
from sparkgnn.planner.ir import LayerPlan, Operator, Plan
from sparkgnn.planner.segments import ID_BYTES

#: The whole graph is run (the output filtered) when the pruned subgraph holds at least this share
#: of the graph's edges: the layers would save little and the frontier pass costs extra.
MOST_OF_THE_GRAPH = 0.5

#: Driver memory a local pruned run may use for the subgraph (features + edges + activations).
LOCAL_BUDGET_BYTES = 512 * 2**20

FLOAT_BYTES = 4
EDGE_BYTES = 2 * ID_BYTES + FLOAT_BYTES  # src, dst, weight on the driver


#: The pruning modes (module doc): PRUNINGS prices each; engine.pruned runs LOCAL and SUBGRAPH, the
#: engine itself WHOLE.
LOCAL, SUBGRAPH, WHOLE = "local", "subgraph", "whole"


@dataclass(frozen=True)
class PruningCosts:
    """Seconds for the work the batch CostModel does not price. The defaults were measured on the
    bench graph of docs/PLATFORM.md's machine (derivation in docs/ARCHITECTURE.md, "Requested ids:
    k-hop pruning").

    scan_edge_s: one frontier hop (a broadcast semi-join of the edges with the hop's new ids and the
        collection of its in-edges), per graph edge.
    hop_s: the fixed cost of that Spark job (planning, task launch).
    collect_Bps: bytes per second of frontier features reaching the driver as Arrow.
    local_edge_s: the driver's in-process layer (decomposed propagate) per frontier edge, plus
        local_row_s per vertex row updated.
    prepare_edge_s: preparing a graph's layout for the engine (partitioned edges, vertex stats,
        mirror counts), per edge (paid by `subgraph` every time; by `whole` only when no earlier
        job prepared the graph).
    """

    scan_edge_s: float = 0.2e-6
    hop_s: float = 0.15
    collect_Bps: float = 32e6
    local_edge_s: float = 0.1e-6
    local_row_s: float = 0.5e-6
    prepare_edge_s: float = 3e-6


@dataclass
class Frontier:
    """The sizes the planner prices with: `vertices[j]` = |D_j| for j = 0..hops (complete only when
    the frontier was computed that far), `in_edges[j]` = in-edges of D_j, for j < hops."""

    vertices: list[int]
    in_edges: list[int]

    @property
    def hops(self) -> int:
        return len(self.vertices) - 1


@dataclass
class PruningInputs:
    """Everything the choice reads. `frontier` holds the sizes of the k (+1 with statistics) hops;
    `collected` whether the local frontier fitted the driver budget (False: `local` cannot apply);
    `layer_seconds(num_vertices, num_edges)` prices the engine's layers on a graph of that size
    (planner.compile on the caller's side); `whole_prepared` whether the whole graph's layout exists."""

    layers: list[dict]
    num_vertices: int
    num_edges: int
    feature_dim: int
    frontier: Frontier
    collected: bool
    layer_seconds: Callable[[int, int], float]
    whole_prepared: bool = False
    needs_stats: bool = False
    # a layer reads a statistic over OUT-edges (layers.stats.OUT_EDGE_STATS): the subgraph cannot hold it
    out_edge_stats: bool = False
    # a strategy forced by name is the engine's: a local run (no engine) would silently ignore it
    strategy: str = "auto"
    costs: PruningCosts = field(default_factory=PruningCosts)


@dataclass
class PruningChoice:
    """The chosen way (`mode`), why, and every candidate's estimated seconds (inf: cannot apply)."""

    mode: str
    reason: str
    candidates: dict[str, float]
    blockers: dict[str, str]
    frontier: Frontier
    hops: int

    def summary(self) -> dict[str, Any]:
        """JSON-safe, for Plan.pruning and the bench."""
        return {
            "mode": self.mode,
            "reason": self.reason,
            "hops": self.hops,
            "vertices": list(self.frontier.vertices),
            "in_edges": list(self.frontier.in_edges),
            "candidates": {k: (None if math.isinf(v) else round(v, 3)) for k, v in self.candidates.items()},
            "blockers": dict(self.blockers),
        }


Pricer = Callable[[PruningInputs], "tuple[float, str | None]"]
#: mode -> its pricer: (estimated seconds, None) or (inf, why it cannot run this request). A plain
#: dict like planner.strategies.STRATEGIES (the planner is a leaf: it imports nothing of sparkgnn).
PRUNINGS: dict[str, Pricer] = {}


def _register(name: str):
    def add(pricer: Pricer) -> Pricer:
        PRUNINGS[name] = pricer
        return pricer

    return add


def _lookup(name: str) -> Pricer:
    if name not in PRUNINGS:
        raise PlanError(f"unknown pruning mode {name!r}; choose one of {', '.join(PRUNINGS)}")
    return PRUNINGS[name]


def _frontier_pass(inputs: PruningInputs, hops: int) -> float:
    c = inputs.costs
    return hops * (c.hop_s + inputs.num_edges * c.scan_edge_s)


def local_edges(inputs: PruningInputs) -> list[int]:
    """Edges layer l (0-based) aggregates in a local run: the in-edges of D_(k-1-l)."""
    k = len(inputs.layers)
    return [inputs.frontier.in_edges[k - 1 - l] for l in range(k)]


def _max_width(inputs: PruningInputs) -> int:
    return max([inputs.feature_dim] + [int(layer["out_dim"]) for layer in inputs.layers])


def local_bytes(inputs: PruningInputs) -> int:
    """Driver bytes of a local run: the frontier's edges, its features and two activations."""
    k = len(inputs.layers)
    rows = inputs.frontier.vertices[k]
    return inputs.frontier.in_edges[k - 1] * EDGE_BYTES + rows * ID_BYTES + 3 * rows * _max_width(inputs) * FLOAT_BYTES


@_register(LOCAL)
def _price_local(inputs: PruningInputs) -> tuple[float, str | None]:
    if inputs.strategy != "auto":
        return math.inf, f"strategy {inputs.strategy!r} was asked for: the engine runs it, a local run has none"
    if not inputs.collected:
        return math.inf, f"the frontier's in-edges exceed the driver budget ({LOCAL_BUDGET_BYTES / 2**20:g} MiB)"
    needed = local_bytes(inputs)
    if needed > LOCAL_BUDGET_BYTES:
        return (
            math.inf,
            f"the subgraph needs ~{needed / 2**20:.0f} MiB on the driver (budget {LOCAL_BUDGET_BYTES / 2**20:g} MiB)",
        )
    c, k = inputs.costs, len(inputs.layers)
    rows = inputs.frontier.vertices[k]
    gather = rows * (inputs.feature_dim * FLOAT_BYTES + ID_BYTES) / c.collect_Bps
    stats_pass = (c.hop_s + inputs.num_edges * c.scan_edge_s) if inputs.needs_stats else 0.0
    compute = sum(local_edges(inputs)) * c.local_edge_s + sum(inputs.frontier.vertices[:k]) * c.local_row_s
    return _frontier_pass(inputs, k) + gather + stats_pass + compute, None


def subgraph_size(inputs: PruningInputs) -> tuple[int, int]:
    """(vertices, edges) of the subgraph the engine would run: (D_k, in(D_(k-1))), one hop more with
    statistics (every source's statistic then counts all its in-edges)."""
    k = len(inputs.layers) + (1 if inputs.needs_stats else 0)
    return inputs.frontier.vertices[k], inputs.frontier.in_edges[k - 1]


@_register(SUBGRAPH)
def _price_subgraph(inputs: PruningInputs) -> tuple[float, str | None]:
    hops = len(inputs.layers) + (1 if inputs.needs_stats else 0)
    if inputs.out_edge_stats:
        why = "a layer reads an out-edge statistic, and the subgraph holds in-edges only (its sources' out-edges"
        return math.inf, why + " would be partial)"
    if inputs.frontier.hops < hops:
        return math.inf, f"the frontier was computed for {inputs.frontier.hops} hop(s), the subgraph needs {hops}"
    vertices, edges = subgraph_size(inputs)
    share = edges / max(inputs.num_edges, 1)
    if share >= MOST_OF_THE_GRAPH:
        return math.inf, f"the frontier covers {share:.0%} of the edges (pruning saves little)"
    c = inputs.costs
    seconds = _frontier_pass(inputs, hops) + edges * c.prepare_edge_s + inputs.layer_seconds(max(vertices, 1), edges)
    return seconds, None


@_register(WHOLE)
def _price_whole(inputs: PruningInputs) -> tuple[float, str | None]:
    prepare = 0.0 if inputs.whole_prepared else inputs.num_edges * inputs.costs.prepare_edge_s
    return prepare + inputs.layer_seconds(inputs.num_vertices, inputs.num_edges), None


#: The `prune` argument of infer and --prune: auto (priced), off (the whole graph, no frontier pass) or
#: a registered mode by name.
PRUNE_CHOICES = ("auto", "off", *PRUNINGS)


def choose(inputs: PruningInputs, requested: str = "auto") -> PruningChoice:
    """The cheapest mode that applies (or the requested one, refused with its reason if it cannot)."""
    candidates: dict[str, float] = {}
    blockers: dict[str, str] = {}
    for name, pricer in PRUNINGS.items():
        seconds, why = pricer(inputs)
        candidates[name] = seconds
        if why:
            blockers[name] = why
    hops = len(inputs.layers)
    if requested != "auto":
        _lookup(requested)
        if requested in blockers:
            raise PlanError(f"pruning {requested!r} cannot run this request: {blockers[requested]}")
        reason = f"{requested} (requested)"
        return PruningChoice(requested, reason, candidates, blockers, inputs.frontier, hops)
    mode = min(candidates, key=lambda name: candidates[name])
    others = ", ".join(
        f"{name} {_seconds(s)}" if not math.isinf(s) else f"{name}: {blockers.get(name, 'n/a')}"
        for name, s in candidates.items()
        if name != mode
    )
    return PruningChoice(
        mode, f"{mode} est {_seconds(candidates[mode])} ({others})", candidates, blockers, inputs.frontier, hops
    )


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value >= 1 else f"{value * 1000:.0f} ms"


def frontier_ops(frontier: Frontier, hops: int, num_edges: int, on_driver: bool) -> list[Operator]:
    """The GRAPH-side pass that finds the frontier: the ids, then one semi-join of the edges per
    hop (the hop's new vertices broadcast, the edges scanned on dst)."""
    ids = Operator(
        "Scan", "GRAPH", frontier.vertices[0] * ID_BYTES, "the requested ids (D_0)", est_rows=frontier.vertices[0]
    )
    ops, previous = [ids], ids
    for j in range(min(hops, frontier.hops)):
        found = frontier.in_edges[j]
        where = "collected to the driver" if on_driver else "kept in Spark"
        join = Operator(
            "Join",
            "GRAPH",
            found * EDGE_BYTES,
            f"hop {j + 1}: edges (scan of {num_edges:,}) semi-join D_{j} on dst -> {found:,} in-edges, "
            f"D_{j + 1} = {frontier.vertices[j + 1]:,} vertices ({where})",
            children=[previous],
            est_rows=found,
            attrs={"hop": j + 1, "reads": "edges", "key": "dst"},
        )
        ops.append(join)
        previous = join
    return ops


def local_plan(choice: PruningChoice, inputs: PruningInputs) -> Plan:
    """The IR of a local pruned run: the frontier pass, the collection of the subgraph to the driver,
    and per layer a DL aggregation over exactly the in-edges it needs and the update of D_(k-l)."""
    k = len(inputs.layers)
    frontier = inputs.frontier
    ops = frontier_ops(frontier, k, inputs.num_edges, on_driver=True)
    rows = frontier.vertices[k]
    gather = Operator(
        "Collect",
        "PIPE",
        rows * (inputs.feature_dim * FLOAT_BYTES + ID_BYTES),
        f"x of D_{k} ({rows:,} vertices) to the driver as Arrow",
        children=[ops[-1]],
        est_rows=rows,
        attrs={"direction": "to_dl"},
    )
    layers = []
    previous = gather
    edges = local_edges(inputs)
    for l, info in enumerate(inputs.layers):
        dst_rows = frontier.vertices[k - 1 - l]
        aggregate = Operator(
            "LocalAggregate",
            "DL",
            0,
            f"{info['kind']} {info['aggregator']}: the {edges[l]:,} in-edges of D_{k - 1 - l} "
            f"(sources in D_{k - l}: {frontier.vertices[k - l]:,})",
            children=[previous],
            est_rows=edges[l],
            layer=l,
            attrs={"edges": edges[l]},
        )
        update = Operator(
            "ApplyVertex",
            "DL",
            dst_rows * int(info["out_dim"]) * FLOAT_BYTES,
            f"update + post ops of D_{k - 1 - l} ({dst_rows:,} vertices)",
            children=[aggregate],
            est_rows=dst_rows,
            layer=l,
        )
        layer_ops = ([*ops, gather] if l == 0 else []) + [aggregate, update]
        c = inputs.costs
        seconds = edges[l] * c.local_edge_s + dst_rows * c.local_row_s
        if l == 0:
            seconds = choice.candidates[LOCAL] - sum(
                e * c.local_edge_s + frontier.vertices[k - 1 - i] * c.local_row_s for i, e in enumerate(edges) if i
            )
        layers.append(
            LayerPlan(
                index=l,
                strategy="local",
                pre_transform=False,
                ops=layer_ops,
                estimates={"shuffle_bytes": 0, "python_bytes": 0, "passes": 0, "edges": edges[l], "seconds": seconds},
                candidates={name: s for name, s in choice.candidates.items()},
                reason=choice.reason,
                kind=str(info["kind"]),
                in_dim=int(info["in_dim"]),
                out_dim=int(info["out_dim"]),
                aggregator=str(info["aggregator"]),
            )
        )
        previous = update
    for number, op in enumerate(op for layer in layers for op in layer.ops):
        op.id = f"k{number}"
    total = {"shuffle_bytes": 0, "python_bytes": 0, "passes": 0, "seconds": choice.candidates[LOCAL]}
    return Plan(partitions=1, layers=layers, strategy="local", estimates=total, pruning=choice.summary())
