"""What surviving a lost executor costs: each layer step materialised reliably (ORC files in the work
dir, engine.materialise) against the local-mode `localCheckpoint`, on the 2M-edge bench graph
(make bench-cluster).

Every run is a cold `spark-submit` of spark_jobs/batch_inference.py with --report, on the same
graph, model, strategy (replicate) and partition count, so only the way steps travel and persist
differs:
  - local[2]: shuffle + localCheckpoint (the baseline: lost with its executor), shuffle + reliable
    ORC files, and the files exchange (Arrow files in the work dir; its steps are durable too);
  - local-cluster[2,1,4096] (two executor JVMs, as on a real cluster): shuffle + reliable (what a
    cluster gets by default with the shuffle) and the files exchange.
Each configuration runs --repeats times, in rounds over its master's configurations, in a work dir
prepared by a first run of that master (prepare is reported apart); per-layer seconds are the best
of the repeats, next to the first run's whole job wall time. The ratio that matters is
reliable / localCheckpoint per layer (target <= 1.15).

Writes bench/results/cluster.json and cluster.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import DATA, RESULTS, ROOT, machine, synthetic_dir, write_result  # noqa: E402

DIM = 128
LAYERS = 2
PARTITIONS = 2
CONFIGS = (
    # name, master, exchange, materialise
    ("local: shuffle + localCheckpoint", "local[2]", "shuffle", "local"),
    ("local: shuffle + reliable ORC", "local[2]", "shuffle", "reliable"),
    ("local: files exchange", "local[2]", "files", "auto"),
    ("local-cluster: shuffle + reliable ORC", "local-cluster[2,1,4096]", "shuffle", "auto"),
    ("local-cluster: files exchange", "local-cluster[2,1,4096]", "files", "auto"),
)
BASELINE = CONFIGS[0][0]
RELIABLE = CONFIGS[1][0]


def spark_submit(master: str, args: list[str], timeout_s: float) -> tuple[int, str, float]:
    command = [
        os.path.join(os.path.dirname(sys.executable), "spark-submit"),
        "--master",
        master,
        "--driver-memory",
        "4g",
        "--conf",
        "spark.ui.enabled=false",
        "--driver-java-options",
        f"-Dlog4j.configurationFile={os.path.join(ROOT, 'spark_jobs', 'log4j2.properties')}",
        os.path.join(ROOT, "spark_jobs", "batch_inference.py"),
        *args,
    ]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - started


def one_run(graph: str, model: str, master: str, exchange: str, materialise: str, work: str, timeout_s: float) -> dict:
    scratch = tempfile.mkdtemp(prefix="sparkgnn-cluster-", dir=DATA)
    report = os.path.join(scratch, "report.json")
    args = [
        "--graph", graph, "--model", model, "--out", os.path.join(scratch, "out"), "--work-dir", work,
        "--partitions", str(PARTITIONS), "--strategy", "replicate", "--exchange", exchange,
        "--materialise", materialise, "--report", report,
    ]  # fmt: skip
    try:
        rc, output, wall = spark_submit(master, args, timeout_s)
        if rc != 0 or not os.path.exists(report):
            return {"ok": False, "wall_s": round(wall, 2), "tail": output[-2000:]}
        with open(report) as fh:
            doc = json.load(fh)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    by_layer = doc["seconds_by_layer"]
    return {
        "ok": True,
        "wall_s": round(wall, 2),
        "session_start_s": doc["session_start_s"],
        "prepare_s": doc["prepare_s"],
        "prepare_reused": doc["prepare_reused"],
        "exchange": doc["exchange"],
        "load_s": by_layer.get("-1", 0.0),
        "layer_s": [by_layer[str(i)] for i in range(LAYERS)],
    }


def measure(graph: str, model: str, repeats: int, timeout_s: float, only: str | None = None) -> list[dict]:
    """Per master: one uncounted run that prepares the work dir, then the master's configurations
    in turn, `repeats` rounds (A-B-C, A-B-C: a machine that drifts slower or faster over the
    minutes shifts every configuration alike, not the last one measured)."""
    configs = [c for c in CONFIGS if not only or only in c[0]]
    runs: dict[str, list] = {name: [] for name, *_ in configs}
    for master in dict.fromkeys(c[1] for c in configs):
        work = tempfile.mkdtemp(prefix="sparkgnn-cluster-work-", dir=DATA)
        warm = one_run(graph, model, master, "shuffle", "local", work, timeout_s)
        print(f"{master}: prepare {warm.get('prepare_s')} s (first run, {warm.get('wall_s')} s)", flush=True)
        for _ in range(repeats):
            for name, at, exchange, materialise in configs:
                if at == master:
                    runs[name].append(one_run(graph, model, master, exchange, materialise, work, timeout_s))
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for name, master, exchange, materialise in configs:
        ok = [r for r in runs[name] if r["ok"]]
        row = {"config": name, "master": master, "exchange": exchange, "materialise": materialise, "runs": runs[name]}
        if ok:
            # the load step (layer -1) counts with layer 1: it is the first step the plan charges there
            layer_1 = min(r["load_s"] + r["layer_s"][0] for r in ok)
            layer_2 = min(r["layer_s"][1] for r in ok)
            row.update(best_layer_s=[round(layer_1, 3), round(layer_2, 3)], first_wall_s=runs[name][0]["wall_s"])
        rows.append(row)
        print(f"{name}: {row.get('best_layer_s')} s per layer (best of {repeats}), job {row.get('first_wall_s')} s")
    return rows


def ratios(rows: list[dict]) -> dict:
    by_name = {r["config"]: r for r in rows if "best_layer_s" in r}
    base = by_name.get(BASELINE)
    out = {}
    if base:
        for name, row in by_name.items():
            out[name] = [round(a / b, 3) for a, b in zip(row["best_layer_s"], base["best_layer_s"], strict=True)]
    return out


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["configs"] if "best_layer_s" in r]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.38
    for layer in range(LAYERS):
        values = [r["best_layer_s"][layer] for r in rows]
        ax.barh([i + layer * width for i in range(len(rows))], values, width, label=f"layer {layer + 1}")
    ax.set_yticks([i + width / 2 for i in range(len(rows))], [r["config"] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per layer (best of repeats, cold spark-submit jobs)")
    reliable = result["ratio_vs_local_checkpoint"].get(RELIABLE)
    ax.set_title(f"2M edges, P={PARTITIONS}: reliable / localCheckpoint per layer = {reliable}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--only", default=None, help="run only the configurations whose name holds this text")
    args = parser.parse_args()
    os.makedirs(DATA, exist_ok=True)
    graph = synthetic_dir(args.edges // 10, args.edges, DIM)
    model = os.path.join(DATA, "scale_sage_model")
    if not os.path.exists(model):
        from bench_scale import make_model

        make_model(model, os.path.join(DATA, "scale_sage_pyg.pt"))
    rows = measure(graph, model, args.repeats, args.timeout_s, args.only)
    if args.only:  # a partial run is for looking, not for the result file
        print(json.dumps(ratios(rows), indent=2))
        return 0
    result = {
        "what": "per-layer cost of reliable step materialisation (ORC files in the work dir) vs localCheckpoint",
        "graph": f"synthetic Zipf, {args.edges // 10} nodes, {args.edges} edges, {DIM}-d, seed 0",
        "model": f"{LAYERS}-layer GraphSAGE (mean), strategy replicate, P={PARTITIONS}",
        "machine": machine(),
        "configs": rows,
        "ratio_vs_local_checkpoint": ratios(rows),
        "reliable_over_local_per_layer": ratios(rows).get(RELIABLE),
    }
    path = write_result("cluster", result)
    plot(result, os.path.join(RESULTS, "cluster.png"))
    print(json.dumps(result["ratio_vs_local_checkpoint"], indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
