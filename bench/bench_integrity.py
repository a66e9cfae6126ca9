"""What the refusal checks cost (make bench-integrity): the checks that keep stale caches and damaged
stores from being used sit on every job's path, so they must stay small next to the work they guard.

For synthetic graphs at two sizes (nodes = edges / 10, 128-d features) it times, warm page cache,
median of 3:
  graph: `check_graph_dir` (every Parquet footer), `read_trusted_meta` (data_stamp: one listing) and
         the content fingerprint a changed directory falls back to, against reading the graph's
         Parquet with pyarrow (the cheapest full read, which every job does at least once);
  store: a 2-layer PE store (h 128-d + mean states 129-d per vertex): the file record written at
         commit and `PEStore.open` with verify="checksums" and verify="sizes", against reading the
         layers' Parquet (what a serving process reads anyway).
Writes bench/results/integrity.json and integrity.png with the ratios (check / guarded read).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import DATA, RESULTS, machine, median_seconds, synthetic_dir, write_result  # noqa: E402


def _graph_costs(path: str) -> dict:
    import pyarrow.parquet as pq

    from sparkgnn.graph.dirfacts import check_graph_dir, read_trusted_meta
    from sparkgnn.graph.reader import read_graph_dir

    def read():
        pq.read_table(os.path.join(path, "vertices"))
        pq.read_table(os.path.join(path, "edges"))

    read()  # warm the page cache: every figure below is a warm one
    started = time.perf_counter()
    content_fp = read_graph_dir(path).fingerprint
    fallback = time.perf_counter() - started
    meta, why = read_trusted_meta(path)
    assert why is None and meta["fingerprint"] == content_fp, "bench graph's graph.json does not match its files"
    return {
        "read_parquet_s": median_seconds(read),
        "check_graph_dir_s": median_seconds(lambda: check_graph_dir(path)),
        "trusted_meta_s": median_seconds(lambda: read_trusted_meta(path)),
        "content_fingerprint_fallback_s": round(fallback, 4),
    }


def _store_costs(graph_path: str, store_root: str, dim: int) -> dict:
    import pyarrow.parquet as pq
    import torch
    import torch_geometric.nn as gnn

    from sparkgnn.graph.dirfacts import read_trusted_meta
    from sparkgnn.models import Model
    from sparkgnn.pe import PEStore, PEWriter, integrity, layout

    meta = read_trusted_meta(graph_path)[0]
    n = int(meta["num_vertices"])
    torch.manual_seed(0)
    model = Model.from_pyg(gnn.GraphSAGE(dim, dim, 2, out_channels=dim).eval())
    shutil.rmtree(store_root, ignore_errors=True)
    writer = PEWriter(store_root, graph_path, model, with_states=True)
    rng = np.random.default_rng(0)
    ids = np.arange(n, dtype=np.int64)
    record_s = []
    for layer in (1, 2):
        h = rng.standard_normal((n, dim), dtype=np.float32)
        state = rng.standard_normal((n, dim + 1), dtype=np.float32)
        writer.commit_layer_arrays(layer, ids, h, state)
        started = time.perf_counter()
        integrity.record(layout.committed_dir(writer.base, writer.manifest, layout.layer_key(layer)))
        record_s.append(time.perf_counter() - started)
    writer.finish()
    layer_dirs = [layout.committed_dir(writer.base, writer.manifest, layout.layer_key(layer)) for layer in (1, 2)]
    store_bytes = sum(os.path.getsize(os.path.join(d, f)) for d in layer_dirs for f in os.listdir(d))

    def read_layers():
        for d in layer_dirs:
            pq.read_table(d)

    read_layers()
    return {
        "store_bytes": store_bytes,
        "read_layers_s": median_seconds(read_layers),
        "record_at_commit_s": round(sum(record_s), 4),
        "open_checksums_s": median_seconds(lambda: PEStore.open(store_root, model=model, graph=graph_path)),
        "open_sizes_s": median_seconds(lambda: PEStore.open(store_root, model=model, graph=graph_path, verify="sizes")),
    }


def _ratios(graph: dict, store: dict) -> dict:
    return {
        "check_graph_dir_vs_read": round(graph["check_graph_dir_s"] / graph["read_parquet_s"], 4),
        "trusted_meta_vs_read": round(graph["trusted_meta_s"] / graph["read_parquet_s"], 4),
        "fingerprint_fallback_vs_read": round(graph["content_fingerprint_fallback_s"] / graph["read_parquet_s"], 2),
        "open_checksums_vs_read_layers": round(store["open_checksums_s"] / store["read_layers_s"], 4),
        "open_sizes_vs_read_layers": round(store["open_sizes_s"] / store["read_layers_s"], 4),
    }


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    labels = [f"{r['edges'] / 1e6:g}M edges" for r in runs]
    x = np.arange(len(runs))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    graph_bars = [
        ("read_parquet_s", "read graph (guarded work)"),
        ("check_graph_dir_s", "check footers"),
        ("trusted_meta_s", "data_stamp"),
    ]
    for i, (key, label) in enumerate(graph_bars):
        axes[0].bar(x + (i - 1) * 0.27, [r["graph"][key] for r in runs], 0.27, label=label)
    axes[0].set_title("graph directory checks (warm cache)")
    store_bars = [
        ("read_layers_s", "read PE layers (guarded work)"),
        ("open_checksums_s", "open, CRC-32"),
        ("open_sizes_s", "open, sizes"),
    ]
    for i, (key, label) in enumerate(store_bars):
        axes[1].bar(x + (i - 1) * 0.27, [r["store"][key] for r in runs], 0.27, label=label)
    axes[1].set_title("PE store verification (2 layers, warm cache)")
    for ax in axes:
        ax.set_xticks(x, labels)
        ax.set_ylabel("seconds")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", default="1000000,4000000", help="graph sizes (edges), comma separated")
    parser.add_argument("--dim", type=int, default=128)
    args = parser.parse_args(argv)
    runs = []
    for edges in (int(e) for e in args.edges.split(",")):
        path = synthetic_dir(edges // 10, edges, args.dim)
        graph = _graph_costs(path)
        store = _store_costs(path, os.path.join(DATA, "integrity_store"), args.dim)
        runs.append(
            {
                "nodes": edges // 10,
                "edges": edges,
                "dim": args.dim,
                "graph": graph,
                "store": store,
                "ratios": _ratios(graph, store),
            }
        )
        print(f"{edges:>10} edges: {runs[-1]['ratios']}", flush=True)
    shutil.rmtree(os.path.join(DATA, "integrity_store"), ignore_errors=True)
    result = {
        "machine": machine(),
        "cache": "warm page cache (files read once before timing)",
        "alternative": "the guarded read itself (pyarrow reads of the graph / the PE layers)",
        "runs": runs,
    }
    print("wrote", write_result("integrity", result))
    plot(result, os.path.join(RESULTS, "integrity.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
