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
the manifest's "summary"), computed by `local_metrics` with numpy products under exactly
the definitions of sparkgnn.pe.metrics (read its module doc), so a local store carries what a
Spark-written one does (the serving hot cache ranks vertices by them).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from sparkgnn.layers.base import aggregate_state, compute_stats
from sparkgnn.layers.generic import require_states
from sparkgnn.pe.store import PEStore
from sparkgnn.pe.writer import PEWriter

log = logging.getLogger(__name__)


def _tensor(a) -> torch.Tensor:
    return torch.from_numpy(np.require(a, requirements="W"))  # Arrow-backed arrays are read-only


@torch.no_grad()
def layer_outputs(graph, model, states: bool = True):
    """Yield (l, h^(l) [N, w], state^(l) [N, s] or None) for l = 1..k over the whole graph."""
    h = model.pre(_tensor(graph.x))
    for l in range(1, len(model.convs) + 1):
        h, state = whole_layer(graph, model, l, h)
        yield l, h, (state if states else None)


@torch.no_grad()
def whole_layer(graph, model, l: int, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(h^(l) [N, w], state^(l) [N, s]) of every vertex of `graph` from h^(l-1) of every vertex
    `h`: layer l as the precompute computes it (the refresh takes this path for a layer whose
    change reaches most of the graph, pe/refresh.py)."""
    conv = model.conv(l - 1)  # zero-based
    src, dst = _tensor(graph.edge_src), _tensor(graph.edge_dst)
    w = _tensor(graph.weight) if conv.uses_edge_weight and graph.weight is not None else None
    edge_attr = getattr(graph, "edge_attr", None)
    attr = _tensor(edge_attr) if conv.edge_attr_dim and edge_attr is not None else None
    stats = compute_stats(conv, src, dst, w, graph.num_nodes)
    state = aggregate_state(conv, h, src, dst, w, stats=stats, pre_transform=False, edge_attr=attr)
    return model.post(l - 1, conv.update(h, conv.aggregator.finalize(state), stats, False)), state


def local_metrics(graph, fanouts, hops: int, seeds=None, top_fractions=(0.01, 0.1)) -> dict:
    """Quiver's metrics of the GraphData `graph` in numpy: {"degrees", "psgs", "fap": pyarrow
    Tables (id + columns of the same names and types as sparkgnn.pe.metrics writes), "summary":
    the same JSON-able dict as compute_metrics}; PEWriter.commit_metrics takes it as is. `seeds`:
    FAP's p_0 per vertex (array in G's order, used as given), default uniform 1/|V|. The products
    are sparkgnn.pe.metrics.metrics_from_arrays' (the Spark precompute's one-pass metrics)."""
    from sparkgnn.pe.metrics import metrics_from_arrays

    return metrics_from_arrays(
        graph.ids, graph.edge_src, graph.edge_dst, fanouts, hops, seeds=seeds, top_fractions=top_fractions
    )


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
