"""Typed graph updates: a day's changes to a typed graph (graph/typed.py), validated and applied.

A typed update names the type of every change: vertex inserts, deletes and feature updates are
grouped by node type, edge inserts and deletes by relation (src type, relation, dst type); each
group is a homogeneous GraphUpdate (format.py) whose ids are ids of its types. On disk it is laid
out like a typed graph directory (graph/typed_io.py), one update table per folder:

    <dir>/vertices/<node type>/part-0.parquet          that type's vertex_insert / feature_update /
                                                       vertex_delete rows (UPDATE_SCHEMA)
    <dir>/edges/<src>__<relation>__<dst>/part-0.parquet that relation's edge_insert / edge_delete rows

WHY a GraphUpdate per type and not a type column: each group then reads, writes and validates
with the homogeneous rules unchanged (a node type's group against its vertex table, with the same
wording), and only what crosses types is new: an edge's endpoints live in two typed vertex tables
(its source type's and its destination type's), and deleting a vertex of type T removes its edges
in every relation that touches T.

The rules are the homogeneous ones (validation.py), per type: deletes apply before inserts; an
edge_delete removes one occurrence of (src, dst) within its relation; an edge insert's endpoints
are vertices of their types kept or inserted by this update; a relation's weights and edge
attributes are required iff its edge table has them. Every problem is found before anything is
applied and refused in ONE line that names the type or relation of each defect.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from sparkgnn import npsets
from sparkgnn.errors import GraphUpdateError, OutputError
from sparkgnn.graph import checks, layout
from sparkgnn.graph.data import GraphData
from sparkgnn.graph.problems import fmt_edge, fmt_edge_weight
from sparkgnn.graph.typed import EdgeType, TypedEdges, TypedGraphData, as_edge_type, edge_key, parse_edge_key
from sparkgnn.graph.updates.applying import apply
from sparkgnn.graph.updates.format import (
    EDGE_DELETE,
    EDGE_INSERT,
    FEATURE_UPDATE,
    VERTEX_DELETE,
    VERTEX_INSERT,
    GraphUpdate,
    UpdateProblem,
    make_problem,
    no_ids,
)
from sparkgnn.graph.updates.validation import _edge_attr_problems, _edge_problem, _match_deletes

VERTEX_KINDS = (VERTEX_INSERT, FEATURE_UPDATE, VERTEX_DELETE)
EDGE_KINDS = (EDGE_INSERT, EDGE_DELETE)
UPDATE_FILE = "part-0.parquet"


def _refuse(lines: list[str], what: str) -> None:
    """One GraphUpdateError, one line: every defect, each naming its type or relation."""
    if lines:
        noun = "problem" if len(lines) == 1 else "problems"
        error = GraphUpdateError(f"{what} failed validation ({len(lines)} {noun}): " + "; ".join(lines))
        error.problems = list(lines)
        raise error


@dataclass(eq=False)
class TypedGraphUpdate:
    """One typed update (module doc): `nodes` {node type: GraphUpdate of vertex rows only},
    `edges` {(src type, relation, dst type): GraphUpdate of edge rows only}; ids ORIGINAL ids of
    their types. Either mapping may be empty."""

    nodes: dict[str, GraphUpdate] = field(default_factory=dict)
    edges: dict[EdgeType, GraphUpdate] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.nodes = dict(self.nodes)
        self.edges = {as_edge_type(et): u for et, u in dict(self.edges).items()}
        lines: list[str] = []
        for t, u in self.nodes.items():
            extra = [k for k in EDGE_KINDS if u.counts()[k]]
            if extra:
                lines.append(f"node type {t!r}: {', '.join(extra)} rows belong to a relation's update, not a type's")
        for et, u in self.edges.items():
            extra = [k for k in VERTEX_KINDS if u.counts()[k]]
            if extra:
                lines.append(f"relation {edge_key(et)}: {', '.join(extra)} rows belong to a node type's update")
        _refuse(lines, "typed graph update")

    def counts(self) -> dict[str, dict[str, dict[str, int]]]:
        """Rows per kind: {"nodes": {type: {kind: n}}, "edges": {src__rel__dst: {kind: n}}}."""
        return {
            "nodes": {t: {k: u.counts()[k] for k in VERTEX_KINDS} for t, u in self.nodes.items()},
            "edges": {edge_key(et): {k: u.counts()[k] for k in EDGE_KINDS} for et, u in self.edges.items()},
        }

    @property
    def empty(self) -> bool:
        return all(u.empty for u in [*self.nodes.values(), *self.edges.values()])

    def __repr__(self) -> str:
        return f"TypedGraphUpdate({self.counts()})"

    @classmethod
    def read(cls, path) -> TypedGraphUpdate:
        """Read a typed update folder (module doc); each type's folder is read by GraphUpdate.read."""
        root = layout.strip_scheme(str(path))
        if not os.path.isdir(root):
            raise GraphUpdateError(f"typed graph update {root} is not a folder")
        found = {name for name in os.listdir(root) if not name.startswith((".", "_"))}
        if not found & {"vertices", "edges"} or found - {"vertices", "edges"}:
            raise GraphUpdateError(
                f"typed graph update {root} must hold vertices/<node type>/ and edges/<src>__<relation>__<dst>/ "
                f"folders only, found: {sorted(found) or 'nothing'}"
            )
        nodes: dict[str, GraphUpdate] = {}
        edges: dict[EdgeType, GraphUpdate] = {}
        for name in _folders(os.path.join(root, "vertices")):
            nodes[name] = GraphUpdate.read(os.path.join(root, "vertices", name))
        for name in _folders(os.path.join(root, "edges")):
            edge_type = parse_edge_key(name)
            if edge_type is None:
                raise GraphUpdateError(
                    f"typed graph update {root}: edges/{name} does not name <src>__<relation>__<dst>"
                )
            edges[edge_type] = GraphUpdate.read(os.path.join(root, "edges", name))
        return cls(nodes, edges)

    def write(self, path) -> str:
        """Write the update as a folder at `path` (module doc) and return the path. Never replaces
        an existing path; written under a hidden temporary name beside it and renamed."""
        path = layout.strip_scheme(str(path))
        if os.path.exists(path):
            raise OutputError(f"{path} already exists; a graph update is never overwritten, write it under a new name")
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        temporary = os.path.join(parent, f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex}")
        try:
            parts = [("vertices", t, u) for t, u in self.nodes.items()]
            parts += [("edges", edge_key(et), u) for et, u in self.edges.items()]
            os.makedirs(temporary)
            for folder, name, update in parts:
                os.makedirs(os.path.join(temporary, folder, name))
                update.write(os.path.join(temporary, folder, name, UPDATE_FILE))
            os.rename(temporary, path)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        return path


def _folders(path: str) -> list[str]:
    if not os.path.isdir(path):
        return []
    return sorted(n for n in os.listdir(path) if not n.startswith((".", "_")) and os.path.isdir(os.path.join(path, n)))


@dataclass(eq=False)
class TypedApplied:
    """apply_typed()'s result: the updated typed graph and, per node type, how its rows relate to
    the old graph's (as Applied: old_rows [N'_T], -1 for an inserted vertex; new_rows [N_T], -1 for
    a deleted one; feature_changed: new rows whose input changed, inserted ones included), and per
    relation `edge_changed_dst`: the new rows of destinations that gained or lost an in-edge in it.
    A type's kept vertices keep their order, inserted ones follow in update order; a relation's
    kept edges keep their order, inserted ones follow."""

    graph: TypedGraphData
    old_rows: dict[str, np.ndarray]
    new_rows: dict[str, np.ndarray]
    feature_changed: dict[str, np.ndarray]
    edge_changed_dst: dict[EdgeType, np.ndarray]


def validate_typed(update: TypedGraphUpdate, graph: TypedGraphData) -> None:
    """Raise one GraphUpdateError (one line, naming each defect's type or relation) when `update`
    cannot be applied to `graph`; return None when it can."""
    apply_typed(update, graph)


def apply_typed(update: TypedGraphUpdate, graph: TypedGraphData) -> TypedApplied:
    """Validate `update` against `graph` (module doc; `graph` untouched, nothing applied on a
    problem) and return the updated graph as a NEW TypedGraphData with the mappings a refresh needs."""
    if not isinstance(update, TypedGraphUpdate):
        raise GraphUpdateError(f"a typed graph is updated by a TypedGraphUpdate, not {type(update).__name__}")
    lines: list[str] = []
    known = ", ".join(graph.node_types)
    for t in update.nodes:
        if t not in graph.nodes:
            lines.append(f"node type {t!r} is unknown (node types: {known})")
    for et in update.edges:
        if et not in graph.edges:
            lines.append(f"relation {edge_key(et)} is unknown (relations: {', '.join(map(edge_key, graph.edges))})")
    nodes: dict[str, GraphData] = {}
    old_rows: dict[str, np.ndarray] = {}
    new_rows: dict[str, np.ndarray] = {}
    feature_changed: dict[str, np.ndarray] = {}
    for t, node in graph.nodes.items():
        vertex_update = update.nodes.get(t)
        if vertex_update is None or vertex_update.empty:
            identity = np.arange(node.num_nodes, dtype=np.int64)
            nodes[t], old_rows[t], new_rows[t], feature_changed[t] = node, identity, identity, no_ids()
            continue
        try:
            applied = apply(vertex_update, node)
        except GraphUpdateError as error:
            lines += [f"node type {t!r}: {p.message}" for p in error.problems]
            continue
        nodes[t], old_rows[t], new_rows[t] = applied.graph, applied.old_rows, applied.new_rows
        feature_changed[t] = applied.feature_changed
    if lines:  # the relations' checks need every type's vertices resolved
        _refuse(lines, f"update of typed graph {graph.name!r}")
    edges: dict[EdgeType, TypedEdges] = {}
    changed_dst: dict[EdgeType, np.ndarray] = {}
    for et, old in graph.edges.items():
        try:
            edges[et], changed_dst[et] = _apply_relation(et, old, update.edges.get(et), graph, nodes, new_rows)
        except GraphUpdateError as error:
            lines += [f"relation {edge_key(et)}: {p.message}" for p in error.problems]
    _refuse(lines, f"update of typed graph {graph.name!r}")
    new_graph = TypedGraphData(nodes, edges, name=graph.name)
    return TypedApplied(new_graph, old_rows, new_rows, feature_changed, changed_dst)


def _apply_relation(
    et: EdgeType,
    old: TypedEdges,
    update: GraphUpdate | None,
    graph: TypedGraphData,
    nodes: dict[str, GraphData],
    new_rows: dict[str, np.ndarray],
) -> tuple[TypedEdges, np.ndarray]:
    """One relation's updated edges and its destinations (new rows) whose in-edges changed;
    GraphUpdateError (`.problems`: UpdateProblems) listing the relation's defects."""
    s, _, d = et
    old_src = graph.nodes[s].id_index.lookup(old.src)[0]
    old_dst = graph.nodes[d].id_index.lookup(old.dst)[0]
    removed = (new_rows[s][old_src] < 0) | (new_rows[d][old_dst] < 0)
    update = update or GraphUpdate()
    problems: list[UpdateProblem | None] = []
    insert_problems, inserted_dst = _insert_problems(et, old, update, graph, nodes)
    problems += insert_problems
    delete_problems, deleted_edges = _delete_problems(et, old, update, graph, new_rows, old_src, old_dst)
    problems += delete_problems
    problems = [p for p in problems if p is not None and p.count > 0]
    if problems:
        error = GraphUpdateError("; ".join(p.message for p in problems if p is not None))
        error.problems = problems
        raise error
    if not removed.any() and not len(deleted_edges) and not len(update.edge_insert_src):
        return old, no_ids()
    removed[deleted_edges] = True
    kept = ~removed
    weight = None
    if old.weight is not None:
        weight = np.concatenate([old.weight[kept], _or_empty(update.edge_insert_weight, (0,))])
    attr = None
    if old.edge_attr is not None:
        attr = np.concatenate([old.edge_attr[kept], _or_empty(update.edge_insert_attr, (0, old.edge_attr_dim))])
    edges = TypedEdges(
        np.concatenate([old.src[kept], update.edge_insert_src]),
        np.concatenate([old.dst[kept], update.edge_insert_dst]),
        weight=weight,
        edge_attr=attr,
    )
    lost = new_rows[d][old_dst[removed]]
    return edges, npsets.unique(np.concatenate([lost[lost >= 0], inserted_dst]))


def _or_empty(values: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    return np.empty(shape, np.float32) if values is None else values


def _insert_problems(et, old: TypedEdges, update: GraphUpdate, graph: TypedGraphData, nodes) -> tuple[list, np.ndarray]:
    """(problems of the relation's edge inserts, their destinations' rows in the updated table)."""
    s, _, d = et
    src, dst, weight = update.edge_insert_src, update.edge_insert_dst, update.edge_insert_weight
    if not len(src):
        return [], no_ids()
    problems: list[UpdateProblem | None] = []
    new_dst_rows = no_ids()
    for side, ids, node_type in (("source", src, s), ("destination", dst, d)):
        rows, found = nodes[node_type].id_index.lookup(ids)
        was = graph.nodes[node_type].id_index.lookup(ids)[1]
        problems += [
            _edge_problem(
                "unknown_endpoint",
                EDGE_INSERT,
                ~found & ~was,
                src,
                dst,
                hint=f"neither a vertex of type {node_type!r} in the graph nor inserted by this update (their {side})",
            ),
            _edge_problem(
                "deleted_endpoint", EDGE_INSERT, ~found & was, src, dst, hint=f" (their {node_type!r} {side})"
            ),
        ]
        if side == "destination":
            new_dst_rows = rows[found]
    given = ~np.isnan(weight) if weight is not None else np.zeros(len(src), bool)
    if old.weight is not None:
        bad = given & (~np.isfinite(weight) | (weight < 0)) if weight is not None else given
        problems += [
            _edge_problem("missing_weight", EDGE_INSERT, ~given, src, dst),
            _edge_problem("bad_weight", EDGE_INSERT, bad, src, dst, weight),
        ]
    else:
        problems.append(_edge_problem("unexpected_weight", EDGE_INSERT, given, src, dst, weight))
    problems += _edge_attr_problems(update.edge_insert_attr, old.edge_attr_dim, src, dst)
    return problems, new_dst_rows


def _delete_problems(
    et, old: TypedEdges, update: GraphUpdate, graph, new_rows, old_src, old_dst
) -> tuple[list, np.ndarray]:
    """(problems of the relation's edge deletes, the old edge positions they remove)."""
    s, _, d = et
    src, dst, weight = update.edge_delete_src, update.edge_delete_dst, update.edge_delete_weight
    if not len(src):
        return [], no_ids()
    src_rows, src_found = graph.nodes[s].id_index.lookup(src)
    dst_rows, dst_found = graph.nodes[d].id_index.lookup(dst)
    unknown = ~src_found | ~dst_found
    gone = (src_found & (new_rows[s][src_rows] < 0)) | (dst_found & (new_rows[d][dst_rows] < 0))
    given = ~np.isnan(weight) if weight is not None else np.zeros(len(src), bool)
    problems = [
        _edge_problem(
            "unknown_endpoint", EDGE_DELETE, unknown, src, dst, hint=f"not a vertex of its type ({s!r} -> {d!r})"
        ),
        _edge_problem(
            "deleted_endpoint", EDGE_DELETE, gone, src, dst, hint=" (deleting a vertex already removes its edges)"
        ),
    ]
    if old.weight is None:
        problems.append(_edge_problem("unexpected_weight", EDGE_DELETE, given, src, dst, weight))
        given = np.zeros(len(src), bool)
    # _match_deletes reads a graph's rows: one row space big enough for both endpoint types
    rows = SimpleNamespace(
        num_nodes=max(graph.nodes[s].num_nodes, graph.nodes[d].num_nodes, 1),
        edge_src=old_src,
        edge_dst=old_dst,
        weight=old.weight,
    )
    removed, short = _match_deletes(rows, src_rows, dst_rows, weight, given, ~unknown & ~gone)
    if len(short[0]):
        s_rows, d_rows, w, deletes, present = short
        examples = []
        for i in checks.first_rows(np.ones(len(s_rows), bool), s_rows, d_rows):
            a, b = graph.nodes[s].ids[s_rows[i]], graph.nodes[d].ids[d_rows[i]]
            edge = fmt_edge(a, b) if np.isnan(w[i]) else fmt_edge_weight(a, b, w[i])
            examples.append(f"{edge} deleted {deletes[i]}x, present {present[i]}x")
        problems.append(make_problem("too_many_deletes", len(s_rows), examples, EDGE_DELETE))
    return problems, removed


__all__ = ["TypedApplied", "TypedGraphUpdate", "apply_typed", "validate_typed"]
