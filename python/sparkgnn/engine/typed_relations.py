"""The per-relation pieces of a typed round (engine/typed.py's module doc): the homogeneous graph
one relation's conv runs over (a type's rows, or two types' rows with ids mapped to 2*id and
2*id+1), its vertex and edge counts and fingerprint from the typed graph's graph.json, the
relation's one-conv model, and the round's list of relation jobs the engine then runs."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from sparkgnn.layers.hetero import EdgeType, HeteroRound, edge_key
from sparkgnn.layers.nodeops import NodeOpStack

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from sparkgnn.engine.typed_ids import IdSet
    from sparkgnn.graph.typed_spark import TypedGraph


def relation_graph(
    values: dict[str, DataFrame],
    edges: DataFrame,
    edge_type: EdgeType,
    width: int,
    name: str,
    *,
    fingerprint: str | None = None,
    rows: tuple[IdSet, IdSet] | None = None,
    counts: dict[str, int] | None = None,
    row_files: Any = None,
):
    """The homogeneous graph one relation's conv runs over (module doc); `rows`: (the source-side
    rows read, the destination rows given) of a pruned run, to which the edges are cut; `counts`:
    its vertex and edge counts when the typed graph's graph.json vouches for them (relation_counts),
    or, with `rows`, its vertex count (the walk's sizes), the cut edges then counted here: one
    light job over the edges, where the job's own count would read its vertices through the
    types' input ops; `row_files`: the local files of its ids and edges (relation_row_files), which
    prepare's tasks read instead of these frames (a whole-graph relation's only)."""
    from sparkgnn.engine.khop import semi_join
    from sparkgnn.graph import Graph

    s, r, d = edge_type
    edges = edges.select("src", "dst")
    if rows is not None:
        # within one type: the edges among the rows read (a multi-hop conv reads in-edges of
        # rows it does not give); between two: the in-edges of the rows given (their sources
        # are among the rows read, engine.typed_ids)
        read, given = rows
        edges = semi_join(edges, read.frame if s == d else given.frame, read.size if s == d else given.size)
        if s == d:
            edges = edges.join(read.frame.withColumnRenamed("id", "src"), "src", "left_semi")
        if counts is not None:
            counts = dict(counts, num_edges=edges.count())
    if s == d:
        vertices = values[s].selectExpr("id", "h AS x")
    else:
        vertices = (
            values[s]
            .selectExpr(f"{mapped_id('id', s, 0)} AS id", "h AS x")
            .unionByName(values[d].selectExpr(f"{mapped_id('id', d, 1)} AS id", "h AS x"))
        )
        edges = edges.selectExpr(f"{mapped_id('src', s, 0)} AS src", f"{mapped_id('dst', d, 1)} AS dst")
    label = f"{name}/{edge_key(edge_type)}"
    meta = {"validated": True, "feature_dim": width, "name": label}
    if fingerprint is not None:
        meta["fingerprint"] = fingerprint
    if counts:
        meta.update(counts, num_classes=0)
    graph = Graph(vertices, edges, name=label, meta=meta)
    if rows is None:
        graph.row_files = row_files
    return graph


def relation_row_files(graph: TypedGraph, edge_type: EdgeType):
    """The local files of a whole-graph relation's ids and edges (engine.prepare_tasks.RowFiles),
    ids mapped as relation_graph maps them, so prepare's tasks write its layout in two passes
    over the relation's own folders (the Spark SQL prepare runs a score of jobs per relation);
    None when the typed graph is not a local directory."""
    from sparkgnn import files
    from sparkgnn.engine.prepare_tasks import IdMap, RowFiles
    from sparkgnn.graph.typed_io import edge_folder, vertex_folder

    if not graph.path or not files.is_local(graph.path):
        return None
    s, _, d = edge_type
    edges = files.join(graph.path, edge_folder(edge_type))
    if s == d:
        return RowFiles(edges, ((files.join(graph.path, vertex_folder(s)), IdMap()),))
    src, dst = IdMap(2, 0, s), IdMap(2, 1, d)
    vertices = ((files.join(graph.path, vertex_folder(s)), src), (files.join(graph.path, vertex_folder(d)), dst))
    return RowFiles(edges, vertices, src, dst)


def relation_counts(graph: TypedGraph, edge_type: EdgeType) -> dict[str, int]:
    """{num_vertices, num_edges} of a whole-graph relation's graph from the typed graph's trusted
    graph.json (the source and destination types' rows, the relation's edges), so the relation
    job does not count them in Spark; {} when graph.json does not give them."""
    s, _, d = edge_type
    types = graph.meta.get("types") or {}
    relation = (graph.meta.get("relations") or {}).get(edge_key(edge_type), {})
    sizes = [types.get(t, {}).get("num_vertices") for t in dict.fromkeys((s, d))]
    if "num_edges" not in relation or any(n is None for n in sizes):
        return {}
    return {"num_vertices": int(sum(sizes)), "num_edges": int(relation["num_edges"])}


def relation_fingerprint(graph_fingerprint: str, edge_type: EdgeType) -> str:
    """The fingerprint a whole-graph relation job's graph carries (module doc): 32 hex digits, like
    a content fingerprint, naming the typed graph and the relation (its ids and edges)."""
    import hashlib

    text = f"sparkgnn-typed-relation|1|{graph_fingerprint}|{edge_key(edge_type)}"
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def mapped_id(column: str, node_type: str, side: int) -> str:
    """SQL for `2 * column + side`, failing the job with a clear message for an id beyond
    +-2^62, where the doubled id would not fit a long (whatever spark.sql.ansi.enabled says)."""
    message = f"node type {node_type}: id beyond +-2^62 cannot be mapped for a relation between two types"
    return f"CASE WHEN abs({column}) < {1 << 62} THEN {column} * 2 + {side} ELSE raise_error('{message}') END"


def relation_model(conv, edge_type: EdgeType, index: int, model_fingerprint: str):
    """The relation's conv as a one-conv Model whose spec names the typed model and the round
    (module doc: its fingerprint keys the run)."""
    from sparkgnn.models import Model

    spec = {
        "format": "sparkgnn.Model",
        "version": 1,
        "source": f"typed relation {edge_key(edge_type)}, round {index} of typed model {model_fingerprint}",
        "output": "embedding",
        "in_dim": conv.in_dim,
    }
    return Model(spec, _modules=(NodeOpStack(), [copy.deepcopy(conv)], [NodeOpStack()]))


def relation_jobs(
    graph: TypedGraph,
    rnd: HeteroRound,
    index: int,
    need: set[str],
    values: dict[str, DataFrame],
    widths: dict[str, int],
    common: dict,
    *,
    rows: tuple[dict[str, IdSet], dict[str, IdSet]] | None,
    fingerprints: tuple[str | None, str],
) -> list[tuple[EdgeType, Any, Any, Any, dict]]:
    """Round `index`'s relation jobs, one per relation into a needed type: (edge type, conv,
    relation graph over `values`, one-conv model, the job's options); arguments as _run_round's."""
    jobs = []
    for edge_type, conv in rnd.conv_items():
        s, _, d = edge_type
        if d not in need:
            continue
        options = dict(common)
        cut = None
        fingerprint = relation_fingerprint(fingerprints[0], edge_type) if fingerprints[0] else None
        counts = relation_counts(graph, edge_type)
        if rows is not None:
            cut = (rows[0][s], rows[1][d])
            given = cut[1].frame
            options["ids"] = given.selectExpr(f"{mapped_id('id', d, 1)} AS id") if s != d else given
            options["ids_checked"] = True  # rows of the walk from checked ids (engine.typed_ids): no second check
            # its vertices: the round's rows of its types (relation_graph counts the cut edges)
            counts = {"num_vertices": rows[0][s].size + (rows[0][d].size if s != d else 0)}
        rel_graph = relation_graph(
            values,
            graph.edges[edge_type],
            edge_type,
            widths[s],
            graph.name,
            fingerprint=fingerprint,
            rows=cut,
            counts=counts,
            row_files=relation_row_files(graph, edge_type) if rows is None else None,
        )
        jobs.append((edge_type, conv, rel_graph, relation_model(conv, edge_type, index, fingerprints[1]), options))
    return jobs


__all__ = [
    "mapped_id",
    "relation_counts",
    "relation_fingerprint",
    "relation_graph",
    "relation_jobs",
    "relation_model",
    "relation_row_files",
]
