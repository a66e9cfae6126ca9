"""The typed graph directory: writing (whole or streamed per type) and reading with pyarrow.

    <dir>/vertices/<node type>/part-*.parquet          id, [x F_t-wide], [y], [split]  (layout.vertex_schema)
    <dir>/edges/<src>__<relation>__<dst>/part-*.parquet src, dst, [weight], [edge_attr] (layout.edge_schema)
    <dir>/graph.json    format "sparkgnn-typed-graph/1", node_types and edge_types in PyG's metadata
                        order, per type sizes / widths / fingerprints ("types", "relations"), the
                        typed fingerprint, validated, data_stamp

Why per-type folders of the homogeneous tables: every type is written by the homogeneous sinks
(writer.VertexSink / EdgeSink) and read by the homogeneous column readers (reader.vertex_columns
/ edge_columns), so the two formats cannot drift apart; the same staging, swap-in, overwrite
rules and data stamp apply (writer.py, dirfacts.py). A node type without features has no x
column. A homogeneous job given a typed directory refuses it (dirfacts.refuse_typed).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow.parquet as pq

from sparkgnn import files
from sparkgnn.errors import GraphValidationError
from sparkgnn.graph import layout
from sparkgnn.graph.dirfacts import STAMP_KEY, data_stamp, folder_problem, trusted_meta
from sparkgnn.graph.problems import Problem, schema_problems
from sparkgnn.graph.reader import (
    EDGE_COLUMNS,
    OPTIONAL_EDGE_COLUMNS,
    OPTIONAL_VERTEX_COLUMNS,
    VERTEX_COLUMNS,
    column_defects,
    edge_columns,
    vertex_columns,
)
from sparkgnn.graph.typed import (
    TYPED_FINGERPRINT_ALGO,
    TYPED_FORMAT,
    EdgeType,
    TypedEdges,
    TypedGraphData,
    as_edge_type,
    check_type_name,
    edge_key,
    edge_type_fingerprint,
    edge_type_meta,
    is_typed_meta,
    node_table,
    node_type_fingerprint_of,
    parse_edge_key,
    raise_typed,
    scoped,
    typed_fingerprint,
)
from sparkgnn.graph.writer import EdgeSink, VertexSink, check_target, new_staging, swap_in

# A typed vertex table needs only `id`: `x` is absent for a type without features.
TYPED_VERTEX_COLUMNS = {"id": VERTEX_COLUMNS["id"]}
TYPED_OPTIONAL_VERTEX_COLUMNS = {"x": VERTEX_COLUMNS["x"], **OPTIONAL_VERTEX_COLUMNS}


@dataclass(frozen=True)
class NodeTypeSpec:
    """What one node type's vertex table carries (feature_dim 0: no features)."""

    feature_dim: int = 0
    has_labels: bool = False
    has_split: bool = False


@dataclass(frozen=True)
class EdgeTypeSpec:
    """What one edge type's edge table carries."""

    has_weight: bool = False
    edge_attr_dim: int = 0


def vertex_folder(node_type: str) -> str:
    return f"{layout.VERTICES_DIR}/{node_type}"


def edge_folder(edge_type: EdgeType) -> str:
    return f"{layout.EDGES_DIR}/{edge_key(edge_type)}"


def structure_problems(node_types, edge_types) -> list[str]:
    """Bad type names and edge types naming unknown node types, one line each."""
    lines = [why for t in node_types if (why := check_type_name(t))]
    if len(set(node_types)) != len(list(node_types)):
        lines.append(f"node types are listed more than once: {list(node_types)}")
    if not node_types:
        lines.append("no node types (a typed graph needs at least one)")
    for edge_type in edge_types:
        if not isinstance(edge_type, (tuple, list)) or len(edge_type) != 3:
            lines.append(f"edge type {edge_type!r} is not a (src type, relation, dst type) triple")
            continue
        lines += [f"edge type {edge_key(as_edge_type(edge_type))}: {why}" for why in _edge_name_problems(edge_type)]
        known = ", ".join(node_types) or "none"
        lines += [
            f"edge type {edge_key(as_edge_type(edge_type))}: node type {t!r} is unknown (node types: {known})"
            for t in dict.fromkeys((edge_type[0], edge_type[2]))
            if t not in node_types
        ]
    return lines


def _edge_name_problems(edge_type) -> list[str]:
    whats = ("source node type", "relation", "destination node type")
    return [why for part, what in zip(edge_type, whats, strict=True) if (why := check_type_name(part, what))]


class TypedGraphDirWriter:
    """Stream a typed graph into a graph directory, type by type, chunk by chunk (vertices by
    type, edges by edge type with ORIGINAL ids). Types are declared up front and checked before
    anything is written; like GraphDirWriter it trusts its caller for global properties (unique
    ids, endpoints present) and refuses chunks of the wrong width. A context manager: an
    exception leaves the target as it was."""

    def __init__(
        self,
        path: str,
        node_types: Mapping[str, NodeTypeSpec],
        edge_types: Mapping[EdgeType, EdgeTypeSpec],
        *,
        name: str = "graph",
        rows_per_file: int | None = None,
        overwrite: bool = False,
    ):
        self.path = layout.strip_scheme(str(path))
        self.name = name
        self.node_specs = dict(node_types)
        self.edge_specs = {as_edge_type(et): spec for et, spec in dict(edge_types).items()}
        raise_typed(structure_problems(list(self.node_specs), list(self.edge_specs)), name)
        check_target(self.path, overwrite)
        os.makedirs(self.path, exist_ok=True)
        self._staging = new_staging(self.path)
        self._vertices = {
            t: VertexSink(
                os.path.join(self._staging, layout.VERTICES_DIR, t),
                spec.feature_dim,
                has_labels=spec.has_labels,
                has_split=spec.has_split,
                rows_per_file=rows_per_file,
            )
            for t, spec in self.node_specs.items()
        }
        self._edges = {
            et: EdgeSink(
                os.path.join(self._staging, layout.EDGES_DIR, edge_key(et)),
                has_weight=spec.has_weight,
                edge_attr_dim=spec.edge_attr_dim,
                rows_per_file=rows_per_file,
            )
            for et, spec in self.edge_specs.items()
        }

    def write_vertices(self, node_type: str, ids, x=None, y=None, split=None) -> None:
        """Append a chunk of `node_type`'s vertices (x None for a type without features)."""
        if node_type not in self._vertices:
            raise ValueError(f"node type {node_type!r} was not declared (declared: {', '.join(self._vertices)})")
        self._vertices[node_type].write(ids, x, y, split)

    def write_edges(self, edge_type: EdgeType, src, dst, weight=None, edge_attr=None) -> None:
        """Append a chunk of `edge_type`'s edges (src, dst: ids of its source and destination types)."""
        edge_type = as_edge_type(edge_type)
        if edge_type not in self._edges:
            raise ValueError(f"edge type {edge_key(edge_type)} was not declared")
        self._edges[edge_type].write(src, dst, weight, edge_attr)

    def close(self, *, validated: bool = True, extra: dict | None = None) -> dict:
        """Finish the Parquet files, move them into place and write graph.json; returns it."""
        sinks: list[VertexSink | EdgeSink] = [*self._vertices.values(), *self._edges.values()]
        for sink in sinks:
            sink.close()
        swap_in(self.path, self._staging)
        types: dict[str, dict] = {}
        relations: dict[str, dict] = {}
        for t, sink in self._vertices.items():
            types[t] = {
                "num_vertices": sink.count,
                "feature_dim": sink.feature_dim,
                "has_labels": sink.has_labels,
                "has_split": sink.has_split,
                "num_classes": sink.max_label + 1 if sink.has_labels else 0,
                "fingerprint": node_type_fingerprint_of(sink.count, sink.hash_sum, sink.feature_dim),
                **({"splits": dict(sink.split_counts)} if sink.has_split else {}),
            }
        for et, sink in self._edges.items():
            fp = edge_type_fingerprint(sink.count, sink.hash_sum, sink.has_weight, sink.edge_attr_dim)
            relations[edge_key(et)] = edge_type_meta(sink.count, sink.has_weight, sink.edge_attr_dim, fp)
        meta = {
            "name": self.name,
            "format": TYPED_FORMAT,
            "node_types": list(self.node_specs),
            "edge_types": [list(et) for et in self.edge_specs],
            "num_vertices": sum(t["num_vertices"] for t in types.values()),
            "num_edges": sum(r["num_edges"] for r in relations.values()),
            "types": types,
            "relations": relations,
            "fingerprint": typed_fingerprint(
                {t: m["fingerprint"] for t, m in types.items()},
                {et: relations[edge_key(et)]["fingerprint"] for et in self.edge_specs},
            ),
            "fingerprint_algo": TYPED_FINGERPRINT_ALGO,
            "validated": bool(validated),
            **(extra or {}),
            STAMP_KEY: data_stamp(self.path),
        }
        layout.write_meta(self.path, meta)
        return meta

    def abort(self) -> None:
        """Drop everything written so far; the target directory is left as it was."""
        sinks: list[VertexSink | EdgeSink] = [*self._vertices.values(), *self._edges.values()]
        for sink in sinks:
            try:
                sink.close()
            except OSError:
                pass
        shutil.rmtree(self._staging, ignore_errors=True)

    def __enter__(self) -> TypedGraphDirWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


def write_typed_graph_dir(
    data: TypedGraphData, path: str, *, rows_per_file: int | None = None, overwrite: bool = False
) -> dict:
    """Validate `data` and write it as a typed graph directory; returns graph.json's content.
    A defect is refused (one line per defect, naming its type) before anything is written."""
    data.validate()
    node_specs = {t: NodeTypeSpec(n.feature_dim, n.has_labels, n.split is not None) for t, n in data.nodes.items()}
    edge_specs = {et: EdgeTypeSpec(e.weight is not None, e.edge_attr_dim) for et, e in data.edges.items()}
    with TypedGraphDirWriter(
        path, node_specs, edge_specs, name=data.name, rows_per_file=rows_per_file, overwrite=overwrite
    ) as writer:
        for t, n in data.nodes.items():
            writer.write_vertices(t, n.ids, n.x if n.feature_dim else None, n.y, n.split)
        for et, e in data.edges.items():
            writer.write_edges(et, e.src, e.dst, e.weight, e.edge_attr)
        return writer.close(validated=True)


def is_typed_graph_dir(path) -> bool:
    """True when `path` holds a typed graph (its graph.json says so)."""
    return is_typed_meta(layout.read_meta(layout.strip_scheme(str(path))))


def typed_structure(path: str) -> tuple[dict, dict, list[EdgeType]]:
    """(graph.json, the part of it still trusted (dirfacts.trusted_meta), edge types) of a typed
    graph directory, after checking that every listed type has a readable folder and no folder
    holds an unlisted type. Raises GraphValidationError (one line per defect) otherwise."""
    kind = files.kind(path)
    if kind != "dir":
        raise GraphValidationError(
            f"graph directory {path} " + ("does not exist" if kind == "missing" else "is a file, not a directory")
        )
    meta = layout.read_meta(path)
    if meta is None or not is_typed_meta(meta):
        raise GraphValidationError(
            f"graph directory {path} is not a typed graph (its graph.json lists no node_types); "
            "read it with read_graph_dir"
        )
    name = meta.get("name") or os.path.basename(os.path.normpath(path))
    node_types = list(meta.get("node_types") or [])
    edge_types = [as_edge_type(et) for et in meta.get("edge_types") or []]
    lines = structure_problems(node_types, edge_types)
    raise_typed(lines, name)
    for t in node_types:
        why = folder_problem(files.join(path, vertex_folder(t)), vertex_folder(t))
        if why:
            lines.append(f"node type {t!r}: {why}")
    for et in edge_types:
        why = folder_problem(files.join(path, edge_folder(et)), edge_folder(et))
        if why:
            lines.append(f"edge type {edge_key(et)}: {why}")
    listed = {layout.VERTICES_DIR: set(node_types), layout.EDGES_DIR: {edge_key(et) for et in edge_types}}
    for top, names in listed.items():
        folder = os.path.join(path, top)
        present = (
            sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
            if os.path.isdir(folder)
            else []
        )
        for extra in (d for d in present if d not in names and not d.startswith((".", "_"))):
            what = "node type" if top == layout.VERTICES_DIR else "edge type"
            if top == layout.EDGES_DIR and parse_edge_key(extra) is None:
                lines.append(f"{top}/{extra}/ does not name an edge type (src__relation__dst)")
            else:
                article = "a" if what == "node type" else "an"
                lines.append(
                    f"{top}/{extra}/ holds {article} {what} that graph.json does not list ({what}s: {sorted(names)})"
                )
    raise_typed(lines, name)
    trusted, _why = trusted_meta(path, meta)
    return meta, trusted or {}, edge_types


def read_typed_graph_dir(path: str, *, name: str | None = None) -> TypedGraphData:
    """Read a typed graph directory into a validated TypedGraphData with pyarrow.

    Every defect is reported in one GraphValidationError, one line each, naming its type:
    missing or unlisted type folders, missing or mistyped columns, widths that differ from
    graph.json's or within a type, endpoints missing in their typed vertex tables, and the
    homogeneous per-table defects. graph.json's fingerprints are reused while its data stamp
    still matches the files, else computed from the content."""
    path = layout.strip_scheme(str(path))
    meta, trusted, edge_types = typed_structure(path)
    name = name or meta.get("name") or os.path.basename(os.path.normpath(path))
    types, relations = trusted.get("types") or {}, trusted.get("relations") or {}
    lines: list[str] = []
    nodes, edges = {}, {}
    for t in meta["node_types"]:
        scope = f"node type {t!r}"
        table = pq.read_table(files.join(path, vertex_folder(t)))
        width = types.get(t, {}).get("feature_dim")
        missing, wrong = column_defects(table.schema, TYPED_VERTEX_COLUMNS, TYPED_OPTIONAL_VERTEX_COLUMNS, t)
        if width and "x" not in table.column_names:
            missing.append(f"{t}.x")
        if missing or wrong:
            lines += scoped(scope, _schema(missing, wrong))
            continue
        problems: list[Problem] = []
        columns = vertex_columns(table, width, problems)
        if problems:
            lines += scoped(scope, problems)
            continue
        nodes[t] = node_table(columns["ids"], columns["x"], y=columns["y"], split=columns["split"], name=f"{name}/{t}")
    for et in edge_types:
        scope = f"edge type {edge_key(et)}"
        table = pq.read_table(files.join(path, edge_folder(et)))
        missing, wrong = column_defects(table.schema, EDGE_COLUMNS, OPTIONAL_EDGE_COLUMNS, edge_key(et))
        if missing or wrong:
            lines += scoped(scope, _schema(missing, wrong))
            continue
        problems = []
        columns = edge_columns(table, relations.get(edge_key(et), {}).get("edge_attr_dim") or None, problems)
        if problems:
            lines += scoped(scope, problems)
            continue
        edges[et] = TypedEdges(columns["src"], columns["dst"], weight=columns["weight"], edge_attr=columns["edge_attr"])
    raise_typed(lines, name)
    data = TypedGraphData(nodes, edges, name=name)
    data.validate()
    if trusted.get("fingerprint"):
        data.__dict__["fingerprint"] = trusted["fingerprint"]
    return data


def _schema(missing: list[str], wrong: list[str]) -> list[Problem]:
    return schema_problems(missing, wrong)
