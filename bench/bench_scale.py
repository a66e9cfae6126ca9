"""Batch inference at scale, as a spark-submit user pays it (make bench-scale).

For each graph size (synthetic Zipf graphs, nodes = edges / 10, 128-d features, seeded), one run
measures, each cold in its own process:
  - sparkgnn: `python spark_jobs/batch_inference.py --report ...` on a fresh work dir (JVM start,
    prepare, every step, the Parquet output); its report says where the time went;
  - PyG: bench/pyg_cold_job.py (read the same Parquet, forward of the same weights, write Parquet),
    twice: with `edge_index` (gather + scatter, PyG's default) and with the transposed adjacency as a
    torch sparse CSR tensor (`adj_t`, PyG's fast path); their outputs must agree (1e-5 relative).
Peak RSS is the largest sum over the process tree (the JVM and Spark's Python workers included),
sampled every 0.2 s. Ratios are sparkgnn / PyG: per layer (mean of the layers) and whole job,
against the faster PyG path (and against each, `_edge_index` / `_csr`). `unaccounted_fraction` is
the share of the job's wall time its phase table (engine.phases) names no phase for.
`--huge` adds the 100M-edge graph (about 5 GB of features).

Writes bench/results/scale.json and scale.png; points of sizes this run did not measure are kept
from the file's earlier content (marked `from_earlier_run`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import psutil
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import DATA, RESULTS, ROOT, machine, synthetic_dir, write_result  # noqa: E402

DEFAULT_SIZES = (2_000_000, 8_000_000, 32_000_000)
HUGE = 100_000_000
DIM = 128
HIDDEN = 128
LAYERS = 2
#: PyG's adj_t output must equal its edge_index output to this relative error to be quoted.
PYG_AGREEMENT = 1e-5


class PeakRss:
    """Largest total RSS of a process and all its descendants, sampled in a thread, and the largest
    total of their private memory (RSS less file-backed and shared pages): the exchange files the
    tasks memory-map count in RSS while the kernel may drop and re-read them at any time, so RSS
    overstates what the job needs; both are reported."""

    def __init__(self, pid: int, every_s: float = 0.2):
        self.pid, self.every_s, self.peak, self.peak_private = pid, every_s, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                root = psutil.Process(self.pid)
                procs = [root, *root.children(recursive=True)]
                total = private = 0
                for proc in procs:
                    try:
                        info = proc.memory_info()
                        total += info.rss
                        private += info.rss - info.shared
                    except psutil.Error:
                        pass
                self.peak = max(self.peak, total)
                self.peak_private = max(self.peak_private, private)
            except psutil.Error:
                return
            self._stop.wait(self.every_s)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def run_cold(cmd: list[str], timeout_s: float) -> dict:
    """Run a command in its own process; wall seconds, peak tree RSS, exit code, output tail."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    peak = PeakRss(proc.pid)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
    wall = time.perf_counter() - started
    rss = peak.stop()
    return {
        "wall_s": wall,
        "peak_rss_gib": rss / 2**30,
        "peak_private_gib": peak.peak_private / 2**30,
        "rc": proc.returncode,
        "output": output,
    }


def make_model(path_sparkgnn: str, path_pyg: str) -> None:
    from torch_geometric.nn import GraphSAGE

    from sparkgnn.models import Model

    torch.manual_seed(0)
    module = GraphSAGE(DIM, HIDDEN, LAYERS, aggr="mean").eval()
    Model.from_pyg(module).save(path_sparkgnn)
    torch.save({"weights": module.state_dict(), "in": DIM, "hidden": HIDDEN, "layers": LAYERS}, path_pyg)


def batch_job_cmd(graph: str, model: str, scratch: str, work: str, report: str, extra_args=()) -> list[str]:
    """The spark-submit-style command line of one batch inference job writing under `scratch`/out."""
    return [
        sys.executable,
        os.path.join(ROOT, "spark_jobs", "batch_inference.py"),
        *("--graph", graph, "--model", model, "--out", os.path.join(scratch, "out")),
        *("--work-dir", work, "--report", report, *extra_args),
    ]


def sparkgnn_job(
    graph: str, model: str, scratch: str, timeout_s: float, calibration: str | None = None, extra_args=()
) -> dict:
    """One cold job on a fresh work dir (so prepare is paid), seeded with `calibration` (the cost
    model's measured layers from the previous sizes, as a team's shared work dir would hold them);
    the job's own layers are appended to it afterwards."""
    report_path = os.path.join(scratch, "report.json")
    work = os.path.join(scratch, "work")
    calibrated_from = 0
    if calibration and os.path.exists(calibration):
        os.makedirs(work, exist_ok=True)
        shutil.copy(calibration, os.path.join(work, "calibration.json"))
        with open(calibration) as fh:
            calibrated_from = sum(len(v) for v in json.load(fh)["by_cores"].values())
    run = run_cold(batch_job_cmd(graph, model, scratch, work, report_path, extra_args), timeout_s)
    if calibration and os.path.exists(os.path.join(work, "calibration.json")):
        shutil.copy(os.path.join(work, "calibration.json"), calibration)
    if run["rc"] != 0 or not os.path.exists(report_path):
        return {
            "ok": False,
            "wall_s": run["wall_s"],
            "peak_rss_gib": run["peak_rss_gib"],
            "peak_private_gib": round(run["peak_private_gib"], 2),
            "tail": run["output"][-2000:],
        }
    with open(report_path) as fh:
        report = json.load(fh)
    layers = [report["seconds_by_layer"][str(i)] for i in range(LAYERS)]
    return {
        "ok": True,
        "wall_s": round(run["wall_s"], 2),
        "peak_rss_gib": round(run["peak_rss_gib"], 2),
        "peak_private_gib": round(run["peak_private_gib"], 2),
        "session_start_s": report["session_start_s"],
        "prepare_s": report["prepare_s"],
        "load_s": report["seconds_by_layer"].get("-1", 0.0),
        "layer_s": layers,
        "partitions": report["partitions"],
        "concurrent_tasks": report["memory"].get("concurrent_tasks"),
        "estimated_worker_gib": round(report["memory"].get("worker_bytes", 0) / 2**30, 2),
        "strategies": report["strategies"],
        "peak_task_rss_gib": round(max((s["peak_task_rss_bytes"] or 0) for s in report["steps"]) / 2**30, 2),
        # a run without Spark tasks (a local pruned run of --ids) has no task memory plan
        "estimated_peak_task_gib": round(max(report["memory"].get("peak_task_bytes_per_layer", [0])) / 2**30, 2),
        "budget_per_task_gib": round(report["memory"].get("budget_per_task_bytes", 0) / 2**30, 2),
        "estimate_vs_actual": report["estimate_vs_actual"],
        "cost_model_calibrated_from_layers": calibrated_from,
        "steps": report["steps"],
        "phases": report.get("phases"),
        "unaccounted_s": report.get("unaccounted_s"),
        "unaccounted_fraction": report.get("unaccounted_fraction"),
        "progress": [line for line in run["output"].splitlines() if line.startswith(("sparkgnn", "batch_inference"))],
    }


def pyg_job(graph: str, model: str, scratch: str, timeout_s: float, adj: str = "edge_index") -> dict:
    """One cold PyG script (bench/pyg_cold_job.py) with the convs given `adj` (edge_index | csr),
    writing its output to `scratch`/pyg_<adj>.parquet."""
    cmd = [
        sys.executable,
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyg_cold_job.py"),
        "--graph",
        graph,
        "--model",
        model,
        "--out",
        pyg_output(scratch, adj),
        "--adj",
        adj,
    ]
    run = run_cold(cmd, timeout_s)
    lines = [line for line in run["output"].splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"ok": False, "error": run["output"][-500:]}
    if run["rc"] != 0 and result.get("ok"):
        result = {"ok": False, "error": f"exit code {run['rc']}"}
    if run["rc"] in (-9, 137) and not lines:
        result = {"ok": False, "error": "killed (out of memory)"}
    return {**result, "wall_s": round(run["wall_s"], 2), "peak_rss_gib": round(run["peak_rss_gib"], 2)}


def pyg_output(scratch: str, adj: str) -> str:
    return os.path.join(scratch, f"pyg_{adj}.parquet")


def max_relative_error(path_a: str, path_b: str) -> float:
    """max |a - b| / max |a| over the `h` columns of two PyG outputs (same ids in the same order)."""
    import numpy as np
    import pyarrow.parquet as pq

    a, b = pq.read_table(path_a), pq.read_table(path_b)
    if a.column("id").to_numpy().tolist() != b.column("id").to_numpy().tolist():
        raise ValueError(f"{path_a} and {path_b} hold different ids or orders")
    ha = a.column("h").combine_chunks().flatten().to_numpy()
    hb = b.column("h").combine_chunks().flatten().to_numpy()
    return float(np.abs(ha - hb).max() / max(float(np.abs(ha).max()), 1e-30))


def measure(edges: int, models: tuple[str, str], timeout_s: float, calibration: str | None = None) -> dict:
    nodes = edges // 10
    started = time.perf_counter()
    graph = synthetic_dir(nodes, edges, DIM)
    made_s = time.perf_counter() - started
    point: dict = {"edges": edges, "nodes": nodes, "graph_generation_s": round(made_s, 1)}
    scratch = tempfile.mkdtemp(prefix="sparkgnn-scale-", dir=DATA)
    try:
        print(f"scale {edges:,} edges: sparkgnn cold job ...", flush=True)
        point["sparkgnn"] = sparkgnn_job(graph, models[0], scratch, timeout_s, calibration)
        print(f"  {json.dumps({k: v for k, v in point['sparkgnn'].items() if k not in ('steps', 'progress')})}")
        print(f"scale {edges:,} edges: PyG cold job ...", flush=True)
        point["pyg"] = pyg_job(graph, models[1], scratch, timeout_s)
        print(f"  {json.dumps(point['pyg'])}", flush=True)
        print(f"scale {edges:,} edges: PyG cold job, sparse CSR adj_t ...", flush=True)
        point["pyg_csr"] = pyg_job(graph, models[1], scratch, timeout_s, adj="csr")
        print(f"  {json.dumps(point['pyg_csr'])}", flush=True)
        if point["pyg"].get("ok") and point["pyg_csr"].get("ok"):
            error = max_relative_error(pyg_output(scratch, "edge_index"), pyg_output(scratch, "csr"))
            point["pyg_csr_max_rel_error_vs_edge_index"] = error
            if error > PYG_AGREEMENT:  # not the same computation: no ratio is quoted against it
                point["pyg_csr"].update(ok=False, error=f"output differs from edge_index's ({error:.1e} relative)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    s = point["sparkgnn"]
    if s["ok"]:
        per_layer = sum(s["layer_s"]) / LAYERS
        point["sparkgnn_layer_s"] = round(per_layer, 3)
        point["edge_layers_per_s_per_core"] = round(edges / per_layer / (os.cpu_count() or 1))
        point["unaccounted_fraction"] = s.get("unaccounted_fraction")
        point["estimate_error"] = round(
            max(abs(r["actual_over_estimate"] - 1) for r in s["estimate_vs_actual"] if r["actual_over_estimate"]), 2
        )
        point.update(pyg_ratios(s, point["pyg"], point["pyg_csr"]))
    return point


def pyg_ratios(s: dict, edge_index: dict, csr: dict) -> dict:
    """sparkgnn / PyG per layer and per job against each PyG path that ran, and against the
    faster one (per layer and per job separately): `layer_ratio_vs_pyg`, `job_ratio_vs_pyg`."""
    out: dict = {}
    runs = {"edge_index": edge_index, "csr": csr}
    layers = {name: sum(p["layer_s"]) / LAYERS for name, p in runs.items() if p.get("ok")}
    jobs = {name: p["wall_s"] for name, p in runs.items() if p.get("ok")}
    mine = sum(s["layer_s"]) / LAYERS
    for name in layers:
        out[f"pyg_{name}_layer_s"] = round(layers[name], 3)
        out[f"layer_ratio_vs_pyg_{name}"] = round(mine / layers[name], 2)
        out[f"job_ratio_vs_pyg_{name}"] = round(s["wall_s"] / jobs[name], 2)
    if layers:
        fast_layer, fast_job = min(layers, key=layers.get), min(jobs, key=jobs.get)
        out["pyg_faster_layer"], out["pyg_faster_job"] = fast_layer, fast_job
        out["layer_ratio_vs_pyg"] = round(mine / layers[fast_layer], 2)
        out["job_ratio_vs_pyg"] = round(s["wall_s"] / jobs[fast_job], 2)
    return out


def summary_keys(points: list[dict]) -> dict:
    by_edges = {p["edges"]: p for p in points}
    out: dict = {}
    for edges, suffix in ((8_000_000, "8m"), (32_000_000, "32m")):
        p = by_edges.get(edges, {})
        out[f"layer_ratio_vs_pyg_{suffix}"] = p.get("layer_ratio_vs_pyg")  # against the faster PyG path
    eight = by_edges.get(8_000_000, {})
    out["job_ratio_vs_pyg_8m"] = eight.get("job_ratio_vs_pyg")  # against the faster PyG job
    for name in ("csr", "edge_index"):
        out[f"layer_ratio_vs_pyg_{name}_8m"] = eight.get(f"layer_ratio_vs_pyg_{name}")
        out[f"job_ratio_vs_pyg_{name}_8m"] = eight.get(f"job_ratio_vs_pyg_{name}")
    # share of each size's cold job that its phase table leaves unnamed (target: <= 0.05)
    out["unaccounted_fraction"] = {
        str(p["edges"]): p["sparkgnn"].get("unaccounted_fraction") for p in points if p["sparkgnn"].get("ok")
    }
    # Largest |actual / estimate - 1| over the 8M job's layers (target: <= 0.3).
    out["estimate_error_8m"] = by_edges.get(8_000_000, {}).get("estimate_error")
    a, b = by_edges.get(8_000_000, {}), by_edges.get(32_000_000, {})
    same_run = a.get("from_earlier_run") == b.get("from_earlier_run")  # two runs' seconds are not comparable
    out["linearity_32m_over_8m"] = (
        round(b["sparkgnn_layer_s"] / a["sparkgnn_layer_s"], 2)
        if "sparkgnn_layer_s" in a and "sparkgnn_layer_s" in b and same_run
        else None
    )
    huge = by_edges.get(HUGE)
    out["huge"] = (
        {
            "edges": HUGE,
            "minutes": round(huge["sparkgnn"]["wall_s"] / 60, 1),
            "peak_rss_gib": huge["sparkgnn"]["peak_rss_gib"],
            "peak_private_gib": huge["sparkgnn"].get("peak_private_gib"),
            "partitions": huge["sparkgnn"].get("partitions"),
            "concurrent_tasks": huge["sparkgnn"].get("concurrent_tasks"),
            "layer_s": huge["sparkgnn"].get("layer_s"),
            "prepare_s": huge["sparkgnn"].get("prepare_s"),
            "ok": huge["sparkgnn"]["ok"],
            "pyg_outcome": "ok" if huge["pyg"].get("ok") else huge["pyg"].get("error"),
        }
        if huge
        else None
    )
    return out


def pyg_runs(point: dict) -> list[dict]:
    """The PyG cold jobs of a point that completed (edge_index, and sparse CSR where measured)."""
    return [point[key] for key in ("pyg", "pyg_csr") if point.get(key, {}).get("ok")]


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [p for p in result["points"] if p["sparkgnn"]["ok"]]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [f"{p['edges'] / 1e6:g}M" for p in points]
    phases = [
        ("JVM + session", lambda s: s["session_start_s"]),
        ("prepare", lambda s: s["prepare_s"]),
        ("load x", lambda s: s["load_s"]),
        ("layer 1", lambda s: s["layer_s"][0]),
        ("layer 2 + write", lambda s: s["layer_s"][1]),
    ]
    bottom = [0.0] * len(points)
    for name, get in phases:
        values = [get(p["sparkgnn"]) for p in points]
        ax1.bar([i - 0.2 for i in range(len(points))], values, 0.4, bottom=bottom, label=f"sparkgnn: {name}")
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    pyg = [min([r["wall_s"] for r in pyg_runs(p)] or [0]) for p in points]
    ax1.bar([i + 0.2 for i in range(len(points))], pyg, 0.4, color="gray", label="PyG cold job, faster path (whole)")
    ax1.set_xticks(range(len(points)), labels)
    ax1.set_ylabel("seconds, cold, one job")
    ax1.set_title("whole job as a user pays it")
    ax1.legend(fontsize=7)
    edges = [p["edges"] for p in points]
    ax2.loglog(edges, [p["sparkgnn_layer_s"] for p in points], "o-", label="sparkgnn s/layer")
    for key, label in (("pyg", "PyG edge_index s/layer"), ("pyg_csr", "PyG sparse CSR s/layer")):
        ok = [p for p in points if p.get(key, {}).get("ok")]
        ax2.loglog([p["edges"] for p in ok], [sum(p[key]["layer_s"]) / LAYERS for p in ok], "s--", label=label)
    ax2.loglog(edges, [edges[0] and points[0]["sparkgnn_layer_s"] * e / edges[0] for e in edges], ":", label="linear")
    ax2.set_xlabel("edges")
    ax2.set_ylabel("seconds per layer")
    ax2.set_title("per-layer cost vs graph size")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def earlier_points(path: str, measured: set[int]) -> list[dict]:
    """The points of `path` (an earlier scale.json) for sizes this run did not measure, marked
    `from_earlier_run`, so a run of some sizes keeps the others' figures."""
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        earlier = json.load(fh).get("points", [])
    return [dict(p, from_earlier_run=True) for p in earlier if p.get("edges") not in measured]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES), help="edge counts, comma-separated")
    parser.add_argument("--huge", action="store_true", help=f"also {HUGE:,} edges (run once, long)")
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="per cold job")
    parser.add_argument("--note", default=None, help="a line kept in scale.json about this run (conditions)")
    args = parser.parse_args()
    loadavg = os.getloadavg()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if args.huge:
        sizes.append(HUGE)
    os.makedirs(DATA, exist_ok=True)
    models = (os.path.join(DATA, "scale_sage_model"), os.path.join(DATA, "scale_sage_pyg.pt"))
    make_model(*models)
    # The cost model learns from each size's layers before the next (as in a shared work dir).
    calibration = os.path.join(tempfile.mkdtemp(prefix="sparkgnn-scale-calibration-", dir=DATA), "calibration.json")
    points = [measure(edges, models, args.timeout_s, calibration) for edges in sizes]
    shutil.rmtree(os.path.dirname(calibration), ignore_errors=True)
    points = earlier_points(os.path.join(RESULTS, "scale.json"), {p["edges"] for p in points}) + points
    points.sort(key=lambda p: p["edges"])
    result = {
        "what": "cold batch inference job (spark_jobs/batch_inference.py) vs a cold PyG script, per graph size",
        "graph": f"synthetic Zipf, nodes = edges/10, {DIM}-d, seed 0",
        "model": f"{LAYERS}-layer GraphSAGE (mean), hidden {HIDDEN}",
        "machine": machine(),
        "loadavg": [round(v, 2) for v in loadavg],
        **({"note": args.note} if args.note else {}),
        "points": points,
        **summary_keys(points),
    }
    path = write_result("scale", result)
    plot(result, os.path.join(RESULTS, "scale.png"))
    print(json.dumps(summary_keys(points), indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
