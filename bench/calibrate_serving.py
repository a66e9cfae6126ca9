"""Calibrate planner.serving.ServingCostModel: time FULL and EXACT requests, fit the constants.

WHY: mode="auto" ranks EXACT against FULL by estimated seconds, so the constants must come from
this machine's timings, not from guesses. For every (graph, model kind, layers, B) the script
answers a few requests with FULL and EXACT (torch.set_num_threads(1), one warm-up, the median of
`--repeat` timings per request), records each request's MEASURED sizes (the modes' own computation
graph / LayerWork: serving/sizes.py), and fits seconds = sum(constant x feature) by non-negative
least squares (ServingCostModel.features is the design matrix), weighting each request by
1 / its latency so small requests count as much as large ones (ranking is relative). It then
reports, with the fitted constants and with the sketch's PRE-RUN sizes (what auto sees), how
often the cheaper estimate is the faster mode and what auto would lose.

Graphs: Cora (1433-d, small: FULL's 2-hop neighbourhood covers most of it) and a synthetic
power-law graph (`--nodes`, 64-d). Models: PyG GCN and GraphSAGE with random weights (timings do
not depend on training). Writes bench/results/serving_cost.json; paste the constants printed into
ServingCostModel's defaults when they move.

    .venv/bin/python bench/calibrate_serving.py            # ~2-4 minutes on the 2-core box
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import write_result  # noqa: E402


def _model(kind: str, in_dim: int, layers: int, seed: int = 0):
    import torch_geometric.nn as gnn

    from sparkgnn.models import Model

    torch.manual_seed(seed)
    cls = {"gcn": gnn.GCN, "sage": gnn.GraphSAGE}[kind]
    return Model.from_pyg(cls(in_dim, 64, layers, out_channels=8).eval())


def _graphs(nodes: int):
    from sparkgnn.datasets import load_cora, synthetic_graph
    from sparkgnn.datasets.edges import symmetrise
    from sparkgnn.graph import GraphData

    cora = load_cora(seed=0, num_val=500, num_test=2068, undirected=True)
    d = synthetic_graph(nodes, nodes * 6, 64, num_classes=8, seed=0)
    src, dst = symmetrise(d.edge_src, d.edge_dst)
    syn = GraphData(d.ids, d.x, src, dst, y=d.y, split=d.split, name="synthetic-undirected")
    return {"cora": (cora, (16, 64, 256, 512)), "synthetic": (syn, (16, 64, 256, 1024))}


def _median_seconds(engine, request, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        engine.answer(request)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def collect(args, log) -> list[dict]:
    from sparkgnn.pe.local import precompute_local
    from sparkgnn.serving import QueryEngine, make_workload
    from sparkgnn.serving.sketch import EXACT_PLANS

    rows = []
    for gname, (data, batch_sizes) in _graphs(args.nodes).items():
        wl = make_workload(data, batch_sizes, args.requests, seed=0)
        G = wl.graph_G
        for kind, layers in (("gcn", 2), ("sage", 2), ("sage", 3), ("gcn", 3)):
            model = _model(kind, G.feature_dim, layers)
            store = precompute_local(G, model, tempfile.mkdtemp(prefix="calib-pe-"))
            full = QueryEngine(G, model, mode="full")
            engines = {"full": full, "exact": QueryEngine(G, model, mode="exact", store=store, context=full.context)}
            ctx = full.context
            for e in engines.values():
                e.answer(wl.requests[0])
            for r in wl.requests:
                prep = ctx.prepare(r)
                row = {"graph": gname, "kind": kind, "layers": layers, "B": r.batch_size}
                for name, e in engines.items():
                    row[f"{name}_s"] = _median_seconds(e, r, args.repeat)
                    row[f"{name}_counts"] = e.mode.counts(ctx, prep)
                    row[f"{name}_sketch"] = EXACT_PLANS[name](ctx, prep, model)
                    t0 = time.perf_counter()
                    for _ in range(5):
                        EXACT_PLANS[name](ctx, prep, model)
                    row[f"{name}_sketch_s"] = (time.perf_counter() - t0) / 5
                rows.append(row)
            log(f"  {gname} {kind}{layers}: {len(wl.requests)} requests")
    return rows


def fit(rows: list[dict]):
    from scipy.optimize import nnls

    from sparkgnn.planner.serving import ServingCostModel

    names = ServingCostModel.FIT_ORDER
    a, y = [], []
    for row in rows:
        for mode in ("full", "exact"):
            f = ServingCostModel.features(row[f"{mode}_counts"])
            w = 1.0 / row[f"{mode}_s"]
            a.append([f[n] * w for n in names])
            y.append(row[f"{mode}_s"] * w)
    a, y = np.array(a), np.array(y)
    scale = np.maximum(np.abs(a).max(axis=0), 1e-30)
    coef, _ = nnls(a / scale, y)
    return ServingCostModel(**{n: float(c / s) for n, c, s in zip(names, coef, scale, strict=True)})


def evaluate(rows: list[dict], cost, which: str) -> dict:
    """With sizes `which` ("counts": measured, "sketch": pre-run), how auto would do."""
    from sparkgnn.planner.serving import compile_request

    ratios, errors, right = [], [], 0
    per = {}
    for row in rows:
        est = {m: compile_request(row[f"{m}_{which}"], cost).estimates["seconds"] for m in ("full", "exact")}
        pick = min(est, key=est.get)
        best = min(row["full_s"], row["exact_s"])
        ratio = row[f"{pick}_s"] / best
        ratios.append(ratio)
        right += row[f"{pick}_s"] == best
        errors += [abs(est[m] / row[f"{m}_s"] - 1) for m in ("full", "exact")]
        key = f"{row['graph']}/{row['kind']}{row['layers']}/B={row['B']}"
        per.setdefault(key, []).append(ratio)
    return {
        "requests": len(rows),
        "picked_faster": right / len(rows),
        "median_abs_rel_error": float(np.median(errors)),
        "max_ratio_to_best": float(max(ratios)),
        "mean_ratio_to_best": float(np.mean(ratios)),
        "per_case_mean_ratio": {k: float(np.mean(v)) for k, v in per.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=30_000, help="synthetic graph vertices")
    parser.add_argument("--requests", type=int, default=3, help="requests per batch size")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    log = lambda line: print(line, flush=True)  # noqa: E731
    rows = collect(args, log)
    cost = fit(rows)
    out = {
        "constants": cost.to_dict(),
        "measured_sizes": evaluate(rows, cost, "counts"),
        "sketch_sizes": evaluate(rows, cost, "sketch"),
        "sketch_ms_median": {m: float(np.median([r[f"{m}_sketch_s"] for r in rows]) * 1e3) for m in ("full", "exact")},
        "rows": [
            {k: v for k, v in r.items() if not k.endswith(("_counts", "_sketch"))}
            | {
                f"{m}_{w}_edges": sum(c.edges + c.old_edges for c in r[f"{m}_{w}"].layers)
                for m in ("full", "exact")
                for w in ("counts", "sketch")
            }
            for r in rows
        ],
    }
    path = write_result("serving_cost", out)
    print("ServingCostModel(")
    for k, v in cost.to_dict().items():
        print(f"    {k}={v:.3e},")
    print(")")
    for which in ("measured_sizes", "sketch_sizes"):
        e = out[which]
        print(
            f"{which}: picked the faster mode {e['picked_faster']:.0%}, median |est/actual - 1| "
            f"{e['median_abs_rel_error']:.2f}, auto/best mean {e['mean_ratio_to_best']:.3f} "
            f"max {e['max_ratio_to_best']:.3f}"
        )
    for k, v in out["sketch_sizes"]["per_case_mean_ratio"].items():
        print(f"  {k:<32} auto/best {v:.3f}")
    print(f"sketch cost (median ms): {out['sketch_ms_median']}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
