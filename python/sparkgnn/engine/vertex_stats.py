"""Per-vertex statistics (layers/stats.py) of some vertices, computed in Spark over ALL their in-edges.

Why: a pruned run (engine.pruned) holds only the in-edges of the vertices it updates, but a layer
such as GCN scales every message by its SOURCE's degree, and the sources at the frontier's rim have
their in-edges outside the pruned subgraph. Their statistic must still be the whole graph's, so it is
aggregated here over the edges whose destination is in the set (one semi-join, engine.khop.
semi_join_ids: an IN filter for a small set, else the set broadcast, and a group-by; the out-edge
statistics, ChebConv's degree, over the edges whose SOURCE is in the set), with prepare's own SQL
(engine.degrees.stat_sql). Each statistic is one SQL aggregate
plus the value of a vertex without in-edges, asked for by its key (sparkgnn.stat_keys: the name of
layers/stats.py, `_w` where the edge weights count).
"""

from __future__ import annotations

import numpy as np

from sparkgnn.engine.degrees import is_out_stat, stat_sql
from sparkgnn.errors import SparkGNNError


def stats_of(spark, edges, order: np.ndarray, keys) -> dict[str, np.ndarray]:
    """{key: float32[len(order)]} aligned with `order` (distinct vertex ids) for statistic keys
    (sparkgnn.stat_keys), over every in-edge of those vertices in `edges` (src, dst[, weight]: a
    missing weight counts 1, as prepare's)."""
    from sparkgnn.engine.khop import positions, semi_join_ids

    keys = list(dict.fromkeys(keys))
    if not keys:
        return {}
    try:
        sql = {key: stat_sql(key) for key in keys}
    except ValueError as e:
        raise SparkGNNError(str(e)) from None
    weight = "cast(weight as double)" if "weight" in edges.columns else "cast(1.0 as double)"
    out = {}
    for side in ("dst", "src"):  # in-edge statistics by destination, out-edge ones by source
        mine = {key: q for key, q in sql.items() if is_out_stat(key) == (side == "src")}
        if not mine:
            continue
        rows = semi_join_ids(spark, edges, order, on=side).selectExpr("src", "dst", f"{weight} as w")
        table = rows.groupBy(side).agg(*[_expr(expr, name) for name, (expr, _) in mine.items()]).toArrow()
        where = positions(order)(table.column(side).to_numpy())
        for name, (_, empty) in mine.items():
            values = np.full(len(order), empty, dtype=np.float64)
            values[where] = table.column(name).to_numpy()
            out[name] = values.astype(np.float32)
    return {key: out[key] for key in keys}


def _expr(sql: str, name: str):
    from pyspark.sql import functions

    return functions.expr(sql).alias(name)
