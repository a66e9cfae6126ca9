"""Model batching benchmark: k models over one graph in ONE cold job vs k separate cold jobs.

Three 2-layer SAGE-mean models (hidden 128, different weights: variants of one architecture, as a
team's A/B or per-task models) on the batch bench graph (synthetic 200K nodes / 2M edges / 128-d).
  batched   `batch_inference.py --model A --model B --model C`: one job, fresh work dir (prepare
            paid), the models run as one batched model (engine.batching: x shipped and
            aggregated once at layer 1, the three layer-2 payloads side by side).
  separate  three `batch_inference.py --model X` jobs, one after the other, sharing one work dir:
            only the first pays prepare (the conservative comparison: a team rerunning on the
            same graph keeps its prepared layouts).
Every job is cold (its own JVM, `python spark_jobs/batch_inference.py`, the local session), as a
spark-submit user runs it. Measured: wall seconds per job, bytes moved between steps per job
(Spark's shuffle write + routed files), and the batched results against the separate ones (max
relative error). Writes model_batching_time_ratio and model_batching_bytes_ratio (batched /
separate; target <= 0.6) and a `model_batching` section into bench/results/batch.json (read,
modified, written: other keys kept), and bench/results/batch_model_batching.png.

    python bench/bench_model_batching.py                     # the bench graph
    python bench/bench_model_batching.py --nodes 2000 --edges 20000 --dim 16 --results /tmp/mb.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import RESULTS, ROOT, graph_arguments, machine, synthetic_dir  # noqa: E402
from bench_scale import run_cold  # noqa: E402

MODELS = 3
HIDDEN = 128
TIMEOUT_S = 3600


def save_models(dim: int, scratch: str) -> list[str]:
    from torch_geometric.nn import GraphSAGE

    from sparkgnn.models import Model

    paths = []
    for seed in range(MODELS):
        torch.manual_seed(seed)
        path = os.path.join(scratch, f"sage_{seed}")
        Model.from_pyg(GraphSAGE(dim, HIDDEN, 2).eval(), output="embedding").save(path)
        paths.append(path)
    return paths


def moved_bytes(job: dict) -> int:
    """Bytes a job moved between steps: Spark's shuffle writes plus rows routed through files."""
    return sum(int(s.get("shuffle_write_bytes") or 0) + int(s.get("exchanged_bytes") or 0) for s in job["steps"])


def cold_job(graph: str, models: list[str], out: str, work: str, report: str, exchange: str) -> dict:
    cmd = [sys.executable, os.path.join(ROOT, "spark_jobs", "batch_inference.py"), "--graph", graph]
    for model in models:
        cmd += ["--model", model]
    cmd += ["--out", out, "--work-dir", work, "--report", report, "--exchange", exchange]
    run = run_cold(cmd, TIMEOUT_S)
    if run["rc"] != 0 or not os.path.exists(report):
        raise RuntimeError(f"job {' '.join(cmd)} failed (rc {run['rc']}):\n{run['output'][-3000:]}")
    with open(report) as fh:
        doc = json.load(fh)
    jobs = doc.get("jobs", [doc])  # a batched report lists its jobs (one when the models share)
    return {
        "wall_s": round(run["wall_s"], 3),
        "peak_rss_gib": round(run["peak_rss_gib"], 2),
        "session_start_s": doc["session_start_s"],
        "jobs": len(jobs),
        "prepare_s": sum(job["prepare_s"] for job in jobs),
        "seconds_by_layer": [job["seconds_by_layer"] for job in jobs],
        "strategies": [job["strategies"] for job in jobs],
        "partitions": [job["partitions"] for job in jobs],
        "moved_bytes": sum(moved_bytes(job) for job in jobs),
        "shuffle_write_bytes": sum(int(s.get("shuffle_write_bytes") or 0) for job in jobs for s in job["steps"]),
    }


def read_h(path: str) -> dict[int, np.ndarray]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    ids = table.column("id").to_numpy()
    h = np.stack(table.column("h").to_numpy(zero_copy_only=False))
    return dict(zip(ids.tolist(), h, strict=True))


def max_rel_error(batched: str, separate: str) -> float:
    a, b = read_h(batched), read_h(separate)
    assert a.keys() == b.keys(), "batched and separate results hold other vertices"
    ids = sorted(a)
    x, y = np.stack([a[i] for i in ids]), np.stack([b[i] for i in ids])
    return float(np.abs(x - y).max() / max(np.abs(y).max(), 1e-30))


def run(graph: str, dim: int, exchange: str, log=print) -> dict:
    with tempfile.TemporaryDirectory(prefix="sparkgnn-model-batching-") as scratch:
        models = save_models(dim, scratch)
        names = [os.path.basename(m) for m in models]
        batched = cold_job(
            graph,
            models,
            os.path.join(scratch, "batched"),
            os.path.join(scratch, "work-batched"),
            os.path.join(scratch, "batched.json"),
            exchange,
        )
        log(f"batched: {batched['wall_s']:.1f} s, moved {batched['moved_bytes'] / 2**20:.0f} MiB")
        separate = {}
        for name, model in zip(names, models, strict=True):
            separate[name] = cold_job(
                graph,
                [model],
                os.path.join(scratch, f"separate-{name}"),
                os.path.join(scratch, "work-separate"),
                os.path.join(scratch, f"separate-{name}.json"),
                exchange,
            )
            job = separate[name]
            log(f"separate {name}: {job['wall_s']:.1f} s, moved {job['moved_bytes'] / 2**20:.0f} MiB")
        errors = {
            name: max_rel_error(os.path.join(scratch, "batched", name), os.path.join(scratch, f"separate-{name}"))
            for name in names
        }
    separate_s = sum(job["wall_s"] for job in separate.values())
    separate_bytes = sum(job["moved_bytes"] for job in separate.values())
    return {
        "how": (
            f"{MODELS} SAGE-mean models (2 layers, hidden {HIDDEN}, different weights); batched: one cold "
            "batch_inference.py job with --model repeated, fresh work dir; separate: one cold job per model, "
            f"one after another, sharing a work dir (only the first pays prepare); exchange={exchange}; "
            "bytes = Spark shuffle writes + rows routed through files"
        ),
        "models": MODELS,
        "batched": batched,
        "separate": separate,
        "separate_total_wall_s": round(separate_s, 3),
        "separate_total_moved_bytes": separate_bytes,
        "time_ratio": batched["wall_s"] / separate_s,
        "bytes_ratio": batched["moved_bytes"] / max(separate_bytes, 1),
        "max_rel_error_batched_vs_separate": max(errors.values()),
    }


def plot(section: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    names = list(section["separate"])
    bottom = 0.0
    for name in names:  # the separate jobs stacked, next to the one batched job
        job = section["separate"][name]
        axes[0].bar(["separate"], [job["wall_s"]], bottom=[bottom], label=name)
        bottom += job["wall_s"]
    axes[0].bar(["batched"], [section["batched"]["wall_s"]], color="tab:green")
    axes[0].set_ylabel("wall seconds (cold jobs)")
    axes[0].set_title(f"{section['models']} models: batched / separate = {section['time_ratio']:.2f}x")
    axes[0].legend(fontsize=8)
    mib = [section["separate_total_moved_bytes"] / 2**20, section["batched"]["moved_bytes"] / 2**20]
    axes[1].bar(["separate", "batched"], mib, color=["tab:blue", "tab:green"])
    axes[1].set_ylabel("MiB moved between steps")
    axes[1].set_title(f"bytes: batched / separate = {section['bytes_ratio']:.2f}x")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = graph_arguments(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("--exchange", choices=("auto", "shuffle", "files"), default="shuffle")
    parser.add_argument("--results", default=os.path.join(RESULTS, "batch.json"), help="JSON to merge the section into")
    args = parser.parse_args()
    graph = synthetic_dir(args.nodes, args.edges, args.dim)
    section = run(graph, args.dim, args.exchange, log=lambda line: print(line, flush=True))
    section["graph"] = {"nodes": args.nodes, "edges": args.edges, "dim": args.dim}
    section["machine"] = machine()
    result = {}
    if os.path.exists(args.results):
        with open(args.results) as fh:
            result = json.load(fh)
    result["model_batching"] = section
    result["model_batching_time_ratio"] = section["time_ratio"]
    result["model_batching_bytes_ratio"] = section["bytes_ratio"]
    os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
    with open(args.results, "w") as fh:
        json.dump(result, fh, indent=2, sort_keys=True)
    plot(section, os.path.join(os.path.dirname(os.path.abspath(args.results)), "batch_model_batching.png"))
    print(
        f"model batching: time {section['time_ratio']:.2f}x, bytes {section['bytes_ratio']:.2f}x, "
        f"max rel error {section['max_rel_error_batched_vs_separate']:.1e}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
