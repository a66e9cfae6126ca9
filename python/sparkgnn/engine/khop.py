"""The upstream neighbourhood of requested vertices, hop by hop (inference for a subset of ids).

Why: with `ids`, a k-layer model needs h^k only at the ids, hence h^(k-1) only at the ids and their
in-neighbours, ..., and x only within k hops upstream. D_0 = ids and D_(j+1) = D_j plus the sources
of D_j's in-edges; layer l (1..k) then has to produce h^l for D_(k-l) from D_(k-l)'s in-edges,
whose sources are in D_(k-l+1). On a large graph and a small request these sets are a sliver of the
graph, so a plan that runs each layer over them (instead of over every vertex, filtering the output
at the end) does a sliver of the work.

This module computes the sets with Spark joins (a GRAPH-side pass: each hop is one semi-join of the
edges with the frontier, the frontier broadcast while it is small) and counts them, which is what
the planner needs to price a pruned plan against the whole graph (`upstream`: nothing collected to
the driver but the counts), or collects them to the driver while they fit its budget
(`collect_upstream`: one job per hop, the frontier's edges themselves).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sparkgnn import npsets
from sparkgnn.errors import SparkGNNError

#: A frontier with at most this many vertices is broadcast to the edge scan (a map-side semi-join,
#: no shuffle of the edges); larger ones are joined with a shuffle.
BROADCAST_ROWS = 2_000_000

#: Ids held on the driver, up to this many, select rows with an `IN` filter (semi_join_ids): one
#: Spark job, pushed down to the Parquet reader, where a broadcast semi-join runs a job of its own
#: to build the broadcast first. Past it the literal list would bloat every task's plan.
IN_FILTER_IDS = 4096


@dataclass
class Frontier:
    """`sets[j]`: DataFrame(id) of the vertices within j hops upstream of the ids (sets[0]: the ids),
    persisted; `sizes[j]` its row count; `in_edges[j]` the count of edges whose destination is in
    sets[j] (the edges a layer producing h for sets[j] aggregates), for j < hops."""

    sets: list = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    in_edges: list[int] = field(default_factory=list)

    def unpersist(self) -> None:
        for frame in self.sets:
            frame.unpersist()


def semi_join(edges, frontier, size: int, on: str = "dst"):
    """The edges whose destination (`on="src"`: source) is in `frontier` (DataFrame(id) of `size` rows)."""
    from pyspark.sql import functions

    side = functions.broadcast(frontier) if size <= BROADCAST_ROWS else frontier
    return edges.join(side.withColumnRenamed("id", on), on, "left_semi")


def semi_join_ids(spark, rows, ids: np.ndarray, on: str = "dst"):
    """The rows of `rows` whose column `on` is one of the driver's `ids` (distinct int64): an `IN`
    filter up to IN_FILTER_IDS ids (no broadcast job), else `semi_join` with the ids as a frame."""
    if len(ids) <= IN_FILTER_IDS:
        from pyspark.sql import functions

        return rows.where(functions.col(on).isin([int(v) for v in ids]))
    return semi_join(rows, id_frame(spark, ids), len(ids), on=on)


def upstream(ids, edges, hops: int) -> Frontier:
    """The frontier of `ids` (DataFrame with an `id` column) over `edges` (src, dst) for `hops`
    hops: sets[0..hops], their sizes and the in-edge counts of sets[0..hops-1]."""
    if hops < 0:
        raise SparkGNNError(f"hops must be >= 0, got {hops}")
    from pyspark import StorageLevel

    edges = edges.selectExpr("cast(src as long) as src", "cast(dst as long) as dst")
    current = ids.selectExpr("cast(id as long) as id").distinct().persist(StorageLevel.MEMORY_AND_DISK)
    frontier = Frontier(sets=[current], sizes=[current.count()])
    for _ in range(hops):
        incoming = semi_join(edges, current, frontier.sizes[-1]).persist(StorageLevel.MEMORY_AND_DISK)
        frontier.in_edges.append(incoming.count())
        widened = current.unionByName(incoming.selectExpr("src as id")).distinct()
        current = widened.persist(StorageLevel.MEMORY_AND_DISK)
        frontier.sets.append(current)
        frontier.sizes.append(current.count())
        incoming.unpersist()
    return frontier


@dataclass
class CollectedFrontier:
    """The frontier brought to the driver, for a pruned run small enough to do there (engine.pruned).

    `order`: every vertex of D_hops, D_0 first, then D_1 \\ D_0, D_2 \\ D_1, ... so that D_j is the
    prefix order[:sizes[j]] (a layer producing h for D_j reads rows [0, sizes[j+1]) and writes rows
    [0, sizes[j])). `src`, `dst`: positions in `order` of the in-edges of D_(hops-1), grouped by the
    hop that found them, so the in-edges of D_j are the first in_edges[j] of them; `weight` their
    weights (None without a weight column)."""

    order: np.ndarray
    sizes: list[int]
    in_edges: list[int]
    src: np.ndarray
    dst: np.ndarray
    weight: np.ndarray | None

    @property
    def hops(self) -> int:
        return len(self.sizes) - 1

    def edge_rows(self, hops: int) -> dict[str, np.ndarray]:
        """The in-edges of D_(hops-1) as ids (src, dst int64[, weight float32]): the edges of the
        pruned subgraph of `hops` hops (engine.pruned.run_subgraph), as the edges table holds them."""
        count = self.in_edges[hops - 1]
        rows = {"src": self.order[self.src[:count]], "dst": self.order[self.dst[:count]]}
        if self.weight is not None:
            rows["weight"] = self.weight[:count]
        return rows


def id_frame(spark, ids: np.ndarray):
    """DataFrame(id long) of the driver's `ids` (Arrow: no per-row Python objects)."""
    import pyarrow as pa

    return spark.createDataFrame(pa.table({"id": pa.array(ids, pa.int64())}))


def collect_upstream(spark, ids: np.ndarray, edges, hops: int, max_edges: int) -> CollectedFrontier | None:
    """The frontier of `ids` over `edges` (src, dst[, weight]) for `hops` hops, collected: one
    semi-join per hop with only the vertices the previous hop added (their in-edges are the new
    ones; semi_join_ids: one Spark job per hop), at most `max_edges` + 1 edge rows collected per
    hop. None as soon as the in-edges exceed `max_edges` (the caller then plans without the
    driver: a pruned subgraph from Spark's sets, or the whole graph)."""
    if hops < 0:
        raise SparkGNNError(f"hops must be >= 0, got {hops}")
    columns = ["src", "dst"] + (["weight"] if "weight" in edges.columns else [])
    order = npsets.unique(np.asarray(ids, dtype=np.int64))
    sizes: list[int] = [len(order)]
    in_edges: list[int] = []
    parts_src, parts_dst, parts_w = [], [], []
    added = order
    for _ in range(hops):
        found = 0
        if len(added):
            budget = max_edges - (in_edges[-1] if in_edges else 0)
            incoming = semi_join_ids(spark, edges, added)
            table = incoming.select(*columns).limit(budget + 1).toArrow()
            if table.num_rows > budget:
                return None
            found = table.num_rows
            parts_src.append(table.column("src").to_numpy().astype(np.int64, copy=False))
            parts_dst.append(table.column("dst").to_numpy().astype(np.int64, copy=False))
            if "weight" in columns:
                parts_w.append(table.column("weight").to_numpy().astype(np.float32, copy=False))
        in_edges.append((in_edges[-1] if in_edges else 0) + found)
        sources = np.concatenate(parts_src[-1:]) if found else np.empty(0, np.int64)
        added = np.setdiff1d(npsets.unique(sources), order, assume_unique=True)
        order = np.concatenate([order, added])
        sizes.append(len(order))
    src = np.concatenate(parts_src) if parts_src else np.empty(0, np.int64)
    dst = np.concatenate(parts_dst) if parts_dst else np.empty(0, np.int64)
    position = positions(order)
    weight = (np.concatenate(parts_w) if parts_w else np.empty(0, np.float32)) if "weight" in columns else None
    return CollectedFrontier(order, sizes, in_edges, position(src), position(dst), weight)


def positions(order: np.ndarray):
    """id -> position in `order` (every id looked up is in it)."""
    sorter = np.argsort(order, kind="stable")
    ordered = order[sorter]
    return lambda values: sorter[np.searchsorted(ordered, values)]
