"""Requested ids of a typed graph answered on the driver: the typed frontier collected once, the
rounds run locally (engine.typed's `ids`, prune "auto" or "local").

    frontier   engine.typed_ids.walk with id sets held on the driver (`DriverIdSets`): per round
               ONE Spark job fetches the in-edges of every relation's newly needed destinations
               (a relation's in-edges of an id are fetched once, whichever round needs them)
    gather     ONE Spark job reads the vertex rows of every id the walk named, of every type
               (the requested ids among them: an unknown one is refused, naming it)
    rounds     pe.typed_rounds.TypedRounds (what TypedQueryEngine's full mode runs) over that
               typed subgraph: each round computes exactly the rows the next one reads, every one
               over all its in-edges, so the requested rows are the whole graph's (the typed
               serving argument: each needed row has all its in-edges and their sources' rows)
    output     the requested rows as a DataFrame (engine.typed writes them as before)

WHY: on a typed graph every relation of every round is otherwise its own homogeneous job (engine.
typed), and with a handful of requested ids each of those jobs is almost all fixed cost: its
ids checked again in Spark (a join), its frontier priced and collected, its features gathered,
its output written and checkpointed, and the rounds' merges in between -- dozens of small Spark
jobs for a few rows. Here the whole request is a few Spark jobs (one per round, one gather) and
the rounds run in process.

When: the model's relations must recompute a row from its in-edges alone (pe.typed_rounds.
check_local_rounds: no relation needing node statistics over the whole relation, none taking
several passes; else the walk would need deeper hops than one round), and what comes to the
driver must fit its budget (planner.pruning.LOCAL_BUDGET_BYTES, as a homogeneous local pruned run:
the edges at EDGE_BYTES each, the rows at their feature width). Otherwise (`collect` returns None)
the request runs through the relation jobs, each pruned by the homogeneous engine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkgnn import npsets
from sparkgnn.engine.typed_ids import MAX_EXAMPLES, check_request, ids_column, listed_ids, unknown_ids, walk
from sparkgnn.errors import SparkGNNError, UnsupportedModelError
from sparkgnn.layers.hetero import EdgeType, edge_key

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from sparkgnn.engine.executor import RunReport
    from sparkgnn.graph.typed import TypedGraphData
    from sparkgnn.graph.typed_spark import TypedGraph
    from sparkgnn.models.hetero import HeteroModel
    from sparkgnn.planner.ir import Plan

log = logging.getLogger(__name__)

#: Up to this many ids are sent to Spark as an IN list (a filter the Parquet scan pushes down);
#: more go as a broadcast semi-join.
IN_LIST_IDS = 1000
#: The key of the local run in a typed JobResult's reports and plans.
LOCAL_KEY = "local"


class _OverBudget(Exception):
    """The typed frontier outgrew the driver's budget: the request runs through the relation jobs."""


def why_not_local(model: HeteroModel) -> str | None:
    """Why the rounds of `model` cannot run on a typed frontier on the driver (module doc), or None."""
    from sparkgnn.pe.typed_rounds import check_local_rounds

    try:
        check_local_rounds(model, "typed local rounds", "its requested ids run through the relation jobs")
    except UnsupportedModelError as exc:
        return str(exc)
    return None


def _in_list(ids: np.ndarray):
    return ", ".join(str(int(i)) for i in ids)


def _where_in(frame: DataFrame, column: str, ids: np.ndarray, spark) -> DataFrame:
    """The rows of `frame` whose `column` is one of `ids` (an IN filter, or a broadcast semi-join
    for many ids)."""
    from sparkgnn.engine.khop import id_frame, semi_join

    if not len(ids):  # a type the walk needs no row of (SQL has no empty IN list)
        return frame.where("false")
    if len(ids) <= IN_LIST_IDS:
        return frame.where(f"{column} IN ({_in_list(ids)})")
    return semi_join(frame, id_frame(spark, ids), len(ids), on=column)


@dataclass
class DriverIdSets:
    """engine.typed_ids.IdSetOps over sorted numpy arrays, the relations' in-edges fetched from
    Spark one round at a time (`upstream_many`) and kept (`edges`), at most `max_edges` in all."""

    spark: Any
    graph: Any
    max_edges: int
    edges: dict[EdgeType, list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    asked: dict[EdgeType, np.ndarray] = field(default_factory=dict)  # destinations whose in-edges are kept
    fetches: int = 0  # Spark jobs run

    def total_edges(self) -> int:
        return sum(len(src) for parts in self.edges.values() for src, _ in parts)

    def upstream(self, edge_type: EdgeType, ids: np.ndarray, hops: int) -> np.ndarray:
        return self.upstream_many([(edge_type, ids, hops)])[0]

    def upstream_many(self, asks: list[tuple[EdgeType, np.ndarray, int]]) -> list[np.ndarray]:
        """Per ask, typed_ids.IdSetOps.upstream, the in-edges of the destinations not fetched before
        read in one Spark job for all the asks."""
        parts = []
        for number, (edge_type, ids, hops) in enumerate(asks):
            if hops != 1:  # why_not_local admits only one-hop relations
                raise SparkGNNError(
                    f"relation {edge_key(edge_type)}: the driver's typed walk takes one hop, not {hops}"
                )
            new = np.setdiff1d(ids, self.asked.get(edge_type, np.empty(0, np.int64)), assume_unique=True)
            if len(new):
                self.asked[edge_type] = npsets.union(self.asked.get(edge_type, np.empty(0, np.int64)), new)
                edges = self.graph.edges[edge_type].selectExpr("cast(src as long) as src", "cast(dst as long) as dst")
                parts.append(_where_in(edges, "dst", new, self.spark).selectExpr(f"{number} AS ask", "src", "dst"))
        if parts:
            frame = parts[0]
            for other in parts[1:]:
                frame = frame.unionByName(other)
            budget = self.max_edges - self.total_edges()
            table = frame.limit(budget + 1).toArrow()
            self.fetches += 1
            if table.num_rows > budget:
                raise _OverBudget(f"the typed frontier has more than {self.max_edges:,} in-edges")
            ask = table.column("ask").to_numpy()
            src, dst = (table.column(c).to_numpy().astype(np.int64, copy=False) for c in ("src", "dst"))
            for number, (edge_type, _, _) in enumerate(asks):
                mine = ask == number
                if mine.any():
                    self.edges.setdefault(edge_type, []).append((src[mine], dst[mine]))
        found = []
        for edge_type, ids, _ in asks:
            sources = [s[np.isin(d, ids)] for s, d in self.edges.get(edge_type, [])]
            upstream = npsets.unique(np.concatenate(sources)) if sources else np.empty(0, np.int64)
            found.append(upstream if edge_type[0] != edge_type[2] else npsets.union(ids, upstream))
        return found

    def union(self, sets: list[np.ndarray]) -> np.ndarray:
        return npsets.unique(np.concatenate(sets))

    def is_empty(self, ids: np.ndarray) -> bool:
        return len(ids) == 0


@dataclass
class TypedFrontier:
    """The typed frontier of a request on the driver: `requested` ({type: sorted ids}), `needs`
    (walk's, per round), `data` (the subgraph: every row the walk named, every in-edge fetched)."""

    requested: dict[str, np.ndarray]
    needs: list[dict[str, np.ndarray]]
    data: TypedGraphData
    timings: list[tuple[str, float]]
    spark_jobs: int

    def summary(self) -> dict[str, Any]:
        """What --explain and the run's plan show: vertices and in-edges gathered, ids per round."""
        return {
            "mode": "typed local",
            "vertices": int(self.data.num_nodes),
            "in_edges": int(self.data.num_edges),
            "rows_per_round": [{t: int(len(ids)) for t, ids in level.items()} for level in self.needs],
        }


def requested_arrays(spark: SparkSession, graph: TypedGraph, ids: Mapping[str, Any], max_ids: int):
    """{type: sorted unique ids} of a request (checked as engine.typed_ids.requested_sets checks
    it, but for the vertex check, which the gather makes), or None when a DataFrame of ids holds
    more than `max_ids` (the request then runs through the relation jobs)."""
    check_request(graph, ids)
    out: dict[str, np.ndarray] = {}
    for t, values in ids.items():
        if hasattr(values, "columns"):
            table = ids_column(t, values).limit(max_ids + 1).toArrow()
            if table.num_rows > max_ids:
                return None
            listed = npsets.unique(table.column("id").to_numpy().astype(np.int64, copy=False))
        else:
            listed = listed_ids(t, values)
        if len(listed) == 0:
            raise SparkGNNError(f"node type {t!r}: no ids requested (leave the type out to compute none of it)")
        out[str(t)] = listed
    return out


def collect(spark: SparkSession, graph: TypedGraph, model: HeteroModel, ids: Mapping[str, Any]) -> TypedFrontier | None:
    """The request's typed frontier on the driver (module doc), or None when it does not fit the
    driver's budget. Refuses, in one line, what engine.typed_ids refuses (bad request, unknown
    types, ids that are not vertices of their type)."""
    from sparkgnn.planner import pruning

    started = time.perf_counter()
    requested = requested_arrays(spark, graph, ids, pruning.LOCAL_BUDGET_BYTES // pruning.EDGE_BYTES)
    if requested is None:
        log.info("sparkgnn: too many requested ids for the driver: they run through the relation jobs")
        return None
    sets = DriverIdSets(spark, graph, pruning.LOCAL_BUDGET_BYTES // pruning.EDGE_BYTES)
    try:
        needs = walk(model, requested, sets)
    except _OverBudget as exc:
        log.info(f"sparkgnn: {exc}: the requested ids run through the relation jobs")
        return None
    walked = time.perf_counter()
    rows: dict[str, list[np.ndarray]] = {}
    for level in [*needs, requested]:
        for t, level_ids in level.items():
            rows.setdefault(t, []).append(level_ids)
    wanted = {t: npsets.unique(np.concatenate(parts)) for t, parts in rows.items()}
    width = {t: _feature_width(graph, t) for t in wanted}  # graph.json's (0: a type without features)
    row_bytes = sum(len(v) * (8 + 4 * width[t]) for t, v in wanted.items())
    if row_bytes + sets.total_edges() * pruning.EDGE_BYTES > pruning.LOCAL_BUDGET_BYTES:
        log.info("sparkgnn: the typed frontier's rows do not fit the driver: the ids run through the relation jobs")
        return None
    data = _gather(spark, graph, wanted, width, requested, sets)
    timings = [("frontier", walked - started), ("gather", time.perf_counter() - walked)]
    return TypedFrontier(requested, needs, data, timings, sets.fetches + 1)


def _feature_width(graph: TypedGraph, node_type: str) -> int:
    from sparkgnn.engine.typed import _feature_width as width

    return width(graph, node_type)


def _gather(spark, graph: TypedGraph, wanted: dict[str, np.ndarray], width: dict[str, int], requested, sets):
    """The typed subgraph (module doc): every type's rows at `wanted` (one Spark job), refused in
    one line when a requested id (or an edge's endpoint) has no vertex row; every fetched edge."""
    from sparkgnn.graph.typed import TypedEdges, TypedGraphData, node_table

    order = [t for t in graph.metadata()[0]]
    parts = []
    for number, t in enumerate(order):
        if t not in wanted:
            continue
        column = "x" if width[t] else "CAST(NULL AS array<float>)"
        vertices = graph.vertices[t].selectExpr("cast(id as long) as id", f"{column} AS x")
        parts.append(_where_in(vertices, "id", wanted[t], spark).selectExpr(f"{number} AS type", "id", "x"))
    table = None
    if parts:
        frame = parts[0]
        for other in parts[1:]:
            frame = frame.unionByName(other)
        table = frame.toArrow()
    nodes = {}
    for number, t in enumerate(order):
        ids = np.empty(0, np.int64)
        features: np.ndarray | None = np.zeros((0, width[t]), np.float32) if width.get(t) else None
        if table is not None and t in wanted:
            mine = (table.column("type").to_numpy() == number).nonzero()[0]
            picked = table.take(mine)
            ids = picked.column("id").to_numpy().astype(np.int64, copy=False)
            if width[t]:
                flat = picked.column("x").combine_chunks().flatten().to_numpy(zero_copy_only=False)
                features = flat.astype(np.float32, copy=False).reshape(len(ids), width[t])
            missing = npsets.setdiff(requested.get(t, np.empty(0, np.int64)), ids)
            if len(missing):
                raise unknown_ids(graph, t, len(missing), missing[:MAX_EXAMPLES].tolist())
            if len(ids) != len(wanted[t]):
                raise SparkGNNError(
                    f"graph {graph.name}: {len(wanted[t]) - len(ids)} of node type {t!r}'s rows the requested ids "
                    "read have no vertex row (edges name unknown vertices)"
                )
        nodes[t] = node_table(ids, features, name=f"{graph.name}/{t}")
    edges = {}
    for edge_type in graph.metadata()[1]:
        found = sets.edges.get(edge_type, [])
        src = np.concatenate([s for s, _ in found]) if found else np.empty(0, np.int64)
        dst = np.concatenate([d for _, d in found]) if found else np.empty(0, np.int64)
        edges[edge_type] = TypedEdges(src, dst)
    return TypedGraphData(nodes, edges, name=f"{graph.name}[typed frontier]")


def run(
    spark: SparkSession, model: HeteroModel, frontier: TypedFrontier
) -> tuple[dict[str, DataFrame], RunReport, Plan]:
    """The requested rows of every requested output type ({type: DataFrame(id, h)}, ids sorted),
    with the run's report (frontier, gather, one step per round, output) and plan (its summary)."""
    import torch

    from sparkgnn.engine.executor import RunReport, StepReport
    from sparkgnn.pe.typed_rounds import TypedRounds, UnionRows
    from sparkgnn.planner.ir import Plan

    started = time.perf_counter()
    rounds = TypedRounds(frontier.data, model)
    queries, ids_of = {}, {}
    for t, ids in frontier.requested.items():
        rows = frontier.data.nodes[t].id_index.lookup(ids)[0].astype(np.int64)
        order = np.argsort(rows)  # the rounds read sorted rows
        queries[t], ids_of[t] = rows[order], ids[order]
    prep = UnionRows(queries, {}, {})
    with torch.no_grad():
        need = rounds._needed(prep)
        values = rounds.run_rounds(prep, need, {"fetch_s": 0.0, "nodes_recomputed": 0.0})
    computed = time.perf_counter()
    frames = {}
    for t, rows in queries.items():
        have, h = values[t]
        frames[t] = _frame(spark, ids_of[t], h[torch.from_numpy(np.searchsorted(have, rows))])
    report = RunReport(final_layer=len(rounds.rounds) - 1, exchange="local")
    for label, seconds in frontier.timings:
        report.steps.append(StepReport(f"typed local {label}", seconds, None, layer=-1, estimated=False))
    report.steps.append(StepReport("typed local rounds", computed - started, None, layer=len(rounds.rounds) - 1))
    report.labels = [step.label for step in report.steps]
    plan = Plan(partitions=1, layers=[], strategy="local", pruning=frontier.summary())
    return frames, report, plan


def _frame(spark, ids: np.ndarray, h) -> DataFrame:
    """DataFrame(id long, h array<float>) of the driver's rows, through Arrow."""
    import pyarrow as pa

    values = h.contiguous().numpy().astype(np.float32, copy=False)
    offsets = pa.array(np.arange(len(ids) + 1, dtype=np.int32) * values.shape[1])
    h_column = pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1)))
    table = pa.table({"id": pa.array(ids, pa.int64()), "h": h_column})
    return spark.createDataFrame(table).selectExpr("cast(id as long) as id", "cast(h as array<float>) as h")


def explain(frontier: TypedFrontier, report: RunReport) -> str:
    """The local run's --explain lines: what was gathered, the rows per round, the seconds."""
    summary = frontier.summary()
    per_round = "; ".join(
        f"round {i}: " + ", ".join(f"{t} {n}" for t, n in sorted(level.items()))
        for i, level in enumerate(summary["rows_per_round"])
    )
    seconds = ", ".join(f"{step.label.removeprefix('typed local ')} {step.seconds:.2f} s" for step in report.steps)
    return (
        f"== sparkgnn typed plan: local rounds on the driver ==\n"
        f"{LOCAL_KEY}: typed frontier of {summary['vertices']} vertices, {summary['in_edges']} in-edges "
        f"in {frontier.spark_jobs} Spark job(s); rows read per round: {per_round}; {seconds}"
    )


__all__ = ["why_not_local", "DriverIdSets", "TypedFrontier", "collect", "run", "explain", "LOCAL_KEY", "IN_LIST_IDS"]
