"""The k-hop in-neighbourhood computation graph of a request, and the layered forward over it.

WHY only the in-neighbourhood: a k-layer message-passing model computes a vertex's output from
its k-hop in-neighbourhood only. Let hop(v) be the in-hop distance from Q. Vertex v's layer-l
value is needed only if hop(v) <= k - l, and it is exact if (i) all of v's in-edges are present
(true for hop(v) <= k - 1, whose in-edges are all gathered), (ii) the layer-(l-1) values of its
in-neighbours are exact (they lie within k - l + 1 hops: induction), and (iii) the per-node
statistics used by the layer (GCN's degree, of the SOURCE too) are those of the whole union
graph. (iii) is the trap: a boundary vertex (hop k) sends messages at layer 1 scaled by its own
degree, but the subgraph holds none of its in-edges. So statistics are never computed on the
subgraph: they come from ServingContext.union_stats (G's cached degrees + request edges).

Local numbering puts vertices in BFS order (queries 0..B-1, then hop 1, hop 2, ...), so the
vertices needed at layer l are a PREFIX of length sizes[l], and with edges sorted by destination
the edges of layer l are a prefix too: layer l runs on exactly the vertices and edges it needs.

With `fanouts` the same builder samples (NS): each vertex expanded at hop h keeps at most
fanouts[h] of its in-edges, drawn without replacement (PyG NeighborLoader semantics: every
vertex is expanded once, at the hop it is first reached; hop-k vertices are not expanded).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sparkgnn.layers.base import propagate
from sparkgnn.serving.context import Meter, PreparedRequest, ServingContext


@dataclass
class CompGraph:
    nodes: np.ndarray  # union index of each local vertex, BFS order, queries first
    sizes: list  # sizes[l]: vertices whose layer-l value is needed (l = 0..k)
    src: np.ndarray  # local source of each edge (edges sorted by destination)
    dst: np.ndarray  # local destination
    weight: np.ndarray | None

    @property
    def num_layers(self) -> int:
        return len(self.sizes) - 1

    def num_edges_into(self, n: int) -> int:
        """Edges whose destination is among the first n local vertices (a prefix)."""
        return int(np.searchsorted(self.dst, n, side="left"))


def sample_in_edges(src, dst, weight, fanout: int, rng: np.random.Generator):
    """Keep at most `fanout` in-edges per destination, uniformly without replacement, vectorised:
    one random key per candidate edge, rank the keys within each destination, keep rank < fanout.
    Kept edges stay in candidate order."""
    if len(dst) == 0:
        return src, dst, weight
    keys = rng.random(len(dst))
    order = np.lexsort((keys, dst))
    sorted_dst = dst[order]
    starts = np.flatnonzero(np.r_[True, sorted_dst[1:] != sorted_dst[:-1]])
    group_start = np.repeat(starts, np.diff(np.r_[starts, len(dst)]))
    keep = np.zeros(len(dst), bool)
    keep[order[np.arange(len(dst)) - group_start < fanout]] = True
    return src[keep], dst[keep], None if weight is None else weight[keep]


def build_compgraph(
    ctx: ServingContext,
    prep: PreparedRequest,
    num_layers: int,
    fanouts: Sequence[int] | None = None,
    rng: np.random.Generator | None = None,
) -> CompGraph:
    """BFS over in-edges from Q for `num_layers` hops (see module doc)."""
    parts = [prep.query_union]
    seen = prep.query_union  # sorted (queries are N..N+B-1)
    frontier = prep.query_union
    e_src, e_dst, e_w = [], [], []
    for hop in range(num_layers):
        s, d, w = ctx.in_edges(prep, frontier)
        if fanouts is not None:
            s, d, w = sample_in_edges(s, d, w, int(fanouts[hop]), rng or np.random.default_rng(0))
        e_src.append(s)
        e_dst.append(d)
        e_w.append(w)
        cand = ctx.sets.unique(s)
        new = cand[~ctx.sets.member(cand, seen)]
        parts.append(new)
        seen = ctx.sets.unique(seen, new)
        frontier = new
    nodes = np.concatenate(parts)
    counts = np.cumsum([len(p) for p in parts])
    sizes = [int(counts[num_layers - l]) for l in range(num_layers + 1)]
    src, dst = np.concatenate(e_src), np.concatenate(e_dst)
    weight = None if e_w[0] is None else np.concatenate(e_w)
    src_l, dst_l = ctx.sets.positions(nodes, src), ctx.sets.positions(nodes, dst)
    order = np.argsort(dst_l, kind="stable")  # stable: keeps each vertex's in-edge order
    return CompGraph(nodes, sizes, src_l[order], dst_l[order], None if weight is None else weight[order])


def input_features(ctx: ServingContext, prep: PreparedRequest, cg: CompGraph, meter: Meter) -> torch.Tensor:
    """Layer-0 rows of the computation graph: the queries' own features, then G's stored
    features of every other vertex (the fetch that bytes_fetched counts)."""
    b = prep.batch_size
    with meter.timer("fetch_s"):
        xg = ctx.fetch_features(cg.nodes[b:], meter)
        x = np.concatenate([prep.request.x, xg]) if len(xg) else prep.request.x
    x = np.ascontiguousarray(x, dtype=np.float32)
    # a request decoded from the wire is a read-only view of its message; torch must not share it
    return torch.from_numpy(x if x.flags.writeable else x.copy())


StatsFn = Callable[[int, object], dict]


@torch.no_grad()
def run_layers(model, x0: torch.Tensor, cg: CompGraph, stats_for: StatsFn, meter: Meter) -> torch.Tensor:
    """The model's layers over the prefix structure of `cg`; returns the B query rows.
    `stats_for(l, conv)` gives conv l's statistics for all cg.sizes[0] local vertices."""
    with meter.timer("compute_s"):
        src = torch.from_numpy(cg.src)
        dst = torch.from_numpy(cg.dst)
        w = None if cg.weight is None else torch.from_numpy(cg.weight)
        attr = w if w is not None and w.dim() == 2 else None  # edge attributes (context.py)
        w = None if attr is not None else w
        h = model.pre(x0)
        for l, conv in enumerate(model.convs):
            n_in, n_out = cg.sizes[l], cg.sizes[l + 1]
            m = cg.num_edges_into(n_out)
            stats = {k: v[:n_in] for k, v in stats_for(l, conv).items()}
            h = propagate(
                conv,
                h[:n_in],
                src[:m],
                dst[:m],
                None if w is None else w[:m],
                pre_transform=model.choose_pre_transform(conv),
                stats=stats,
                edge_attr=None if attr is None or not conv.edge_attr_dim else attr[:m],
            )
            h = model.post(l, h[:n_out])
    return h
