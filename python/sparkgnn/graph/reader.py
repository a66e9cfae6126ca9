"""Reading a graph directory into a GraphData with pyarrow only (no Spark, no per-row Python).

Why it validates while reading: the directory may come from anyone (Spark jobs, other tools),
and defects such as null or ragged vectors or dangling edges can only be reported meaningfully
(with original ids) before the data is turned into dense arrays.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sparkgnn.errors import GraphValidationError
from sparkgnn.graph import checks, layout
from sparkgnn.graph.data import GraphData
from sparkgnn.graph.dirfacts import check_graph_dir, trusted_meta
from sparkgnn.graph.problems import Problem, fmt_edge, raise_if_any, schema_problems


def _is_integer(t: pa.DataType) -> bool:
    return pa.types.is_integer(t)


def _is_vector(t: pa.DataType) -> bool:
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    return is_list and (pa.types.is_floating(t.value_type) or pa.types.is_integer(t.value_type))


# column -> (type predicate, description); required columns first.
VERTEX_COLUMNS = {"id": (_is_integer, "int64"), "x": (_is_vector, "array<float>")}
OPTIONAL_VERTEX_COLUMNS = {"y": (_is_integer, "int64"), "split": (pa.types.is_string, "string")}
EDGE_COLUMNS = {"src": (_is_integer, "int64"), "dst": (_is_integer, "int64")}
OPTIONAL_EDGE_COLUMNS = {
    "weight": (lambda t: pa.types.is_floating(t) or pa.types.is_integer(t), "float32"),
    layout.EDGE_ATTR: (_is_vector, "array<float>"),
}


def column_defects(schema: pa.Schema, required: dict, optional: dict, what: str) -> tuple[list, list]:
    """(missing "what.col" names, "what.col is T, expected U" lines) of one table."""
    missing = [f"{what}.{name}" for name in required if name not in schema.names]
    wrong = [
        f"{what}.{name} is {schema.field(name).type}, expected {desc}"
        for name, (ok, desc) in {**required, **optional}.items()
        if name in schema.names and not ok(schema.field(name).type)
    ]
    return missing, wrong


def _read_table(folder: str) -> pa.Table:
    if not os.path.isdir(folder):
        raise GraphValidationError(f"graph directory is missing {folder}")
    return pq.read_table(folder)


def _int_column(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    col = table.column(name)
    nulls = col.is_null().to_numpy(zero_copy_only=False)
    values = pc.fill_null(col, 0).to_numpy().astype(np.int64, copy=False)
    return values, nulls


def read_graph_dir(path: str, name: str | None = None) -> GraphData:
    """Read `<path>/vertices`, `<path>/edges` (and graph.json when present) into a GraphData.

    Every defect is reported in one GraphValidationError (count + first offenders, original ids).
    When graph.json is present and still describes the files (dirfacts) its fingerprint is reused
    (that is what makes it cheap to read); otherwise it is computed from the content.
    """
    path = layout.strip_scheme(str(path))
    check_graph_dir(path)
    meta = trusted_meta(path, layout.read_meta(path))[0] or {}
    name = name or meta.get("name") or os.path.basename(os.path.normpath(path))
    vertices = _read_table(os.path.join(path, layout.VERTICES_DIR))
    edges = _read_table(os.path.join(path, layout.EDGES_DIR))
    return graph_data_from_tables(vertices, edges, name=name, meta=meta)


def graph_data_from_tables(
    vertices: pa.Table, edges: pa.Table, name: str = "graph", meta: dict | None = None
) -> GraphData:
    """Arrow vertex and edge tables (GraphFrames schema, x as any list type) -> validated GraphData."""
    meta = meta or {}
    v_missing, v_wrong = column_defects(vertices.schema, VERTEX_COLUMNS, OPTIONAL_VERTEX_COLUMNS, "vertices")
    e_missing, e_wrong = column_defects(edges.schema, EDGE_COLUMNS, OPTIONAL_EDGE_COLUMNS, "edges")
    raise_if_any(schema_problems(v_missing + e_missing, v_wrong + e_wrong), name)

    problems: list[Problem] = []
    v = vertex_columns(vertices, meta.get("feature_dim"), problems)
    e = edge_columns(edges, meta.get("edge_attr_dim"), problems)
    raise_if_any(problems, name)

    data = GraphData.from_edge_ids(
        v["ids"],
        v["x"],
        e["src"],
        e["dst"],
        weight=e["weight"],
        y=v["y"],
        split=v["split"],
        name=name,
        edge_attr=e["edge_attr"],
    )
    if meta.get("fingerprint"):
        data.__dict__["fingerprint"] = meta["fingerprint"]
    return data


def vertex_columns(vertices: pa.Table, feature_dim: int | None, problems: list[Problem]) -> dict:
    """ids, x [N, F] float32 (None when defective), y, split of a vertex table whose column types
    were checked (column_defects); defects are appended to `problems`. A table without `x` (a
    typed graph's node type without features) gets a 0-wide x."""
    ids, id_nulls = _int_column(vertices, "id")
    if id_nulls.any():
        problems.append(Problem("null_id", int(id_nulls.sum())))
    if "x" in vertices.column_names:
        x, x_problems = checks.vector_column(ids, vertices.column("x"), feature_dim)
        problems += x_problems
    else:
        x = np.zeros((len(ids), 0), np.float32)
    y = _int_column(vertices, "y")[0] if "y" in vertices.column_names else None
    split = None
    if "split" in vertices.column_names:
        split = pc.fill_null(vertices.column("split"), checks.NO_SPLIT).to_numpy(zero_copy_only=False)
        split = split.astype(str)
    return {"ids": ids, "x": x, "y": y, "split": split}


def edge_columns(edges: pa.Table, edge_attr_dim: int | None, problems: list[Problem]) -> dict:
    """src, dst (original ids), weight, edge_attr of an edge table whose column types were checked;
    null endpoints and null / ragged edge_attr rows are appended to `problems`."""
    src, src_nulls = _int_column(edges, "src")
    dst, dst_nulls = _int_column(edges, "dst")
    null_edges = src_nulls | dst_nulls
    weight = None
    if "weight" in edges.column_names:
        wcol = edges.column("weight").cast(pa.float32())
        weight = pc.fill_null(wcol, np.nan).to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    edge_attr = None
    if layout.EDGE_ATTR in edges.column_names:
        edge_attr, attr_problems = checks.vector_column(
            np.arange(len(src)),
            edges.column(layout.EDGE_ATTR),
            edge_attr_dim,
            kinds=("null_edge_attr", "edge_attr_width"),
            label=lambda i: fmt_edge(src[i], dst[i]),
        )
        problems += attr_problems
    if null_edges.any():
        rows = np.flatnonzero(null_edges)[:5]
        problems.append(
            Problem(
                "null_endpoint",
                int(null_edges.sum()),
                tuple(fmt_edge(None if src_nulls[i] else src[i], None if dst_nulls[i] else dst[i]) for i in rows),
            )
        )
    return {"src": src, "dst": dst, "weight": weight, "edge_attr": edge_attr}
