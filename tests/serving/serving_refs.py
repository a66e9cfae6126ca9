"""Independent references for the reuse modes, built from the model's own layers on explicit
graphs (no serving code): the union graph's layer-1 values, and layer 2 over given inputs."""

import numpy as np
import torch

from sparkgnn.layers.base import propagate


def union_edges(G, r):
    """Union graph G + Q + request edges in union indices (query i -> N + i)."""
    n = G.num_nodes
    order = np.argsort(r.qid)

    def union(ids):
        g, found = G.id_index.lookup(ids)
        return np.where(found, g, n + order[np.searchsorted(r.qid[order], ids).clip(0, len(order) - 1)])

    src = np.concatenate([G.edge_src, union(r.src)])
    dst = np.concatenate([G.edge_dst, union(r.dst)])
    w = None if G.weight is None else np.concatenate([G.weight, np.ones(len(r.src), np.float32)])
    return torch.from_numpy(src), torch.from_numpy(dst), None if w is None else torch.from_numpy(w)


@torch.no_grad()
def layer(model, l, h, edges):
    src, dst, w = edges
    return model.post(l, propagate(model.conv(l), h, src, dst, w))


@torch.no_grad()
def two_layer_with_layer1(model, G, r, layer1_rows):
    """Layer 2 on the union graph where layer-1 values are: union-graph values for queries and
    for G rows in `layer1_rows`, the G-only (stored) values for every other G row."""
    edges = union_edges(G, r)
    x = torch.from_numpy(np.concatenate([G.x, r.x]))
    h0 = model.pre(x)
    h1_union = layer(model, 0, h0, edges)
    g_edges = (
        torch.from_numpy(G.edge_src),
        torch.from_numpy(G.edge_dst),
        None if G.weight is None else torch.from_numpy(G.weight),
    )
    h1_g = layer(model, 0, model.pre(torch.from_numpy(G.x)), g_edges)
    h1 = h1_union.clone()
    keep_stored = np.ones(G.num_nodes, bool)
    keep_stored[layer1_rows] = False
    h1[: G.num_nodes][torch.from_numpy(keep_stored)] = h1_g[torch.from_numpy(keep_stored)]
    return layer(model, 1, h1, edges)[G.num_nodes :].numpy(), h1_union, h1_g
