"""Quick follower throughput check (not part of `make bench`): a seeded synthetic graph (20K
nodes / 200K edges / 32-d by default), a 2-layer SAGE-mean store with states, then
`RefreshFollower` fed one update file per batch of 10 / 100 / 1,000 random edge inserts.
Prints, per batch size, the sustained edge updates/s over the batches (follower seconds only,
files written before; the final commit of the rows held in memory included), the same per CPU
second (steadier on a shared box) and the batch latency p50 / p99; `--check` compares the final
store with a precompute of the final graph. Runs in well under a minute on 2 cores.

    .venv/bin/python bench/bench_follow_quick.py [--nodes N --edges E --dim F --batches B]
                                                  [--sizes 10 100 1000] [--commit-every-s S] [--check]
                                                  [--torch-threads N] [--model sage|gcn]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time

import numpy as np

log = logging.getLogger("bench_follow_quick")


def _model(dim: int, kind: str = "sage"):
    """A 2-layer model (hidden 64, 16 outputs): GraphSAGE-mean, or GCN, whose degree statistics a
    refresh reads for both graphs at every layer."""
    import torch
    import torch_geometric.nn as gnn

    from sparkgnn import Model

    torch.manual_seed(0)
    family = {"sage": gnn.GraphSAGE, "gcn": gnn.GCN}[kind]
    return Model.from_pyg(family(dim, 64, 2, out_channels=16))


def run(
    nodes: int,
    edges: int,
    dim: int,
    batches: int,
    sizes: tuple,
    check: bool,
    commit_every_s: float,
    seed: int = 0,
    torch_threads: int = 1,
    model: str = "sage",
) -> dict:
    """Updates/s and batch latency per batch size (module doc), with torch on `torch_threads`
    intra-op threads as `sparkgnn-refresh follow --torch-threads` sets them (restored after)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    try:
        return _run(nodes, edges, dim, batches, sizes, check, commit_every_s, seed, model)
    finally:
        torch.set_num_threads(threads)


def _run(
    nodes: int, edges: int, dim: int, batches: int, sizes: tuple, check: bool, every_s: float, seed: int, kind: str
) -> dict:
    from sparkgnn.datasets.synthetic import synthetic_graph
    from sparkgnn.graph.updates import GraphUpdate
    from sparkgnn.pe.follow import RefreshFollower
    from sparkgnn.pe.local import precompute_local

    graph = synthetic_graph(nodes, edges, dim, seed=seed)
    model = _model(dim, kind)
    rng = np.random.default_rng(seed)
    out: dict = {}
    work = tempfile.mkdtemp(prefix="follow_quick_")
    try:
        for size in sizes:
            root, inbox, state = (os.path.join(work, f"{name}_{size}") for name in ("store", "in", "state"))
            os.makedirs(inbox)
            precompute_local(graph, model, root)
            follower = RefreshFollower(
                graph=graph,
                model=model,
                store=root,
                updates=inbox,
                state=state,
                max_batch_updates=size,
                commit_every_s=every_s,
            )
            seconds, cpu, latencies = 0.0, 0.0, []
            for b in range(batches):
                update = GraphUpdate(
                    edge_insert_src=rng.choice(graph.ids, size), edge_insert_dst=rng.choice(graph.ids, size)
                )
                update.write(os.path.join(inbox, f"u{b:05d}.parquet"))
                started, cpu_started = time.perf_counter(), time.process_time()
                progress = follower.poll(flush=True)
                took = time.perf_counter() - started
                cpu += time.process_time() - cpu_started
                assert progress is not None
                seconds += took
                latencies.append(took)
            started, cpu_started = time.perf_counter(), time.process_time()
            follower.commit()  # what is still held in memory, counted in the sustained rate
            seconds += time.perf_counter() - started
            cpu += time.process_time() - cpu_started
            follower.close()  # its background compaction, if one runs, before the folder goes
            out[size] = {
                "updates_per_s": round(size * batches / seconds),
                "updates_per_cpu_s": round(size * batches / cpu),  # steadier than wall on a shared box
                "p50_ms": round(1000 * float(np.percentile(latencies, 50)), 1),
                "p99_ms": round(1000 * float(np.percentile(latencies, 99)), 1),
            }
            log.info(f"{size:5d} edges/batch: {out[size]}")
            if check:
                from sparkgnn.pe import PEStore

                want = precompute_local(follower.graph, model, os.path.join(work, f"scratch_{size}"))
                got = PEStore.open(root, model=model, graph=follower.graph)
                for l in (1, 2):
                    h, s = got.lookup(follower.graph.ids, l, states=True)
                    h0, s0 = want.lookup(follower.graph.ids, l, states=True)
                    err = max(float(np.abs(a - b).max() / max(1.0, np.abs(b).max())) for a, b in ((h, h0), (s, s0)))
                    log.info(f"  layer {l}: max relative difference to a precompute {err:.2e}")
                    assert err <= 1e-5, err
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=20_000)
    parser.add_argument("--edges", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--check", action="store_true", help="compare the final store with a precompute")
    parser.add_argument("--commit-every-s", type=float, default=1.0, help="the follower's store version interval")
    parser.add_argument("--torch-threads", type=int, default=1, help="as sparkgnn-refresh follow --torch-threads")
    parser.add_argument("--model", choices=("sage", "gcn"), default="sage", help="2-layer GraphSAGE-mean or GCN")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("sparkgnn").setLevel(logging.WARNING)
    run(
        args.nodes,
        args.edges,
        args.dim,
        args.batches,
        tuple(args.sizes),
        args.check,
        args.commit_every_s,
        torch_threads=args.torch_threads,
        model=args.model,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
