"""The upstream neighbourhood of requested vertices, hop by hop (issue 18, inference for a subset).

Why: with `ids`, a k-layer model needs h^k only at the ids, hence h^(k-1) only at the ids and their
in-neighbours, ..., and x only within k hops upstream. D_0 = ids and D_(j+1) = D_j plus the sources
of D_j's in-edges; layer l (1..k) then has to produce h^l for D_(k-l) from D_(k-l)'s in-edges,
whose sources are in D_(k-l+1). On a large graph and a small request these sets are a sliver of the
graph, so a plan that runs each layer over them (instead of over every vertex, filtering the output
at the end) does a sliver of the work.

This module computes the sets with Spark joins (a GRAPH-side pass: each hop is one semi-join of the
edges with the frontier, the frontier broadcast while it is small) and counts them, which is what
the planner needs to price a pruned plan against the whole graph. Nothing here is collected to the
driver but the counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkgnn.errors import SparkGNNError

#: A frontier with at most this many vertices is broadcast to the edge scan (a map-side semi-join,
#: no shuffle of the edges); larger ones are joined with a shuffle.
BROADCAST_ROWS = 2_000_000


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


def _semi_join(edges, frontier, size: int):
    """The edges whose destination is in `frontier` (DataFrame(id) of `size` rows)."""
    from pyspark.sql import functions

    side = functions.broadcast(frontier) if size <= BROADCAST_ROWS else frontier
    return edges.join(side.withColumnRenamed("id", "dst"), "dst", "left_semi")


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
        incoming = _semi_join(edges, current, frontier.sizes[-1]).persist(StorageLevel.MEMORY_AND_DISK)
        frontier.in_edges.append(incoming.count())
        widened = current.unionByName(incoming.selectExpr("src as id")).distinct()
        current = widened.persist(StorageLevel.MEMORY_AND_DISK)
        frontier.sets.append(current)
        frontier.sizes.append(current.count())
        incoming.unpersist()
    return frontier
