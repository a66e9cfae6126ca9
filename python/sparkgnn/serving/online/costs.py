"""What the front end knows of G: ids, in-degrees and PSGS, and nothing heavier.

WHY the front end keeps these and not the store: the service's workers hold the PE store (the
embeddings, states and features, the bulk of the bytes); the front end only has to (1) refuse a
malformed request before it queues (unknown ids, ids that collide with G, wrong width, NaN), and
(2) predict what a request will cost, for GSM's scheduler (in-degree sums, section IV-A) and its
batch divider (per-layer subgraph sizes, IV-B), and for Quiver's router (PSGS, section 4). Three
int64/float64 columns per vertex: 24 bytes a vertex, against the store's hundreds.

Cost of a request (GSM's observation 2: processing time follows the in-degree of the targets): a
query q's in-degree in the union graph plus the in-degrees of its G in-neighbours (the vertices
its first two layers aggregate over). Its layer subgraph sizes: the queries and their G
in-neighbours at the last layer, then those neighbours' in-degree sum one layer down, and so on.
PSGS (Quiver): 1 per query plus the stored PSGS of each G in-neighbour (the metrics table a
precompute job writes, `psgs`; without it, 1 + the in-degree).
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow.dataset as ds

from sparkgnn.serving.online.scheduler import Pending
from sparkgnn.serving.request import Request


class GraphFacts:
    """G's ids (an IdIndex, as GraphData has: Request.problems reads `id_index` and
    `feature_dim`, so the front end validates with the same sentences a worker gives), and the
    in-degree and PSGS of each vertex, in the ids' order."""

    def __init__(self, ids: np.ndarray, in_degree: np.ndarray, psgs: np.ndarray, feature_dim: int, num_layers: int):
        from sparkgnn.graph.index import IdIndex

        self.id_index = IdIndex(ids)
        self.in_degree = np.asarray(in_degree, np.float64)
        self.psgs = np.asarray(psgs, np.float64)
        self.feature_dim = int(feature_dim)
        self.num_layers = int(num_layers)

    @classmethod
    def load(cls, graph_dir: str, store=None, num_layers: int = 2) -> GraphFacts:
        """Ids and feature width from the graph's vertices, in-degrees from its edges (two int64
        columns are read, never the features), PSGS from the store's metrics when it has them."""
        from sparkgnn.graph import layout
        from sparkgnn.graph.index import IdIndex

        base = layout.strip_scheme(str(graph_dir))
        vertices = ds.dataset(os.path.join(base, layout.VERTICES_DIR), format="parquet")
        ids = vertices.to_table(columns=["id"]).column("id").to_numpy()
        first = next(iter(vertices.to_batches(columns=["x"], batch_size=1)), None)
        width = len(first.column(0)[0].as_py()) if first is not None and first.num_rows else 0
        dst = ds.dataset(os.path.join(base, layout.EDGES_DIR), format="parquet").to_table(columns=["dst"])
        index = IdIndex(ids)
        rows, _ = index.lookup(dst.column("dst").to_numpy())
        return cls._with_psgs(index, rows, width, store, num_layers)

    @classmethod
    def of_graph(cls, graph, store=None, num_layers: int = 2) -> GraphFacts:
        """The facts of a graph held in memory (a GraphData: a followed version built from a
        published delta, pe/published.py), as `load` reads them from a directory."""
        return cls._with_psgs(graph.id_index, graph.edge_dst, graph.feature_dim, store, num_layers)

    @classmethod
    def _with_psgs(cls, index, dst_rows: np.ndarray, width: int, store, num_layers: int) -> GraphFacts:
        """The facts from G's id index and its edges' destination rows; PSGS from the store's
        metrics when it has them, else 1 + in-degree."""
        ids = index.ids
        in_degree = np.bincount(dst_rows, minlength=len(ids)).astype(np.float64)
        psgs = 1.0 + in_degree
        if store is not None and "psgs" in (store.manifest.get("metric_tables") or []):
            table = store.metrics_table("psgs")
            psgs = np.empty(len(ids), np.float64)
            psgs[index.lookup(table.column("id").to_numpy())[0]] = table.column("psgs").to_numpy()
        return cls(ids, in_degree, psgs, width, num_layers)

    def fresh_id(self) -> int:
        """An id above every vertex of G (a query id that cannot collide)."""
        return int(self.id_index.ids.max()) + 1 if len(self.id_index.ids) else 0

    def problems(self, request: Request) -> list[str]:
        """Request.problems against G's ids (the same sentences a worker would give)."""
        return request.problems(graph=self)

    def pending(self, request: Request, key, group: str, arrived: float) -> tuple[Pending, float]:
        """The scheduler's view of a (valid) request, and its PSGS (for the router)."""
        m = len(request.src)
        pos, found = self.id_index.lookup(np.concatenate([request.src, request.dst]))  # one lookup for both ends
        src_pos, src_in_g, dst_in_g = pos[:m], found[:m], found[m:]
        into_query = ~dst_in_g  # edges whose destination is a query (in a valid request: not in G)
        g_sources = src_pos[into_query & src_in_g]
        # distinct sources: sorted, then those that differ from their predecessor (np.unique's
        # answer without its fixed cost, which dominated a request of a few edges)
        neighbours = np.sort(g_sources)
        if len(neighbours) > 1:
            neighbours = neighbours[np.concatenate(([True], neighbours[1:] != neighbours[:-1]))]
        cost = float(into_query.sum()) + float(self.in_degree[g_sources].sum())
        # last layer: the queries and their G in-neighbours; every layer below: the neighbours'
        # in-edges (a two-hop estimate: the front end keeps no index to walk further)
        below = int(self.in_degree[neighbours].sum())
        sizes = (request.batch_size + len(neighbours),) + (below,) * (self.num_layers - 1)
        psgs = float(request.batch_size) + float(self.psgs[neighbours].sum())
        pending = Pending(key=key, cost=cost, hop_sizes=sizes, group=group, arrived=arrived, queries=request.batch_size)
        return pending, psgs
