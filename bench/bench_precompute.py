"""PE precomputation benchmark (make bench-precompute) on the batch bench graph (synthetic 200K nodes /
2M edges / 128-d, 2-layer SAGE-mean, hidden 128): seconds per layer with and without states, store
bytes per layer (embeddings vs states) next to OMEGA's (L-1) x H x 4 bytes/node and the graph's
feature bytes, metrics seconds; compared with plain batch inference in the same run (the price of
keeping every layer). Writes bench/results/precompute.json and precompute.png."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import DATA, RESULTS, ROOT, graph_arguments, logged_lines, machine, synthetic_dir, write_result  # noqa: E402


def _timed_precompute(spark, graph_dir, model, store, states, metrics, work_dir):
    from sparkgnn.engine.precompute import precompute

    shutil.rmtree(store, ignore_errors=True)
    started = time.perf_counter()
    with logged_lines() as lines:
        opened = precompute(
            spark,
            graph_dir,
            model,
            store=store,
            states=states,
            metrics=metrics,
            work_dir=work_dir,
            validate=False,
        ).store
    total = time.perf_counter() - started
    metric_lines = [line for line in lines if "workload metrics" in line]
    metrics_s = float(metric_lines[0].split(" in ")[1].split(" s")[0]) if metric_lines else None
    return opened, total, metrics_s, lines


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    names = ["batch inference", "PEs only", "PEs + states"]
    seconds = [
        result["batch_seconds_total"],
        result["no_states"]["seconds_excl_metrics"],
        result["with_states"]["seconds_excl_metrics"],
    ]
    axes[0].bar(names, seconds, color=["tab:gray", "tab:blue", "tab:orange"])
    axes[0].set_ylabel("seconds (2 layers, excl. metrics)")
    axes[0].set_title(result["graph"])
    report = result["with_states"]["size_report"]
    layers = sorted(report["pe_bytes"], key=int) if isinstance(report.get("pe_bytes"), dict) else []
    axes[1].bar([f"h^{l}" for l in layers], [report["pe_bytes"][l] / 2**20 for l in layers], label="embeddings")
    if isinstance(report.get("state_bytes"), dict):
        axes[1].bar(
            [f"h^{l}" for l in layers],
            [report["state_bytes"].get(l, 0) / 2**20 for l in layers],
            bottom=[report["pe_bytes"][l] / 2**20 for l in layers],
            label="states",
        )
    axes[1].axhline(report["graph_feature_bytes"] / 2**20, color="k", ls="--", label="graph features")
    axes[1].set_ylabel("MiB on disk")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _cold_jobs(edges: int, dim: int, timeout_s: float) -> dict:
    """One cold batch inference job and one cold precompute job (each its own process, fresh work
    dir and store) on the synthetic graph of `edges` edges (nodes = edges / 10) with the same
    2-layer SAGE-mean model: wall seconds and each job's phase table."""
    import json

    from bench_scale import batch_job_cmd, run_cold
    from torch_geometric.nn import GraphSAGE

    from sparkgnn.models import Model

    graph = synthetic_dir(edges // 10, edges, dim)
    scratch = os.path.join(DATA, "precompute_cold", str(edges))
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    model = os.path.join(scratch, "model")
    torch.manual_seed(0)
    Model.from_pyg(GraphSAGE(dim, 128, 2, aggr="mean").eval(), output="embedding").save(model)
    jobs = {}
    for name in ("batch", "precompute"):
        here = os.path.join(scratch, name)
        report = os.path.join(here, "report.json")
        if name == "batch":
            cmd = batch_job_cmd(graph, model, here, os.path.join(here, "work"), report)
        else:
            cmd = [sys.executable, os.path.join(ROOT, "spark_jobs", "precompute_pe.py"), "--graph", graph]
            cmd += ["--model", model, "--store", os.path.join(here, "store"), "--work-dir", os.path.join(here, "work")]
            cmd += ["--report", report]
        run = run_cold(cmd, timeout_s)
        if run["rc"] != 0 or not os.path.exists(report):
            raise SystemExit(f"cold {name} job failed (rc {run['rc']}): {run['output'][-2000:]}")
        with open(report) as fh:
            doc = json.load(fh)
        jobs[name] = {
            "wall_s": round(run["wall_s"], 2),
            "peak_rss_gib": round(run["peak_rss_gib"], 2),
            "phases": doc.get("phases"),
            "unaccounted_fraction": doc.get("unaccounted_fraction"),
            "exchange": doc.get("exchange"),
            "steps": [{"label": s["label"], "seconds": s["seconds"]} for s in doc.get("steps", [])],
            "progress": [line for line in run["output"].splitlines() if line.startswith(("sparkgnn", "precompute_pe"))],
        }
        print(f"cold {name} at {edges / 1e6:g}M edges: {run['wall_s']:.1f} s", flush=True)
    metrics_s = sum(row["seconds"] for row in jobs["precompute"]["phases"] or [] if row["name"] == "workload metrics")
    jobs["precompute"]["metrics_s"] = metrics_s
    jobs["precompute_over_batch_job"] = jobs["precompute"]["wall_s"] / jobs["batch"]["wall_s"]
    jobs["metrics_fraction"] = metrics_s / jobs["precompute"]["wall_s"]
    shutil.rmtree(scratch, ignore_errors=True)
    return jobs


def cold_main(args) -> int:
    """--cold: cold precompute vs cold batch job per size, merged into precompute.json (the warm
    mode's keys are kept)."""
    import json

    path = os.path.join(RESULTS, "precompute.json")
    result = {}
    if os.path.exists(path):
        with open(path) as fh:
            result = json.load(fh)
    cold = result.setdefault("cold", {})
    cold["what"] = (
        "cold spark_jobs/precompute_pe.py (states + metrics) vs cold spark_jobs/batch_inference.py, same graph "
        "and model, each its own process on a fresh work dir; ratio of wall seconds"
    )
    cold["loadavg"] = os.getloadavg()
    for millions in args.cold_sizes:
        jobs = _cold_jobs(int(millions * 1_000_000), args.dim, args.timeout)
        key = f"{millions:g}m"
        cold[key] = jobs
        result[f"precompute_over_batch_job_{key}"] = round(jobs["precompute_over_batch_job"], 3)
        result[f"metrics_fraction_of_precompute_{key}"] = round(jobs["metrics_fraction"], 3)
        print(f"{key}: precompute / batch job {jobs['precompute_over_batch_job']:.2f}", flush=True)
    print(f"wrote {write_result('precompute', result)}")
    return 0


def main() -> int:
    parser = graph_arguments(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("--cold", action="store_true", help="cold jobs (own processes) instead of the warm mode")
    parser.add_argument("--cold-sizes", type=lambda v: [float(x) for x in v.split(",")], default=[2.0, 8.0])
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per cold job")
    args = parser.parse_args()
    if args.cold:
        return cold_main(args)
    from torch_geometric.nn import GraphSAGE

    from sparkgnn import infer
    from sparkgnn.engine.session import local_session
    from sparkgnn.models import Model

    spark = local_session("sparkgnn-bench-precompute", cores=2)
    graph_dir = synthetic_dir(args.nodes, args.edges, args.dim)
    work_dir = os.path.join(DATA, "work")
    torch.manual_seed(0)
    model = Model.from_pyg(GraphSAGE(args.dim, 128, 2).eval(), output="embedding")
    infer(spark, graph_dir, model, work_dir=work_dir, validate=False)  # warm-up
    started = time.perf_counter()
    infer(spark, graph_dir, model, work_dir=work_dir, validate=False)
    batch_seconds = time.perf_counter() - started
    result = {
        "machine": machine(),
        "graph": f"synthetic {args.nodes // 1000}K / {args.edges / 1e6:g}M / {args.dim}-d",
        "model": "2-layer GraphSAGE (mean), hidden 128",
        "batch_seconds_total": batch_seconds,
    }
    for key, states, metrics in (("no_states", False, False), ("with_states", True, True)):
        store, total, metrics_s, lines = _timed_precompute(
            spark, graph_dir, model, os.path.join(DATA, f"pe_{key}"), states, metrics, work_dir
        )
        excl = total - (metrics_s or 0.0)
        result[key] = {
            "seconds_total": total,
            "seconds_excl_metrics": excl,
            "seconds_per_layer": excl / 2,
            "metrics_seconds": metrics_s,
            "size_report": store.size_report(),
            "log": lines,
        }
        print(f"{key}: {excl:.1f} s for 2 layers (metrics {metrics_s})", flush=True)
    result["with_states_over_batch"] = result["with_states"]["seconds_excl_metrics"] / batch_seconds
    result["no_states_over_batch"] = result["no_states"]["seconds_excl_metrics"] / batch_seconds
    path = write_result("precompute", result)
    plot(result, os.path.join(RESULTS, "precompute.png"))
    print(f"wrote {path}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
