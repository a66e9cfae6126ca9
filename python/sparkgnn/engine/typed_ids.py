"""Requested ids on a typed graph: which vertices of which type each round of a typed model must
give (the typed k-hop walk), and the requested ids themselves, checked.

Why: with `ids={node type: ids}`, the last round needs values only at those ids, so it needs each
relation's in-neighbours of them (and the ids' own rows: a conv's root term), and so on back to the
input features. `walk` goes back round by round: for a relation (s, r, d) of round i whose
destination type d has needed ids N[i+1][d], the round's input must hold

    s == d   the relation's `hops` upstream of N[i+1][d] within the relation (engine.khop.upstream:
             one hop per engine pass of the conv, plus one when it reads a per-vertex statistic,
             whose value needs every in-edge of the vertex it is read at; the ids included)
    s != d   the sources of N[i+1][d]'s in-edges (type s) and N[i+1][d] itself (type d)

and a type the round keeps (node ops only) needs its own ids. Each relation job then runs with the
relation graph cut to the needed rows and `ids` = N[i+1][d], so the homogeneous engine prunes it
again with its own planner (engine.pruned: on the driver, a pruned subgraph or the whole relation
graph). The hops are the homogeneous engine's own (pruned.py): a set this walk gives is a superset
of what that relation's pruned run reads, so each requested row is exact.

`walk` is generic over the id-set type (`IdSetOps`): Spark DataFrames in a job (`SparkIdSets`),
plain Python sets in the unit tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from sparkgnn import npsets
from sparkgnn.engine.khop import id_frame
from sparkgnn.errors import GraphValidationError, SparkGNNError
from sparkgnn.layers.hetero import EdgeType
from sparkgnn.layers.phases import expand_passes

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from sparkgnn.models.hetero import HeteroModel

S = TypeVar("S")
#: How many offending ids an unknown-id refusal names.
MAX_EXAMPLES = 5


def relation_hops(edge_type: EdgeType, conv: Any) -> int:
    """How far upstream (within the relation) a relation's conv reads for one destination row:
    1 between two types; within one type one hop per engine pass, plus one for a statistic."""
    if edge_type[0] != edge_type[2]:
        return 1
    return len(expand_passes(conv)) + (1 if conv.required_stats else 0)


class IdSetOps(Protocol[S]):
    """The three set operations the walk needs, over whatever holds a set of ids."""

    def upstream(self, edge_type: EdgeType, ids: S, hops: int) -> S:
        """Within one type: the ids plus everything `hops` hops upstream over the relation's edges.
        Between two types: the source-type ids of the in-edges of `ids` (hops is 1)."""
        ...

    def union(self, sets: list[S]) -> S: ...

    # Optional: `upstream_many(asks)`, [upstream(*ask) for ask in asks] in one go (the ops that
    # fetch edges from Spark answer a round's relations with one job); `walk` uses it when present.

    def is_empty(self, ids: S) -> bool: ...


def walk(model: HeteroModel, requested: Mapping[str, S], ops: IdSetOps[S]) -> list[dict[str, S]]:
    """`needs[i][t]`: the ids of type t whose value round i's input must hold (needs[0]: the
    input features read; needs[R] = `requested`, R the number of rounds). A type absent from
    needs[i] is not read there. `requested` must name output types of the model (refused in one
    line otherwise)."""
    unknown = sorted(t for t in requested if t not in model.outputs)
    if unknown:
        raise SparkGNNError(
            f"ids name node types {unknown} that are not outputs of the model (it gives {model.outputs})"
        )
    rounds = model.round_list()
    needs: list[dict[str, S]] = [{} for _ in range(len(rounds) + 1)]
    needs[-1] = {t: ids for t, ids in requested.items() if not ops.is_empty(ids)}
    for index in range(len(rounds) - 1, -1, -1):
        rnd, after = rounds[index], needs[index + 1]
        parts: dict[str, list[S]] = {}
        asks = [(et, after[et[2]], relation_hops(et, conv)) for et, conv in rnd.conv_items() if et[2] in after]
        many = getattr(ops, "upstream_many", None)  # one pass for the round's relations, where the ops have it
        found = many(asks) if many is not None else [ops.upstream(*ask) for ask in asks]
        for (edge_type, _, _), upstream in zip(asks, found, strict=True):
            s, _, d = edge_type
            parts.setdefault(s, []).append(upstream)
            if s != d:
                parts.setdefault(d, []).append(after[d])
        for t in rnd.keep:
            if t in after:
                parts.setdefault(t, []).append(after[t])
        needs[index] = {t: ops.union(sets) if len(sets) > 1 else sets[0] for t, sets in parts.items()}
    return needs


@dataclass
class IdSet:
    """A set of ids in Spark (DataFrame(id long), persisted) and its row count."""

    frame: DataFrame
    size: int


@dataclass
class SparkIdSets:
    """IdSetOps over Spark: `edges(edge_type)` gives a relation's (src, dst) DataFrame; every set
    made is persisted and counted (the counts are what --explain shows), and `release` unpersists
    them once the job has used them."""

    edges: Callable[[EdgeType], DataFrame]
    made: list[Any] = field(default_factory=list)

    def keep(self, frame: DataFrame) -> IdSet:
        """`frame` (an `id` column) persisted, counted and released with the others."""
        from pyspark import StorageLevel

        frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
        self.made.append(frame)
        return IdSet(frame, frame.count())

    def upstream(self, edge_type: EdgeType, ids: IdSet, hops: int) -> IdSet:
        from sparkgnn.engine import khop

        edges = self.edges(edge_type).selectExpr("cast(src as long) as src", "cast(dst as long) as dst")
        if edge_type[0] == edge_type[2]:
            frontier = khop.upstream(ids.frame, edges, hops)
            self.made.extend(frontier.sets)
            return IdSet(frontier.sets[-1], frontier.sizes[-1])
        return self.keep(khop.semi_join(edges, ids.frame, ids.size).selectExpr("src AS id").distinct())

    def union(self, sets: list[IdSet]) -> IdSet:
        frame = sets[0].frame
        for other in sets[1:]:
            frame = frame.unionByName(other.frame)
        return self.keep(frame.distinct())

    def is_empty(self, ids: IdSet) -> bool:
        return ids.size == 0

    def release(self) -> None:
        for frame in self.made:
            frame.unpersist()
        self.made.clear()


def requested_sets(spark: SparkSession, graph: Any, ids: Any, sets: SparkIdSets) -> dict[str, IdSet]:
    """The requested typed ids ({node type: ids or a DataFrame with an `id` column}) as checked
    IdSets: refused in one line when not such a dict, when a type is not the graph's, when a
    type's ids are empty or when any id is not a vertex of its type (count and first offenders)."""
    check_request(graph, ids)
    out: dict[str, IdSet] = {}
    for t, values in ids.items():
        frame = id_frame(spark, listed_ids(t, values)) if not hasattr(values, "columns") else ids_column(t, values)
        requested = sets.keep(frame)
        if requested.size == 0:
            raise SparkGNNError(f"node type {t!r}: no ids requested (leave the type out to compute none of it)")
        missing = requested.frame.join(graph.vertices[t].select("id"), "id", "left_anti")
        first = [row.id for row in missing.orderBy("id").limit(MAX_EXAMPLES).collect()]
        if first:
            raise unknown_ids(graph, t, missing.count() if len(first) == MAX_EXAMPLES else len(first), first)
        out[str(t)] = requested
    return out


def check_request(graph: Any, ids: Any) -> None:
    """Refuse (SparkGNNError, one line) typed ids that are not a non-empty dict {node type: ids}
    or that name a node type the graph does not have."""
    if not isinstance(ids, Mapping) or not ids:
        raise SparkGNNError(
            "ids on a typed graph are a non-empty dict {node type: ids} (batch_inference: --ids type:id,...)"
        )
    unknown = sorted(str(t) for t in ids if t not in graph.vertices)
    if unknown:
        raise SparkGNNError(f"ids name node types {unknown} that graph {graph.name!r} does not have")


def listed_ids(node_type: str, values: Any) -> np.ndarray:
    """A type's requested ids given as integers, sorted and unique (refused in one line when one
    is not a 64-bit integer)."""
    try:
        return npsets.unique(np.asarray([int(i) for i in values], dtype=np.int64))
    except (TypeError, ValueError, OverflowError):
        raise SparkGNNError(f"node type {node_type!r}: ids must be 64-bit integers") from None


def ids_column(node_type: str, frame: DataFrame) -> DataFrame:
    """A type's requested ids given as a DataFrame: its `id` column as longs, distinct (refused in
    one line without one)."""
    if "id" not in frame.columns:
        raise SparkGNNError(f"node type {node_type!r}: the ids DataFrame needs an 'id' column")
    return frame.selectExpr("cast(id as long) as id").distinct()


def unknown_ids(graph: Any, node_type: str, count: int, first: list[int]) -> GraphValidationError:
    """The one-line refusal of `count` requested ids of `node_type` that are not its vertices
    (`first`: the smallest few)."""
    return GraphValidationError(
        f"graph {graph.name}: {count} requested id(s) of node type {node_type!r} are not vertices of that type "
        f"(e.g. {', '.join(str(i) for i in first[:MAX_EXAMPLES])})"
    )


def parse_typed_ids(text: str) -> dict[str, list[int]]:
    """`type:id,type:id,...` (or the same one pair per line) as {node type: ids}, refused in one
    line naming the bad item (batch_inference's --ids on a typed graph)."""
    out: dict[str, list[int]] = {}
    items = [item.strip() for line in text.splitlines() for item in line.split(",")]
    for item in items:
        if not item or item.startswith("#"):
            continue
        node_type, sep, value = item.rpartition(":")
        if not sep or not node_type.strip():
            raise SparkGNNError(f"typed id {item!r} is not type:id (e.g. paper:42)")
        try:
            number = int(value)
        except ValueError:
            raise SparkGNNError(f"typed id {item!r}: {value!r} is not an integer id") from None
        if not -(1 << 63) <= number < (1 << 63):
            raise SparkGNNError(f"typed id {item!r}: {number} does not fit a 64-bit vertex id")
        out.setdefault(node_type.strip(), []).append(number)
    if not out:
        raise SparkGNNError("--ids names no typed id (type:id,... or a file of them); omit --ids to infer every vertex")
    return out


__all__ = [
    "relation_hops",
    "walk",
    "IdSetOps",
    "IdSet",
    "SparkIdSets",
    "requested_sets",
    "check_request",
    "listed_ids",
    "ids_column",
    "unknown_ids",
    "parse_typed_ids",
]
