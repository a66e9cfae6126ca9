"""The node outputs link prediction reads: the batch path's (id, h) for the ids a job needs."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from sparkgnn.graph.spark_graph import Graph
from sparkgnn.models.model import Model

if TYPE_CHECKING:  # pyspark is imported inside functions only (docs/ARCHITECTURE.md)
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

# Pairs whose distinct ids are at least this share of the vertices get every vertex's output
# (infer without ids): the requested rows alone are then most of the graph before their k-hop
# upstream adds more, so computing the frontier (one pass over the edges per hop, about a layer's
# time) and pruning to it would cost more than the few rows it leaves out.
WHOLE_SHARE = 0.5


def node_outputs(
    spark: SparkSession,
    graph: Graph,
    model: Model,
    *,
    ids: DataFrame | None = None,
    out: str | None = None,
    partitions: int | None = None,
    strategy: str = "auto",
    work_dir: str | None = None,
) -> DataFrame:
    """(id, h) from sparkgnn.infer; `ids` (an `id` column) prunes to their k-hop neighbourhoods
    (infer's `prune="auto"`), None computes every vertex. `out`: the job's output, beside which the
    default work dir lies (infer writes nothing there)."""
    work = work_dir
    if work is None and out is not None:
        head = os.path.dirname(os.path.abspath(out)) if "://" not in out else out.rstrip("/").rpartition("/")[0]
        work = f"{head}/_sparkgnn_work"
    from sparkgnn import infer

    job = infer(spark, graph, model, ids=ids, partitions=partitions, strategy=strategy, work_dir=work)
    return job.frame.select("id", "h")


def pairs_cover_graph(pairs: DataFrame, *, pair_count: int, num_vertices: int) -> bool:
    """Whether the pairs' (src, dst) distinct ids reach WHOLE_SHARE of the `num_vertices` vertices
    (then a job computes every vertex rather than the ids' pruned neighbourhoods); logs the choice.
    Fewer than WHOLE_SHARE x num_vertices / 2 pairs cannot reach it and cost no Spark job; otherwise
    one pass over the pairs counts their distinct ids approximately (HyperLogLog, 2% error)."""
    from pyspark.sql import functions as F

    wanted = WHOLE_SHARE * num_vertices
    if 2 * pair_count < wanted:
        log.info(
            f"score_edges: {pair_count:,} pairs name at most {2 * pair_count:,} of {num_vertices:,} vertices: "
            "only their k-hop neighbourhoods are computed"
        )
        return False
    started = time.perf_counter()
    ends = pairs.select(F.explode(F.array("src", "dst")).alias("id"))
    distinct = int(ends.agg(F.approx_count_distinct("id", 0.02).alias("n")).collect()[0]["n"])
    whole = distinct >= wanted
    log.info(
        f"score_edges: the pairs name ~{distinct:,} distinct ids of {num_vertices:,} vertices (counted in "
        f"{time.perf_counter() - started:.1f} s): "
        + ("every vertex is computed, no frontier or pruning" if whole else "only their k-hop neighbourhoods")
    )
    return whole
