"""The on-disk graph format, in one place (directory names, Arrow schemas, graph.json keys).

    <dir>/vertices/part-*.parquet   id int64, x fixed_size_list<float32>[F], [y int64], [split string]
    <dir>/edges/part-*.parquet      src int64, dst int64, [weight float32],
                                    [edge_attr fixed_size_list<float32>[D]]
    <dir>/graph.json                num_vertices, num_edges, feature_dim, has_weight, has_labels,
                                    num_classes, name, fingerprint (+ format, validated, splits,
                                    edge_attr_dim when the edges carry attributes)

Why these choices: fixed_size_list tells every reader the width without scanning, and Spark reads
it back as array<float> (mapInArrow cannot RETURN fixed_size_list, but it can read it). Vector
columns are never null (nulls are very slow to hand to Python workers); an unlabelled vertex has
y = -1 rather than a null. A vertex in no split has a null `split` (a plain string column, cheap).
graph.json is written LAST, so its presence marks a complete directory. Readers accept x as
list<float|double|int> too (Spark writes array<float> as a plain list).
"""

from __future__ import annotations

import json

import pyarrow as pa

from sparkgnn import files

VERTICES_DIR = "vertices"
EDGES_DIR = "edges"
META_FILE = "graph.json"
FORMAT = "sparkgnn-graph/1"
META_KEYS = (
    "num_vertices",
    "num_edges",
    "feature_dim",
    "has_weight",
    "has_labels",
    "num_classes",
    "name",
    "fingerprint",
)
# Parquet files are cut at about this many bytes of raw column data (Spark reads files as splits).
TARGET_FILE_BYTES = 128 << 20
TARGET_ROW_GROUP_BYTES = 32 << 20


def vertex_schema(feature_dim: int, has_labels: bool, has_split: bool) -> pa.Schema:
    """id, x (F-wide; no x column when F is 0: a typed graph's node type without features, since
    Arrow has no 0-wide fixed_size_list), [y], [split]."""
    fields = [pa.field("id", pa.int64(), nullable=False)]
    if feature_dim:
        fields.append(pa.field("x", pa.list_(pa.float32(), feature_dim), nullable=False))
    if has_labels:
        fields.append(pa.field("y", pa.int64(), nullable=False))
    if has_split:
        fields.append(pa.field("split", pa.string()))
    return pa.schema(fields)


EDGE_ATTR = "edge_attr"


def edge_schema(has_weight: bool, edge_attr_dim: int = 0) -> pa.Schema:
    """src, dst, [weight], [edge_attr: a D-wide float32 vector per edge, D = edge_attr_dim > 0]."""
    fields = [pa.field("src", pa.int64(), nullable=False), pa.field("dst", pa.int64(), nullable=False)]
    if has_weight:
        fields.append(pa.field("weight", pa.float32(), nullable=False))
    if edge_attr_dim:
        fields.append(pa.field(EDGE_ATTR, pa.list_(pa.float32(), int(edge_attr_dim)), nullable=False))
    return pa.schema(fields)


def vertex_row_bytes(feature_dim: int) -> int:
    return 8 + 4 * feature_dim + 16


def rows_for_bytes(row_bytes: int, target: int) -> int:
    return max(1024, target // max(row_bytes, 1))


def strip_scheme(path: str) -> str:
    return path[len("file:") :] if path.startswith("file:") else path


def is_local(path: str) -> bool:
    """True for plain paths and file: URIs (graph.json is then read with open())."""
    return "://" not in path or path.startswith("file:")


def read_meta(path: str) -> dict | None:
    """graph.json of a graph directory (any path sparkgnn.files reaches), or None when absent
    (e.g. a directory Spark wrote); its fingerprint checked (checked_meta)."""
    try:
        return checked_meta(files.read_json(files.join(strip_scheme(path), META_FILE)), path)
    except FileNotFoundError:
        return None


def checked_meta(meta, path: str):
    """`meta` (graph.json's content), refused (GraphValidationError) when its `fingerprint` is not
    a graph fingerprint: the fingerprint is joined into store paths."""
    from sparkgnn.graph.fingerprint import check_fingerprint

    if isinstance(meta, dict) and meta.get("fingerprint") is not None:
        check_fingerprint(meta["fingerprint"], f"{path}/{META_FILE}: fingerprint")
    return meta


def write_meta(path: str, meta: dict) -> None:
    """Write graph.json atomically (files.write_bytes_atomic: temp file + rename on a disk, one put
    on an object store) so readers never see half a document."""
    text = json.dumps({"format": FORMAT, **meta}, indent=2, sort_keys=True) + "\n"
    files.write_bytes_atomic(files.join(strip_scheme(path), META_FILE), text.encode())
