"""The node outputs link prediction reads: the batch path's (id, h) for the ids a job needs."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from sparkgnn.graph.spark_graph import Graph
from sparkgnn.models.model import Model

if TYPE_CHECKING:  # pyspark is imported inside functions only (docs/ARCHITECTURE.md)
    from pyspark.sql import DataFrame, SparkSession


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
