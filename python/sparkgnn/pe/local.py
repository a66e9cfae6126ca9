"""Single-machine PE precomputation: the same store (layout, manifest, commit protocol, raw-space
states) as the Spark job, computed with torch on a graph that fits in one process.

WHY it exists next to the Spark job: serving tests, the serving benchmark and small deployments
(Cora, a 1M-edge graph) need stores in seconds, not a Spark job per store; and a second, totally
independent producer of the same format is how we check that serving reads the format and not one
producer's accidents (tests open stores from both). What it must agree on with
sparkgnn.engine.precompute: h^(l) is layer l's output after its node-wise ops (the next layer's
input), and the state of layer l is the MERGED aggregation state over all of a node's in-edges
(self-loop policy applied), in RAW message space (pre_transform=False), with G's statistics.

With `metrics=True` it also commits Quiver's workload metrics ("degrees", "psgs", "fap" tables and
the manifest's "summary"), computed by `local_metrics` with scipy sparse products under exactly
the definitions of sparkgnn.pe.metrics (read its module doc), so a local store carries what a
Spark-written one does (the serving hot cache ranks vertices by them).
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import pyarrow as pa
import torch

from sparkgnn.layers.base import aggregate_state, compute_stats
from sparkgnn.layers.generic import require_states
from sparkgnn.pe.store import PEStore
from sparkgnn.pe.writer import PEWriter

log = logging.getLogger(__name__)


@torch.no_grad()
def layer_outputs(graph, model, states: bool = True):
    """Yield (l, h^(l) [N, w], state^(l) [N, s] or None) for l = 1..k over the whole graph."""

    def tensor(a):
        return torch.from_numpy(np.require(a, requirements="W"))  # Arrow-backed arrays are read-only

    src, dst = tensor(graph.edge_src), tensor(graph.edge_dst)
    weight = None if graph.weight is None else tensor(graph.weight)
    edge_attr = getattr(graph, "edge_attr", None)
    edge_attr = None if edge_attr is None else tensor(edge_attr)
    h = model.pre(tensor(graph.x))
    for l, conv in enumerate(model.convs):
        w = weight if conv.uses_edge_weight else None
        attr = edge_attr if conv.edge_attr_dim else None
        stats = compute_stats(conv, src, dst, w, graph.num_nodes)
        state = aggregate_state(conv, h, src, dst, w, stats=stats, pre_transform=False, edge_attr=attr)
        h = model.post(l, conv.update(h, conv.aggregator.finalize(state), stats, False))
        yield l + 1, h, (state if states else None)


def _transition_matrix(graph):
    """Quiver's A as a scipy CSR matrix: A[i][j] = (#edges j->i) / in_degree(i) (dense indices;
    parallel edges add up, a vertex without in-edges has an all-zero row) -- metrics._transitions."""
    import scipy.sparse as sp

    n = graph.num_nodes
    ind = np.bincount(graph.edge_dst, minlength=n).astype(np.float64)
    p = 1.0 / ind[graph.edge_dst] if graph.num_edges else np.zeros(0)
    return sp.csr_matrix((p, (graph.edge_dst, graph.edge_src)), shape=(n, n)), ind


def local_metrics(graph, fanouts, hops: int, seeds=None, top_fractions=(0.01, 0.1)) -> dict:
    """Quiver's metrics of the GraphData `graph` in numpy/scipy: {"degrees", "psgs", "fap":
    pyarrow Tables (id + columns of the same names and types as sparkgnn.pe.metrics writes),
    "summary": the same JSON-able dict as compute_metrics}; PEWriter.commit_metrics takes it as
    is. `seeds`: FAP's p_0 per vertex (array in G's order, used as given), default uniform 1/|V|.
    Same recurrences (Horner's rule) as the Spark version, so values agree up to float summation
    order."""
    fanouts = [int(f) for f in fanouts]
    if not fanouts or min(fanouts) < 0:
        raise ValueError(f"fanouts must be a non-empty list of non-negative ints, got {fanouts}")
    hops = int(hops)
    if hops < 0:
        raise ValueError(f"hops must be >= 0, got {hops}")
    n = graph.num_nodes
    ids = np.asarray(graph.ids, dtype=np.int64)
    in_deg = graph.in_degree().astype(np.int64)
    out_deg = graph.out_degree().astype(np.int64)
    a, ind = _transition_matrix(graph)
    # PSGS: Q - 1 = c_1 + A (c_2 + A (c_3 + ...)), c_k = min(deg, l_k)
    r = np.minimum(ind, fanouts[-1])
    for l in reversed(fanouts[:-1]):
        r = np.minimum(ind, l) + a @ r
    q = r + 1.0
    # FAP: P = p_0 + A^T (p_0 + A^T (...)), `hops` products
    p0 = np.full(n, 1.0 / max(n, 1)) if seeds is None else np.asarray(seeds, dtype=np.float64)
    if p0.shape != (n,):
        raise ValueError(f"seeds must hold one probability per vertex ({n}), got shape {p0.shape}")
    at = a.T.tocsr()
    p = p0.copy()
    for _ in range(hops):
        p = p0 + at @ p
    total = float(p.sum())
    ranked = np.sort(p)[::-1]
    top = {}
    for frac in top_fractions:
        k = max(1, math.ceil(frac * n)) if n else 0
        mass = float(ranked[:k].sum()) if k else 0.0
        top[f"top_{frac:g}"] = {"nodes": k, "fap_share": (mass / total) if total else 0.0}

    def mean(v) -> float:
        return float(v.mean()) if n else 0.0

    summary = {
        "fanouts": fanouts,
        "hops": hops,
        "seeds": "uniform" if seeds is None else "given",
        "num_vertices": n,
        "in_degree": {"mean": mean(in_deg), "max": int(in_deg.max()) if n else 0},
        "out_degree": {"mean": mean(out_deg), "max": int(out_deg.max()) if n else 0},
        "psgs": {"mean": mean(q), "max": float(q.max()) if n else 0.0},
        "fap": {"total": total, "top_mass": top},
    }
    return {
        "degrees": pa.table({"id": ids, "in_degree": in_deg, "out_degree": out_deg}),
        "psgs": pa.table({"id": ids, "psgs": q.astype(np.float64)}),
        "fap": pa.table({"id": ids, "fap": p.astype(np.float64)}),
        "summary": summary,
    }


def precompute_local(
    graph,
    model,
    store_root,
    states: bool = True,
    force: bool = False,
    metrics: bool = False,
    fanouts=(25, 10),
    hops: int | None = None,
) -> PEStore:
    """Write h^(1..k) (and states) of `model` over the GraphData `graph` into `store_root` and
    return the opened (verified) store. Layers already committed for the same (graph, model) are
    kept unless `force` (they are recomputed in memory anyway: layer l needs h^(l-1)).
    `metrics`: also commit Quiver's workload metrics (local_metrics; `fanouts` for PSGS, `hops`
    for FAP, default the model's layer count -- the Spark job's options and defaults), unless the
    store already has them. Off by default: most stores only serve embeddings, and the metrics
    add three tables to the manifest. A TypedGraphData with a HeteroModel writes a typed store
    (pe/typed.py: per round and node type h only) and returns the opened TypedPEStore."""
    from sparkgnn.graph.typed import TypedGraphData
    from sparkgnn.models.hetero import HeteroModel

    if isinstance(graph, TypedGraphData) or isinstance(model, HeteroModel):
        from sparkgnn.pe.typed import precompute_typed_local

        if isinstance(graph, TypedGraphData) != isinstance(model, HeteroModel):
            from sparkgnn.errors import UnsupportedModelError

            raise UnsupportedModelError("a typed graph runs a typed model (a HeteroModel) and only a typed one")
        return precompute_typed_local(graph, model, store_root, force=force)  # type: ignore[return-value]
    require_states(model, "the PE precompute")
    # edge features: the messages read the graph's edge_attr rows as batch inference does; a
    # store of such a model is refused by refresh and serving (their edge rows carry none yet)
    model.check_edge_attr(getattr(graph, "edge_attr_dim", 0) or None, where=f"graph {graph.name!r}")
    writer = PEWriter(store_root, graph, model, with_states=states, force=force)
    done = set(writer.completed_layers())
    started = time.perf_counter()
    for l, h, state in layer_outputs(graph, model, states):
        if l in done:
            continue
        writer.commit_layer_arrays(l, graph.ids, h.numpy(), None if state is None else state.numpy())
    if metrics and not writer.has_metrics():
        writer.commit_metrics(local_metrics(graph, list(fanouts), hops or model.num_rounds))
    writer.finish({"seconds": round(time.perf_counter() - started, 3)})
    log.info(
        f"sparkgnn precompute_local: {model.num_rounds} layers of {graph.num_nodes} nodes in "
        f"{time.perf_counter() - started:.1f} s -> {writer.base}"
    )
    return PEStore.open(store_root, model=model, graph=graph)
