"""Per-vertex statistics (layers/stats.py) of some vertices, computed in Spark over ALL their in-edges.

Why: a pruned run (engine.pruned) holds only the in-edges of the vertices it updates, but a layer
such as GCN scales every message by its SOURCE's degree, and the sources at the frontier's rim have
their in-edges outside the pruned subgraph. Their statistic must still be the whole graph's, so it is
aggregated here over the edges whose destination is in the set (one broadcast semi-join and a
group-by), with the same SQL semantics as prepare's `gcn_degree` (engine/prepare.py: existing self
loops keep their largest weight, a missing one counts 1). Each statistic is one registered SQL
aggregate plus the value of a vertex without in-edges; names are layers/stats.py's.
"""

from __future__ import annotations

import numpy as np

from sparkgnn.errors import SparkGNNError
from sparkgnn.registry import Registry

#: name -> (aggregate SQL over (src, dst, w) grouped by dst, the value of a vertex with no in-edge).
SPARK_STATS: Registry[tuple[str, float]] = Registry("node statistic", SparkGNNError)
SPARK_STATS.register("in_degree", ("cast(count(1) as double)", 0.0))
SPARK_STATS.register("weighted_in_degree", ("sum(w)", 0.0))
SPARK_STATS.register(
    "gcn_degree",
    (
        "coalesce(sum(case when src != dst then w end), 0.0) + coalesce(max(case when src = dst then w end), 1.0)",
        1.0,
    ),
)


def stats_of(spark, edges, order: np.ndarray, names) -> dict[str, np.ndarray]:
    """{name: float32[len(order)]} aligned with `order` (distinct vertex ids), over every in-edge
    of those vertices in `edges` (src, dst[, weight]: a missing weight counts 1, as prepare's)."""
    from sparkgnn.engine.khop import id_frame, positions, semi_join

    names = list(dict.fromkeys(names))
    if not names:
        return {}
    sql = {name: SPARK_STATS.lookup(name) for name in names}
    weight = "cast(weight as double)" if "weight" in edges.columns else "cast(1.0 as double)"
    incoming = semi_join(edges, id_frame(spark, order), len(order)).selectExpr("src", "dst", f"{weight} as w")
    table = incoming.groupBy("dst").agg(*[_expr(expr, name) for name, (expr, _) in sql.items()]).toArrow()
    where = positions(order)(table.column("dst").to_numpy())
    out = {}
    for name, (_, empty) in sql.items():
        values = np.full(len(order), empty, dtype=np.float64)
        values[where] = table.column(name).to_numpy()
        out[name] = values.astype(np.float32)
    return out


def _expr(sql: str, name: str):
    from pyspark.sql import functions

    return functions.expr(sql).alias(name)
