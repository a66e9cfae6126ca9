"""Helpers for the graph tests (a uniquely named module: every test folder has a conftest.py)."""

import os

import pyarrow as pa
import pyarrow.parquet as pq


def write_raw(
    path, vertices: dict, edges: dict, vertex_types: dict | None = None, edge_types: dict | None = None
) -> str:
    """Write vertices/edges Parquet exactly as given (no validation), like a foreign tool would."""
    for folder, columns, types in (("vertices", vertices, vertex_types or {}), ("edges", edges, edge_types or {})):
        os.makedirs(os.path.join(path, folder), exist_ok=True)
        table = pa.table({k: pa.array(v, type=types.get(k)) for k, v in columns.items()})
        pq.write_table(table, os.path.join(path, folder, "part-00000.parquet"))
    return str(path)


NAN, INF = float("nan"), float("inf")
GOOD_X = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]
GOOD_VERTICES = {"id": [1, 2, 3, 4], "x": GOOD_X}
GOOD_EDGES = {"src": [1, 2, 3], "dst": [2, 3, 4]}

# name -> (vertices, edges, arrow types, exact lines the error must contain). Both the numpy
# (read_graph_dir) and the Spark (Graph.validate) path must produce these same lines.
BROKEN = {
    "duplicate_ids": (
        {"id": [1, 2, 2, 3, 3, 3, 4], "x": [[0.0, 0.0]] * 7},
        GOOD_EDGES,
        {},
        ["2 vertex ids appear more than once; first: 2 (x2), 3 (x3)"],
    ),
    "dangling_dst": (
        GOOD_VERTICES,
        {"src": [4, 1, 2, 3], "dst": [998, 2, 999, 4]},
        {},
        ["2 edges have a dst that is not a vertex id; first: (2 -> 999), (4 -> 998)"],
    ),
    "dangling_src": (
        GOOD_VERTICES,
        {"src": [1, 77, 2], "dst": [2, 3, 3]},
        {},
        ["1 edges have a src that is not a vertex id; first: (77 -> 3)"],
    ),
    "width_mismatch": (
        {"id": [1, 2, 3, 4, 5], "x": [[1.0, 2.0], [1.0], [1.0, 2.0], [1.0, 2.0, 3.0], [0.0, 0.0]]},
        GOOD_EDGES,
        {},
        ["2 vertices have a feature vector whose length is not 2; first: id 2 (len 1), id 4 (len 3)"],
    ),
    "nan_inf": (
        {"id": [1, 2, 3, 4], "x": [[1.0, 2.0], [NAN, 0.0], [0.0, 1.0], [0.0, -INF]]},
        GOOD_EDGES,
        {},
        ["2 vertices have NaN/Inf (or null) feature values; first ids: 2, 4"],
    ),
    "null_id": ({"id": [1, 2, None, 3, 4], "x": GOOD_X + [[0.0, 0.0]]}, GOOD_EDGES, {}, ["1 vertices have a null id"]),
    "null_x": (
        {"id": [1, 2, 3, 4], "x": [[1.0, 2.0], None, [1.0, 2.0], [1.0, 2.0]]},
        GOOD_EDGES,
        {},
        ["1 vertices have a null feature vector x; first ids: 2"],
    ),
    "wrong_types": (
        {"id": [1, 2, 3, 4], "x": ["a", "b", "c", "d"]},
        {"src": [1], "dst": [2.5]},
        {},
        ["vertices.x is string, expected array<float>", "edges.dst is double, expected int64"],
    ),
    "missing_columns": (
        {"id": [1, 2, 3, 4]},
        {"src": [1, 2]},
        {},
        ["2 required column(s) missing: vertices.x, edges.dst"],
    ),
    "bad_weights": (
        GOOD_VERTICES,
        {"src": [1, 2, 3, 1], "dst": [2, 3, 4, 3], "weight": [1.0, -0.5, NAN, 2.0]},
        {},
        ["2 edges have a negative, NaN, Inf or null weight; first: (2 -> 3, weight=-0.5), (3 -> 4, weight=nan)"],
    ),
    "edge_attr_width": (
        GOOD_VERTICES,
        {**GOOD_EDGES, "edge_attr": [[1.0, 2.0], [1.0], [0.0, 1.0]]},
        {},
        ["1 edges have an edge_attr vector whose length is not 2; first: (2 -> 3) (len 1)"],
    ),
    "edge_attr_nan": (
        GOOD_VERTICES,
        {**GOOD_EDGES, "edge_attr": [[1.0, 2.0], [NAN, 0.0], [0.0, -INF]]},
        {},
        ["2 edges have NaN/Inf (or null) edge_attr values; first: (2 -> 3), (3 -> 4)"],
    ),
    "several_at_once": (
        {"id": [1, 2, 2, 3, 4], "x": [[1.0, 2.0], [1.0, 2.0], [1.0, 2.0], [INF, 0.0], [1.0, 2.0]]},
        {"src": [1, 9], "dst": [2, 3]},
        {},
        [
            "failed validation (3 problems)",
            "1 vertex ids appear more than once; first: 2 (x2)",
            "1 vertices have NaN/Inf (or null) feature values; first ids: 3",
            "1 edges have a src that is not a vertex id; first: (9 -> 3)",
        ],
    ),
}


def arrow_types(vertices: dict) -> dict:
    """x as list<float> (nullable children) so NaN/None survive; ids int64."""
    types = {"id": pa.int64()}
    if "x" in vertices and not isinstance(vertices["x"][0], str):
        types["x"] = pa.list_(pa.float32())
    return types
