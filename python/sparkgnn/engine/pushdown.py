"""The Spark side of the `pushdown` strategy (planner/pushdown.py): a layer's messages formed and
aggregated by the JVM module's native aggregates, one state row per destination handed to the DL
step (aggregate=states, like combine's merge).

Per pushdown layer the previous step emits, besides the own rows, every own vertex's source payload
unrouted (step_outputs.outputs_edge_payloads, as for edge_join). Here:

  payloads (id, v)  --repartition(P, src)-->  hash join with the edges cached by hash(src)
  --> sparkgnn_<fn>(v, width[, w]) group by dst  (Spark: partial aggregate per src partition,
      shuffle of the partial buffers by dst, final merge)
  --> state rows (kind STATE, pt = owner of dst) + own rows, routed to the owners.

The edges are the prepared in_edges layout with the layer's self-loop policy applied in SQL
(SELF_LOOPS, the same semantics as layers/selfloops.py, with the loop weight prepare's gcn_degree_w
uses: the largest of a vertex's existing loop weights, else 1), repartitioned by src and persisted
once per (prepared graph, policy): later layers and later jobs of the session join them in place.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from sparkgnn.engine.prepare import read_layout
from sparkgnn.engine.routing import STATE, key_expr, partition_expr
from sparkgnn.engine.spark_compat import application_id
from sparkgnn.errors import SparkGNNError

#: Strategies whose steps need Spark's rows (unrouted payloads joined in SQL): the files exchange,
#: which carries routed rows only, cannot serve them (engine.api falls back to the shuffle).
NEEDS_SPARK_ROWS = frozenset({"edge_join", "pushdown"})


def _no_loops(edges, vertices):
    return edges


def _remaining(edges, vertices):
    """PyG's add_remaining_self_loops: every existing loop dropped, one per vertex added, weighted
    by the vertex's existing loop (the largest, as prepare's gcn_degree_w counts it) or 1."""
    loops = edges.where("src = dst").groupBy("dst").agg({"w": "max"}).withColumnRenamed("max(w)", "loop_w")
    added = vertices.join(loops, vertices.id == loops.dst, "left").selectExpr(
        "id as src", "id as dst", "cast(coalesce(loop_w, 1.0) as float) as w"
    )
    return edges.where("src != dst").unionByName(added)


def _remove(edges, vertices):
    """remove_self_loops (ChebConv's get_laplacian): every existing loop dropped, none added."""
    return edges.where("src != dst")


def _replace(edges, vertices):
    """remove_self_loops + add_self_loops (GAT): one loop of weight 1 per vertex."""
    added = vertices.selectExpr("id as src", "id as dst", "cast(1.0 as float) as w")
    return edges.where("src != dst").unionByName(added)


#: self-loop policy (layers/selfloops.py names) -> SQL over (edges(src, dst, w), vertices(id)).
SELF_LOOPS: dict[str, Callable] = {"none": _no_loops, "remaining": _remaining, "remove": _remove, "replace": _replace}

# (application, prepared dir, P, policy) -> the persisted edges; a few entries, least recently used
# out. The application is part of the key: a persisted DataFrame dies with its SparkContext.
_CACHED: OrderedDict[tuple, Any] = OrderedDict()
CACHED_LAYOUTS = 2


def cached_edges(spark, prepared, policy: str):
    """The edges of a prepared graph under `policy`, hash-partitioned by src into P partitions and
    persisted (computed by the first layer that joins them)."""
    key = (application_id(spark), prepared.path, prepared.partitions, policy)
    if key in _CACHED:
        _CACHED.move_to_end(key)
        return _CACHED[key]
    if policy not in SELF_LOOPS:
        raise SparkGNNError(f"pushdown: unknown self-loop policy {policy!r}; known: {', '.join(SELF_LOOPS)}")
    from pyspark import StorageLevel

    edges = read_layout(spark, prepared.path, "in_edges").select("src", "dst", "w")
    vertices = read_layout(spark, prepared.path, "vertices").select("id")
    frame = SELF_LOOPS[policy](edges, vertices).repartition(prepared.partitions, "src")
    frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    _CACHED[key] = frame
    while len(_CACHED) > CACHED_LAYOUTS:
        _, evicted = _CACHED.popitem(last=False)
        evicted.unpersist()
    return frame


def aggregate_op(plan, layer: int) -> dict:
    """The attrs of layer `layer`'s native-aggregate operator (function, width, weighted,
    self_loops): the plan says what the executor runs."""
    for op in plan.layers[layer].ops:
        if op.engine == "GRAPH" and op.name == "LocalAggregate" and "function" in op.attrs:
            return op.attrs
    raise SparkGNNError(f"layer {layer + 1} is planned as pushdown but its plan has no native aggregate operator")


def wire_states(spark, rows, prepared, keys, attrs: dict):
    """Own rows stay; the unrouted source payloads are aggregated per destination in Spark and the
    states routed to the destinations' owners (kind STATE), ready for routing.route."""
    partitions = prepared.partitions
    own = rows.where("kind = 0")
    payloads = rows.where("kind = 1").selectExpr("id as src", "v").repartition(partitions, "src")
    edges = cached_edges(spark, prepared, attrs["self_loops"])
    weight = ", w" if attrs["weighted"] else ""
    states = (
        edges.join(payloads.hint("shuffle_hash"), "src")
        .groupBy("dst")
        .agg(_expr(f"{attrs['function']}(v, {int(attrs['width'])}{weight})").alias("s"))
    )
    part = partition_expr("dst", partitions)
    routed = states.selectExpr(
        f"{key_expr(keys, part)} as k",
        f"cast({part} as int) as pt",
        f"{STATE} as kind",
        "dst as id",
        "cast(-1 as long) as aux",
        "cast(1.0 as float) as w",
        "s as v",
    )
    return own.unionByName(routed)


def _expr(sql: str):
    from pyspark.sql import functions

    return functions.expr(sql)


# Held while a pushdown plan runs with its own spark.sql.shuffle.partitions (shuffle_partitions).
_SHUFFLE_CONF = threading.RLock()


@contextlib.contextmanager
def shuffle_partitions(spark, plan):
    """While a plan with pushdown layers runs, Spark's aggregate shuffles into P partitions (the
    plan's), not spark.sql.shuffle.partitions (200 by default under spark-submit: 200 tiny tasks
    per layer on a small cluster). The session's own value is restored afterwards.

    The setting is the session's, not the thread's: jobs run side by side on driver threads (a
    typed round's relation jobs, engine.typed) hold a process-wide lock through it, so two
    pushdown jobs never set it under each other and the value restored is the session's own. A
    job of another strategy running meanwhile may plan its implicit shuffles with this P: only
    their task count changes, since every shuffle whose partition index matters (routing,
    ownership) names its partition count explicitly. The pushdown jobs' persisted edges
    (cached_edges, a small LRU) are used only under that lock, so none evicts another's in use."""
    if not any(layer.strategy == "pushdown" for layer in plan.layers):
        yield
        return
    key = "spark.sql.shuffle.partitions"
    with _SHUFFLE_CONF:
        before = spark.conf.get(key, None)
        spark.conf.set(key, str(plan.partitions))
        try:
            yield
        finally:
            if before is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, before)
