"""Single-machine PE precomputation: the same store (layout, manifest, commit protocol, raw-space
states) as the Spark job, computed with torch on a graph that fits in one process.

WHY it exists next to the Spark job: serving tests, the serving benchmark and small deployments
(Cora, a 1M-edge graph) need stores in seconds, not a Spark job per store; and a second, totally
independent producer of the same format is how we check that serving reads the format and not one
producer's accidents (tests open stores from both). What it must agree on with
sparkgnn.engine.precompute: h^(l) is layer l's output after its node-wise ops (the next layer's
input), and the state of layer l is the MERGED aggregation state over all of a node's in-edges
(self-loop policy applied), in RAW message space (pre_transform=False), with G's statistics.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from sparkgnn.layers.base import aggregate_state, compute_stats
from sparkgnn.pe.store import PEStore
from sparkgnn.pe.writer import PEWriter


@torch.no_grad()
def layer_outputs(graph, model, states: bool = True):
    """Yield (l, h^(l) [N, w], state^(l) [N, s] or None) for l = 1..k over the whole graph."""

    def tensor(a):
        return torch.from_numpy(np.require(a, requirements="W"))  # Arrow-backed arrays are read-only

    src, dst = tensor(graph.edge_src), tensor(graph.edge_dst)
    weight = None if graph.weight is None else tensor(graph.weight)
    h = model.pre(tensor(graph.x))
    for l, conv in enumerate(model.convs):
        w = weight if conv.uses_edge_weight else None
        stats = compute_stats(conv, src, dst, w, graph.num_nodes)
        state = aggregate_state(conv, h, src, dst, w, stats=stats, pre_transform=False)
        h = model.post(l, conv.update(h, conv.aggregator.finalize(state), stats, False))
        yield l + 1, h, (state if states else None)


def precompute_local(graph, model, store_root, states: bool = True, force: bool = False, log=print) -> PEStore:
    """Write h^(1..k) (and states) of `model` over the GraphData `graph` into `store_root` and
    return the opened (verified) store. Layers already committed for the same (graph, model) are
    kept unless `force` (they are recomputed in memory anyway: layer l needs h^(l-1))."""
    writer = PEWriter(store_root, graph, model, with_states=states, force=force, log=log)
    done = set(writer.completed_layers())
    started = time.perf_counter()
    for l, h, state in layer_outputs(graph, model, states):
        if l in done:
            continue
        writer.commit_layer_arrays(l, graph.ids, h.numpy(), None if state is None else state.numpy())
    writer.finish({"seconds": round(time.perf_counter() - started, 3)})
    if log:
        log(
            f"sparkgnn precompute_local: {model.num_layers} layers of {graph.num_nodes} nodes in "
            f"{time.perf_counter() - started:.1f} s -> {writer.base}"
        )
    return PEStore.open(store_root, model=model, graph=graph)
