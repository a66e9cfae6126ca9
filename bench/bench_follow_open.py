"""Open-loop follower throughput (bench_follow.py's throughput half; runnable alone): update files
of 10 / 100 / 1,000 random edge inserts are OFFERED at a fixed rate, whatever the follower does
(a producer process links pre-written files into the update folder on schedule, each with its
arrival as modification time), and `RefreshFollower` -- default batch bounds: 10,000 update rows
or `--max-latency-s` since the oldest arrival -- coalesces what arrived into batches.

Per graph (synthetic, 32-d; 2M and 8M edges by default), per model (2-layer SAGE-mean and GCN,
stores with states), per offered file size: the sustained edge updates/s (updates over the time
from the first arrival to the last batch's commit: the offered rate when the follower keeps up,
its capacity when not), the updates per second the follower was busy (its headroom), the mean
batch, batch latency p50 / p99 (oldest arrival to the batch's end) and the follower's CPU
seconds. In the same run, per graph and model: the precompute of the base graph
(precompute_local), `refresh_local` of one 1,000-edge update cold (store opened from disk) and
warm (layers loaded before), and the follower's final store against a precompute of its final
graph (max relative difference: exactness).

    .venv/bin/python bench/bench_follow_open.py [--sizes 2000000 8000000] [--models sage gcn]
        [--offered 40000 20000] [--updates 50000 30000] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import shutil
import sys
import tempfile
import time

import numpy as np

log = logging.getLogger("bench_follow_open")

DIM = 32
FILE_EDGES = (10, 100, 1000)
REFRESH_EDGES = 1000  # the refresh_local comparison: one update of this many edge inserts


def model_of(kind: str, dim: int = DIM):
    """A 2-layer model converted from PyG (seeded): SAGE-mean or GCN, hidden 64, 16 outputs."""
    import torch
    import torch_geometric.nn as gnn

    from sparkgnn import Model

    torch.manual_seed(0)
    if kind == "sage":
        return Model.from_pyg(gnn.GraphSAGE(dim, 64, 2, out_channels=16))
    if kind == "gcn":
        return Model.from_pyg(gnn.GCN(dim, 64, 2, out_channels=16))
    raise ValueError(f"model kind {kind!r}: expected sage or gcn")


def stage(graph, folder: str, file_edges: int, updates: int, seed: int) -> list[str]:
    """Write updates // file_edges update files of `file_edges` random edge inserts into `folder`
    (before the clock: what a producer had ready), returning their paths in offering order."""
    from sparkgnn.graph.updates import GraphUpdate

    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    paths = []
    for k in range(max(updates // file_edges, 1)):
        update = GraphUpdate(
            edge_insert_src=rng.choice(graph.ids, file_edges), edge_insert_dst=rng.choice(graph.ids, file_edges)
        )
        paths.append(update.write(os.path.join(folder, f"u{k:07d}.parquet")))
    return paths


def _offer(paths: list[str], inbox: str, start: float, period_s: float) -> None:
    """The producer (a process of its own): file k appears in `inbox` at start + k * period_s,
    its modification time set to that moment first (a link: the name appears whole)."""
    for k, path in enumerate(paths):
        due = start + k * period_s
        wait = due - time.time()
        if wait > 0:
            time.sleep(wait)
        now = time.time()
        os.utime(path, (now, now))
        os.link(path, os.path.join(inbox, os.path.basename(path)))


def follow_point(graph, model, root: str, work: str, staged: list[str], file_edges: int, offered: float, **options):
    """One offered point (module doc); returns (its figures, the follower's final graph)."""
    from sparkgnn.pe.follow import RefreshFollower

    inbox, state = os.path.join(work, "in"), os.path.join(work, "state")
    shutil.rmtree(inbox, ignore_errors=True)
    shutil.rmtree(state, ignore_errors=True)
    os.makedirs(inbox)
    follower = RefreshFollower(graph=graph, model=model, store=root, updates=inbox, state=state, **options)
    commits: list[float] = []
    commit = follower.commit

    def timed_commit() -> bool:  # the follower calls self.commit(): timed here, per call that wrote
        began = time.perf_counter()
        wrote = commit()
        if wrote:
            commits.append(time.perf_counter() - began)
        return wrote

    follower.commit = timed_commit  # type: ignore[method-assign]
    period = file_edges / offered
    start = time.time() + 0.3
    producer = multiprocessing.get_context("fork").Process(target=_offer, args=(staged, inbox, start, period))
    producer.start()
    consumed, busy, cpu_started = 0, 0.0, time.process_time()
    try:
        while consumed < len(staged):
            began = time.perf_counter()
            progress = follower.poll()
            if progress is None:
                time.sleep(0.002)
                continue
            busy += time.perf_counter() - began
            consumed += progress.files + progress.dead_letters
        began = time.perf_counter()
        follower.commit()
        busy += time.perf_counter() - began
        end = time.time()
    finally:
        producer.join()
    cpu = time.process_time() - cpu_started
    follower.close()
    history = follower.history
    updates = sum(p.updates for p in history)
    latency = np.array([p.latency_s for p in history])
    out = {
        "offered_updates_per_s": round(offered),
        "updates": updates,
        "updates_per_s": round(updates / (end - start)),
        "updates_per_busy_s": round(updates / busy),
        "batches": len(history),
        "mean_batch_updates": round(updates / max(len(history), 1), 1),
        "latency_p50_ms": round(1000 * float(np.percentile(latency, 50)), 1),
        "latency_p99_ms": round(1000 * float(np.percentile(latency, 99)), 1),
        "cpu_s": round(cpu, 2),  # the follower's process: its background compaction included
        "updates_per_cpu_s": round(updates / cpu),  # steadier than the wall figures on a shared box
        "commits": len(commits),  # written by a commit() call (the last one at least), timed
        "commit_s": round(sum(commits), 2),
        "background_commits": sum(p.committing for p in history),  # written beside the next batches
        "dead_letters": sum(p.dead_letters for p in history),
    }
    log.info(f"  {file_edges:5d} edges/file offered at {offered:.0f}/s: {out}")
    return out, follower.graph


def refresh_comparison(graph, model, root: str, seed: int) -> dict:
    """refresh_local of one REFRESH_EDGES-edge update, cold and warm (module doc); the versions
    it writes are removed again."""
    from sparkgnn.graph.updates import GraphUpdate
    from sparkgnn.pe.refresh import refresh_local
    from sparkgnn.pe.store import PEStore

    rng = np.random.default_rng(seed)
    update = GraphUpdate(
        edge_insert_src=rng.choice(graph.ids, REFRESH_EDGES), edge_insert_dst=rng.choice(graph.ids, REFRESH_EDGES)
    )
    out = {}
    for how in ("cold", "warm"):
        old = None
        if how == "warm":
            old = PEStore.open(root, model=model, graph=graph)
            for l in old.layers:
                old.table(l)  # loaded before the clock, as in a serving process
        started = time.perf_counter()
        _store, report = refresh_local(graph, update, model, root, store=old)
        seconds = time.perf_counter() - started
        shutil.rmtree(os.path.join(root, report.graph_fingerprint), ignore_errors=True)
        out[f"refresh_local_{how}_s"] = round(seconds, 3)
        out[f"refresh_local_{how}_updates_per_s"] = round(REFRESH_EDGES / seconds)
    return out


def max_relative_error(got, want, ids, layers: int) -> float:
    worst = 0.0
    for l in range(1, layers + 1):
        for a, b in zip(got.lookup(ids, l, states=True), want.lookup(ids, l, states=True), strict=True):
            worst = max(worst, float(np.abs(a - b).max() / max(1.0, float(np.abs(b).max()))))
    return worst


def run(
    *,
    sizes: tuple[int, ...] = (2_000_000, 8_000_000),
    models: tuple[str, ...] = ("sage", "gcn"),
    offered: tuple[float, ...] = (40_000, 20_000),
    updates: tuple[int, ...] = (50_000, 30_000),
    file_edges: tuple[int, ...] = FILE_EDGES,
    max_latency_s: float = 0.1,
    max_batch_updates: int = 10_000,
    torch_threads: int = 1,
) -> dict:
    """Every graph size x model x offered file size (module doc); `offered` and `updates` per
    size (rate offered, updates per point)."""
    import torch

    from sparkgnn.datasets.synthetic import synthetic_graph
    from sparkgnn.pe.local import precompute_local
    from sparkgnn.pe.store import PEStore

    if not (len(sizes) == len(offered) == len(updates)):
        raise ValueError(f"one offered rate and update count per size: {sizes}, {offered}, {updates}")
    threads = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    out: dict = {
        "max_latency_s": max_latency_s,
        "max_batch_updates": max_batch_updates,
        "torch_threads": torch_threads,
        "graphs": {},
    }
    work = tempfile.mkdtemp(prefix="bench_follow_open_")
    try:
        for edges, rate, total in zip(sizes, offered, updates, strict=True):
            nodes = edges // 10
            started = time.perf_counter()
            graph = synthetic_graph(nodes, edges, DIM, seed=0)
            label = f"{edges / 1e6:g}M"
            log.info(f"graph {label}: {nodes} nodes, {edges} edges ({time.perf_counter() - started:.1f}s)")
            staged = {k: stage(graph, os.path.join(work, f"stage_{k}"), k, total, seed=k) for k in file_edges}
            per_graph: dict = {"nodes": nodes, "edges": edges, "dim": DIM, "models": {}}
            for kind in models:
                model = model_of(kind)
                root = os.path.join(work, f"store_{kind}")
                shutil.rmtree(root, ignore_errors=True)
                started = time.perf_counter()
                precompute_local(graph, model, root)
                entry: dict = {"precompute_local_s": round(time.perf_counter() - started, 3)}
                entry.update(refresh_comparison(graph, model, root, seed=1))
                log.info(f" {kind}: {entry}")
                current, points = graph, {}
                for k in file_edges:
                    points[str(k)], current = follow_point(
                        current,
                        model,
                        root,
                        os.path.join(work, "follow"),
                        staged[k],
                        k,
                        rate,
                        max_latency_s=max_latency_s,
                        max_batch_updates=max_batch_updates,
                        commit_spacing=2.0,  # commits at most ~1/3 of the time (RefreshFollower.commit_due)
                    )
                entry["by_file_edges"] = points
                scratch = os.path.join(work, "scratch")
                shutil.rmtree(scratch, ignore_errors=True)
                started = time.perf_counter()
                want = precompute_local(current, model, scratch)
                entry["precompute_local_final_s"] = round(time.perf_counter() - started, 3)
                got = PEStore.open(root, model=model, graph=current)
                entry["max_relative_error"] = max_relative_error(got, want, current.ids, len(model.convs))
                assert entry["max_relative_error"] <= 1e-5, entry["max_relative_error"]
                per_graph["models"][kind] = entry
                shutil.rmtree(root, ignore_errors=True)
                shutil.rmtree(scratch, ignore_errors=True)
            out["graphs"][label] = per_graph
            for k in file_edges:
                shutil.rmtree(os.path.join(work, f"stage_{k}"), ignore_errors=True)
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2_000_000, 8_000_000])
    parser.add_argument("--models", nargs="+", default=["sage", "gcn"], choices=["sage", "gcn"])
    parser.add_argument("--offered", type=float, nargs="+", default=[40_000, 20_000], help="updates/s, per size")
    parser.add_argument("--updates", type=int, nargs="+", default=[50_000, 30_000], help="per point, per size")
    parser.add_argument("--file-edges", type=int, nargs="+", default=list(FILE_EDGES))
    parser.add_argument("--max-latency-s", type=float, default=0.1)
    parser.add_argument("--max-batch-updates", type=int, default=10_000)
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("sparkgnn").setLevel(logging.WARNING)
    result = {"loadavg": list(os.getloadavg())}
    result.update(
        run(
            sizes=tuple(args.sizes),
            models=tuple(args.models),
            offered=tuple(args.offered),
            updates=tuple(args.updates),
            file_edges=tuple(args.file_edges),
            max_latency_s=args.max_latency_s,
            max_batch_updates=args.max_batch_updates,
        )
    )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)
    else:
        json.dump(result, sys.stdout, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
