"""apply(): a GraphUpdate applied to a GraphData, giving a NEW GraphData and the row and edge
mappings between the two (Applied) that an incremental refresh needs.

The update is validated first (validate.resolve, which also resolves every id), so a graph is
never half-updated; deletes apply before inserts (format.py: an update is a set, not a log).

* apply() is vectorised numpy (IdIndex lookups, bincount, lexsort): updates of 200K rows on graphs of
  millions of edges run in well under a second, with no Python loop over rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparkgnn.graph import checks
from sparkgnn.graph.data import GraphData
from sparkgnn.graph.updates.format import GraphUpdate
from sparkgnn.graph.updates.validation import Endpoints, resolve


@dataclass(eq=False)
class Applied:
    """The result of apply(): the new graph and how its rows and edges relate to the old one's.

    The new graph holds the kept vertices in the old order, then the inserted ones in update order;
    the kept edges in the old order, then the inserted ones in update order.
    """

    graph: GraphData
    old_rows: np.ndarray  # int64 [N']: each new row's row in the old graph, -1 for an inserted vertex
    new_rows: np.ndarray  # int64 [N]: each old row's row in the new graph, -1 for a deleted vertex
    removed_edges: np.ndarray  # old edge positions that are gone (deleted, or touching a deleted vertex)
    kept_edges: np.ndarray  # old edge positions that survive, in their new order (new edges 0..len-1)
    inserted_edges: np.ndarray  # new edge positions of the inserted edges
    feature_changed: np.ndarray  # new rows whose x differs from before, or that were inserted


def apply(update: GraphUpdate, graph: GraphData) -> Applied:
    """Validate `update` against `graph` (raising GraphUpdateError, `graph` untouched) and return the
    updated graph as a NEW GraphData plus the row and edge mappings an incremental refresh needs.
    feature_changed holds only the feature updates whose values really differ."""
    resolved = resolve(update, graph)
    kept_rows = np.flatnonzero(~resolved.deleted)
    n_kept, n_inserted = len(kept_rows), len(update.vertex_insert_ids)
    new_rows = np.full(graph.num_nodes, -1, np.int64)
    new_rows[kept_rows] = np.arange(n_kept)
    old_rows = np.concatenate([kept_rows, np.full(n_inserted, -1, np.int64)])

    ids = np.concatenate([graph.ids[kept_rows], update.vertex_insert_ids])
    x = np.empty((n_kept + n_inserted, graph.feature_dim), np.float32)
    np.take(graph.x, kept_rows, axis=0, out=x[:n_kept])
    if n_inserted:
        x[n_kept:] = update.vertex_insert_x
    updated_rows = new_rows[resolved.feature_update_rows]
    changed = np.zeros(len(updated_rows), bool)
    if len(updated_rows):
        changed = np.any(x[updated_rows] != update.feature_update_x, axis=1)
        x[updated_rows] = update.feature_update_x
    feature_changed = np.concatenate([np.sort(updated_rows[changed]), np.arange(n_kept, n_kept + n_inserted)])

    y = split = None
    if graph.y is not None:
        y = np.concatenate([graph.y[kept_rows], np.full(n_inserted, -1, np.int64)])
    if graph.split is not None:
        split = np.concatenate([graph.split[kept_rows], np.full(n_inserted, checks.NO_SPLIT, graph.split.dtype)])

    removed = resolved.deleted[graph.edge_src] | resolved.deleted[graph.edge_dst]
    removed[resolved.deleted_edges] = True
    kept_edges = np.flatnonzero(~removed)

    def new_endpoints(old: np.ndarray, inserted: Endpoints) -> np.ndarray:
        landed = np.where(inserted.in_graph, new_rows[inserted.graph_rows], n_kept + inserted.insert_positions)
        return np.concatenate([new_rows[old[kept_edges]], landed])

    weight = None
    if graph.weight is not None:
        inserted_weight = update.edge_insert_weight
        if inserted_weight is None:  # validated: only possible without edge inserts
            inserted_weight = np.empty(0, np.float32)
        weight = np.concatenate([graph.weight[kept_edges], inserted_weight])
    n_edges_kept = len(kept_edges)
    new_graph = GraphData(
        ids,
        x,
        new_endpoints(graph.edge_src, resolved.insert_src),
        new_endpoints(graph.edge_dst, resolved.insert_dst),
        weight=weight,
        y=y,
        split=split,
        name=graph.name,
    )
    return Applied(
        graph=new_graph,
        old_rows=old_rows,
        new_rows=new_rows,
        removed_edges=np.flatnonzero(removed),
        kept_edges=kept_edges,
        inserted_edges=np.arange(n_edges_kept, n_edges_kept + len(update.edge_insert_src)),
        feature_changed=feature_changed,
    )
