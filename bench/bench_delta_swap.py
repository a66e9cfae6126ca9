"""Delta swap against whole swap (not part of `make bench`): how long a serving worker takes to
load the next version of its deployment after `refresh_local` commits a small row-level store
version, read whole (Deployment(spec): graph, store opened with checksums, every layer read and
aligned) against patched from the version it serves (serving.online.delta). A seeded synthetic
graph (20K nodes / 200K edges / 32-d by default), a 2-layer SAGE-mean store with states, an
update of `--inserts` random edge inserts. Both loads end with the EXACT engine built and its
store aligned, and their aligned arrays are checked equal. Prints the median of `--repeat` loads
of each.

    .venv/bin/python bench/bench_delta_swap.py [--nodes N --edges E --dim F --inserts I --repeat R]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

log = logging.getLogger("bench_delta_swap")


def _model(dim: int):
    import torch
    import torch_geometric.nn as gnn

    from sparkgnn import Model

    torch.manual_seed(0)
    return Model.from_pyg(gnn.GraphSAGE(dim, 64, 2, out_channels=16))


def _ready(dep):
    """`dep` with its EXACT engine built and its store aligned (what a swap's warm-up leaves)."""
    dep.engine("exact")
    return dep.context.stored_layers(dep.store, dep.model, states=True)


def run(nodes: int, edges: int, dim: int, inserts: int, repeat: int, seed: int = 0) -> dict:
    from sparkgnn.datasets.synthetic import synthetic_graph
    from sparkgnn.graph import write_graph_dir
    from sparkgnn.graph.updates import GraphUpdate
    from sparkgnn.pe.local import precompute_local
    from sparkgnn.pe.refresh import refresh_local
    from sparkgnn.serving.online.batch_op import Deployment
    from sparkgnn.serving.online.delta import patched_deployment

    work = tempfile.mkdtemp(prefix="delta_swap_")
    try:
        graph = synthetic_graph(nodes, edges, dim, seed=seed)
        model = _model(dim)
        model_path, g1, g2, root = (os.path.join(work, n) for n in ("model.pt", "g1", "g2", "store"))
        model.save(model_path)
        write_graph_dir(graph, g1)
        precompute_local(graph, model, root)
        rng = np.random.default_rng(seed)
        update = GraphUpdate(
            edge_insert_src=rng.choice(graph.ids, inserts), edge_insert_dst=rng.choice(graph.ids, inserts)
        )
        refresh_local(graph, update, model, root, out_graph=g2)
        spec1, spec2 = ({"graph": g, "model": model_path, "store": root, "options": {}, "cache": {}} for g in (g1, g2))
        served = Deployment(spec1)
        _ready(served)
        whole_s, delta_s, rows = [], [], 0
        for _ in range(repeat):
            started = time.perf_counter()
            whole = _ready(Deployment(spec2))
            whole_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            dep, why = patched_deployment(served, spec2)
            if dep is None:
                raise SystemExit(f"no delta swap: {why}")
            patched = _ready(dep)
            delta_s.append(time.perf_counter() - started)
            rows = dep.loaded["rows_patched"]
            assert all(np.array_equal(patched.h[l], whole.h[l]) for l in whole.h)
            assert all(np.array_equal(patched.state[l], whole.state[l]) for l in whole.state)
        out = {
            "graph": f"{graph.num_nodes} nodes / {graph.num_edges} edges / {dim}-d",
            "inserts": inserts,
            "rows_patched": rows,
            "whole_swap_s": round(statistics.median(whole_s), 4),
            "delta_swap_s": round(statistics.median(delta_s), 4),
        }
        out["ratio"] = round(out["whole_swap_s"] / max(out["delta_swap_s"], 1e-9), 2)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20_000)
    parser.add_argument("--edges", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--inserts", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    result = run(args.nodes, args.edges, args.dim, args.inserts, args.repeat)
    for key, value in result.items():
        log.info(f"{key}: {value}")


if __name__ == "__main__":
    main()
