"""Validation of a Spark-side graph with SQL expressions only (no pyspark import, no Python UDFs).

Why this shape: a valid graph (the common case) should cost few Spark jobs, so one aggregate
over the vertices and one over the edges count every defect at once (count_if / count DISTINCT /
higher-order `exists`), and one left-join job counts dangling endpoints. Only when a count is
non-zero does a small `limit(5)` query fetch the first offenders for the message. Wording is
shared with the numpy path through problems.py.
"""

from __future__ import annotations

from sparkgnn.graph.problems import MAX_EXAMPLES, Problem, fmt_edge, fmt_edge_weight, fmt_ids

INTEGRAL = {"tinyint", "smallint", "int", "bigint"}
NUMERIC = INTEGRAL | {"float", "double"}
VECTOR = {f"array<{t}>" for t in NUMERIC}

# column -> (accepted Spark type strings, description); see reader.py for the Arrow twin.
# Descriptions use the Arrow names so both paths word a type error the same way.
VERTEX_REQUIRED = {"id": (INTEGRAL, "int64"), "x": (VECTOR, "array<float>")}
VERTEX_OPTIONAL = {"y": (INTEGRAL, "int64"), "split": ({"string"}, "string")}
EDGE_REQUIRED = {"src": (INTEGRAL, "int64"), "dst": (INTEGRAL, "int64")}
EDGE_OPTIONAL = {"weight": (NUMERIC, "float32"), "edge_attr": (VECTOR, "array<float>")}

#: At most this many vertex ids are broadcast to the edge checks' joins (edge_problems): ~16 MB of
#: longs, a hashed relation of a few tens of MB on the driver and in every executor.
BROADCAST_IDS = 2_000_000

_INF = "CAST('Infinity' AS FLOAT)"
NONFINITE_X = f"exists(x, v -> v IS NULL OR isnan(v) OR abs(v) = {_INF})"
NONFINITE_EDGE_ATTR = f"exists(edge_attr, v -> v IS NULL OR isnan(v) OR abs(v) = {_INF})"
BAD_WEIGHT = f"(weight IS NULL OR isnan(weight) OR abs(weight) = {_INF} OR weight < 0)"
BAD_SPLIT = "(split IS NOT NULL AND split NOT IN ('train', 'val', 'test'))"


def column_defects(df, required: dict, optional: dict, what: str) -> tuple[list, list]:
    """(missing "what.col" names, "what.col is T, expected U" lines) of one DataFrame."""
    types = dict(df.dtypes)
    missing = [f"{what}.{name}" for name in required if name not in types]
    wrong = [
        f"{what}.{name} is {types[name]}, expected {desc}"
        for name, (accepted, desc) in {**required, **optional}.items()
        if name in types and types[name] not in accepted
    ]
    return missing, wrong


def _examples(df, condition: str, columns: list[str], order: tuple[str, ...] = ("id",)) -> list:
    """The smallest offenders by `order` (Spark turns orderBy + limit into a cheap top-k), the same
    rows the numpy path shows."""
    return df.where(condition).orderBy(*order).selectExpr(*columns).limit(MAX_EXAMPLES).collect()


def vertex_problems(vertices, expected_width: int | None = None) -> tuple[list[Problem], dict]:
    """Problems of a normalised vertex DataFrame (id bigint, x array<float>, [y], [split]).

    Returns (problems, facts) where facts holds num_vertices, feature_dim and num_classes for
    stats() (no second job only to count them)."""
    cols = set(vertices.columns)
    aggs = [
        "count(1) AS n",
        "count(DISTINCT id) AS distinct_ids",
        "count_if(id IS NULL) AS null_id",
        "count_if(x IS NULL) AS null_x",
        "min(CASE WHEN x IS NOT NULL THEN size(x) END) AS min_w",
        "max(CASE WHEN x IS NOT NULL THEN size(x) END) AS max_w",
        f"count_if({NONFINITE_X}) AS nonfinite",
        "count_if(y < -1) AS bad_y" if "y" in cols else "0L AS bad_y",
        f"count_if({BAD_SPLIT}) AS bad_split" if "split" in cols else "0L AS bad_split",
        "max(y) AS max_y" if "y" in cols else "CAST(NULL AS BIGINT) AS max_y",
    ]
    row = vertices.selectExpr(*aggs).collect()[0]
    problems: list[Problem] = []
    non_null_ids = row.n - row.null_id
    if row.null_id:
        problems.append(Problem("null_id", row.null_id))
    if row.distinct_ids < non_null_ids:
        dups = vertices.where("id IS NOT NULL").groupBy("id").count().where("count > 1")
        shown = dups.orderBy("id").limit(MAX_EXAMPLES).collect()
        problems.append(Problem("duplicate_id", dups.count(), tuple(f"{r.id} (x{r['count']})" for r in shown)))
    if row.null_x:
        shown = _examples(vertices, "x IS NULL", ["id"])
        problems.append(Problem("null_x", row.null_x, fmt_ids(r.id for r in shown)))
    width = expected_width
    if width is None and row.min_w is not None and row.min_w != row.max_w:
        width = (
            vertices.where("x IS NOT NULL")
            .selectExpr("size(x) AS w")
            .groupBy("w")
            .count()
            .orderBy(["count", "w"], ascending=[False, True])
            .first()
            .w
        )  # ties: smallest, like numpy
    elif width is None:
        width = row.min_w if row.min_w is not None else 0
    if row.min_w is not None and (row.min_w != width or row.max_w != width):
        condition = f"x IS NOT NULL AND size(x) != {int(width)}"
        count = vertices.where(condition).count()
        shown = _examples(vertices, condition, ["id", "size(x) AS w"])
        problems.append(Problem("x_width", count, tuple(f"id {r.id} (len {r.w})" for r in shown), detail=str(width)))
    if row.nonfinite:
        shown = _examples(vertices, NONFINITE_X, ["id"])
        problems.append(Problem("x_nonfinite", row.nonfinite, fmt_ids(r.id for r in shown)))
    if row.bad_y:
        shown = _examples(vertices, "y < -1", ["id", "y"])
        problems.append(Problem("bad_label", row.bad_y, tuple(f"id {r.id} (y={r.y})" for r in shown)))
    if row.bad_split:
        shown = _examples(vertices, BAD_SPLIT, ["id", "split"])
        problems.append(Problem("bad_split", row.bad_split, tuple(f"id {r.id} ({r.split!r})" for r in shown)))
    facts = {
        "num_vertices": row.n,
        "feature_dim": int(width or 0),
        "num_classes": int(row.max_y) + 1 if row.max_y is not None and row.max_y >= 0 else 0,  # as Graph.stats
        "unique_ids": row.distinct_ids == non_null_ids,
    }
    return problems, facts


def edge_problems(
    edges,
    vertices,
    unique_ids: bool = True,
    edge_attr_dim: int | None = None,
    dst_vertices=None,
    broadcast_ids: bool = False,
) -> tuple[list[Problem], dict]:
    """Problems of normalised edges (src, dst bigint, [weight float], [edge_attr array<float>])
    against the vertex ids (`dst_vertices`' for dst when given: a typed graph's edge type joins
    two vertex tables); edge_attr rows must all have one width (`edge_attr_dim` when graph.json
    names it, else the most common one) and finite values.

    unique_ids=False (known from vertex_problems) adds a distinct() so the joins cannot multiply
    edge rows; valid graphs skip that extra shuffle. broadcast_ids: the caller knows the ids are few
    enough (BROADCAST_IDS) for every task to hold them, so both joins are broadcast hash joins
    instead of shuffling and sorting every edge twice (Spark sizes the id column by the vertex
    files, features included, and would not broadcast it by itself)."""
    has_weight = "weight" in edges.columns
    has_attr = "edge_attr" in edges.columns
    ids = vertices.where("id IS NOT NULL").select("id")
    dst_ids = ids if dst_vertices is None else dst_vertices.where("id IS NOT NULL").select("id")
    if not unique_ids:
        ids, dst_ids = ids.distinct(), dst_ids.distinct()
    if broadcast_ids:
        ids, dst_ids = ids.hint("broadcast"), dst_ids.hint("broadcast")
    flagged = edges.join(ids.selectExpr("id AS src", "true AS src_ok"), "src", "left").join(
        dst_ids.selectExpr("id AS dst", "true AS dst_ok"), "dst", "left"
    )
    row = flagged.selectExpr(
        "count(1) AS n",
        "count_if(src IS NULL OR dst IS NULL) AS null_endpoint",
        "count_if(src IS NOT NULL AND src_ok IS NULL) AS dangling_src",
        "count_if(dst IS NOT NULL AND dst_ok IS NULL) AS dangling_dst",
        f"count_if({BAD_WEIGHT}) AS bad_weight" if has_weight else "0L AS bad_weight",
        "count_if(edge_attr IS NULL) AS null_attr" if has_attr else "0L AS null_attr",
        "min(size(edge_attr)) AS min_a" if has_attr else "CAST(NULL AS INT) AS min_a",
        "max(size(edge_attr)) AS max_a" if has_attr else "CAST(NULL AS INT) AS max_a",
        f"count_if({NONFINITE_EDGE_ATTR}) AS nonfinite_attr" if has_attr else "0L AS nonfinite_attr",
    ).collect()[0]
    problems: list[Problem] = []
    if row.null_endpoint:
        shown = _examples(edges, "src IS NULL OR dst IS NULL", ["src", "dst"], ("src", "dst"))
        problems.append(Problem("null_endpoint", row.null_endpoint, tuple(fmt_edge(r.src, r.dst) for r in shown)))
    for kind, condition in (
        ("dangling_src", "src IS NOT NULL AND src_ok IS NULL"),
        ("dangling_dst", "dst IS NOT NULL AND dst_ok IS NULL"),
    ):
        if row[kind]:
            shown = _examples(flagged, condition, ["src", "dst"], ("src", "dst"))
            problems.append(Problem(kind, row[kind], tuple(fmt_edge(r.src, r.dst) for r in shown)))
    if row.bad_weight:
        shown = _examples(edges, BAD_WEIGHT, ["src", "dst", "weight"], ("src", "dst"))
        problems.append(
            Problem("bad_weight", row.bad_weight, tuple(fmt_edge_weight(r.src, r.dst, r.weight) for r in shown))
        )
    if has_attr:
        problems += _edge_attr_problems(edges, row, edge_attr_dim)
    facts = {"num_edges": row.n}
    if has_attr:
        facts["edge_attr_dim"] = int(edge_attr_dim or row.min_a or 0)
    return problems, facts


def _edge_attr_problems(edges, row, expected: int | None) -> list[Problem]:
    """Null, ragged and non-finite edge_attr vectors, worded as the numpy reader words them."""
    problems: list[Problem] = []
    if row.null_attr:
        shown = _examples(edges, "edge_attr IS NULL", ["src", "dst"], ("src", "dst"))
        problems.append(Problem("null_edge_attr", row.null_attr, tuple(fmt_edge(r.src, r.dst) for r in shown)))
    width = expected
    if width is None and row.min_a is not None and row.min_a != row.max_a:
        width = (
            edges.where("edge_attr IS NOT NULL")
            .selectExpr("size(edge_attr) AS w")
            .groupBy("w")
            .count()
            .orderBy(["count", "w"], ascending=[False, True])
            .first()
            .w
        )
    elif width is None:
        width = row.min_a if row.min_a is not None else 0
    if row.min_a is not None and (row.min_a != width or row.max_a != width):
        condition = f"edge_attr IS NOT NULL AND size(edge_attr) != {int(width)}"
        shown = _examples(edges, condition, ["src", "dst", "size(edge_attr) AS w"], ("src", "dst"))
        problems.append(
            Problem(
                "edge_attr_width",
                edges.where(condition).count(),
                tuple(f"{fmt_edge(r.src, r.dst)} (len {r.w})" for r in shown),
                detail=str(width),
            )
        )
    if row.nonfinite_attr:
        shown = _examples(edges, NONFINITE_EDGE_ATTR, ["src", "dst"], ("src", "dst"))
        problems.append(
            Problem("edge_attr_nonfinite", row.nonfinite_attr, tuple(fmt_edge(r.src, r.dst) for r in shown))
        )
    return problems
