"""What the class-data archive of Spark's classes (engine.cds, `make jar`) saves a cold job (make bench-cds).

For each graph size (bench-scale's synthetic Zipf graphs, nodes = edges / 10, 128-d, its 2-layer
GraphSAGE), cold `python spark_jobs/batch_inference.py --report ...` jobs on a fresh work dir, in
turn with the archive and without it (SPARKGNN_CDS=off), --repeats times each: wall time, the job
report's session start, prepare and layers, and the CPU seconds of the whole process tree (the
driver JVM and Spark's Python workers included; sampled every 0.2 s, each process's last sample
counts). The runs alternate so that a change in the machine's load falls on both sides.

Writes bench/results/cds.json and cds.png.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import DATA, RESULTS, machine, synthetic_dir, write_result  # noqa: E402
from bench_scale import DIM, make_model, sparkgnn_job  # noqa: E402

from sparkgnn.engine import cds  # noqa: E402

DEFAULT_SIZES = (200_000, 2_000_000)


class TreeCpu:
    """CPU seconds (user + system) of the processes under this one that are not running at the
    start, each at its last sample."""

    def __init__(self, every_s: float = 0.2):
        self.every_s, self.seen = every_s, {}
        self._before = {p.pid for p in psutil.Process().children(recursive=True)}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for proc in psutil.Process().children(recursive=True):
                if proc.pid in self._before:
                    continue
                try:
                    times = proc.cpu_times()
                    self.seen[proc.pid] = times.user + times.system
                except psutil.Error:
                    pass
            self._stop.wait(self.every_s)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return sum(self.seen.values())


def one_job(graph: str, model: str, archive: bool, timeout_s: float) -> dict:
    previous = os.environ.get(cds.ARCHIVE_ENV)
    if not archive:
        os.environ[cds.ARCHIVE_ENV] = "off"
    scratch = tempfile.mkdtemp(prefix="sparkgnn-cds-", dir=DATA)
    cpu = TreeCpu()
    try:
        run = sparkgnn_job(graph, model, scratch, timeout_s)
    finally:
        run_cpu = cpu.stop()
        shutil.rmtree(scratch, ignore_errors=True)
        if previous is None:
            os.environ.pop(cds.ARCHIVE_ENV, None)
        else:
            os.environ[cds.ARCHIVE_ENV] = previous
    keep = ("ok", "wall_s", "session_start_s", "prepare_s", "layer_s", "peak_rss_gib", "tail")
    return {"archive": archive, "cpu_s": round(run_cpu, 1), **{k: run[k] for k in keep if k in run}}


def summarise(runs: list[dict]) -> dict:
    out: dict = {}
    for side in (True, False):
        ok = [r for r in runs if r["archive"] is side and r["ok"]]
        if not ok:
            continue
        name = "with" if side else "without"
        for key in ("wall_s", "session_start_s", "cpu_s"):
            out[f"{key}_{name}"] = round(min(r[key] for r in ok), 2)
    for key in ("wall_s", "session_start_s", "cpu_s"):
        if f"{key}_with" in out and f"{key}_without" in out:
            out[f"{key}_saved"] = round(out[f"{key}_without"] - out[f"{key}_with"], 2)
            out[f"{key}_ratio"] = round(out[f"{key}_with"] / out[f"{key}_without"], 3)
    return out


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = result["points"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    labels = [f"{p['edges'] / 1e6:g}M edges" for p in points]
    for ax, key, title in zip(
        axes,
        ("wall_s", "session_start_s", "cpu_s"),
        ("cold job wall (s)", "session start (s)", "process-tree CPU (s)"),
        strict=True,
    ):
        xs = range(len(points))
        ax.bar([x - 0.2 for x in xs], [p["summary"].get(f"{key}_without", 0) for p in points], 0.4, label="without")
        ax.bar([x + 0.2 for x in xs], [p["summary"].get(f"{key}_with", 0) for p in points], 0.4, label="with archive")
        ax.set_xticks(list(xs), labels)
        ax.set_title(title)
    axes[0].legend()
    fig.suptitle("cold batch_inference.py with and without the class-data archive (best of the repeats)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES), help="edge counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=2, help="jobs per size and side")
    parser.add_argument("--timeout-s", type=float, default=900.0)
    args = parser.parse_args()
    if cds.archive_path() is None:
        raise SystemExit("bench_cds.py: no class-data archive to measure (make jar writes it)")
    models = tempfile.mkdtemp(prefix="sparkgnn-cds-models-", dir=DATA)
    model = os.path.join(models, "sage")
    make_model(model, os.path.join(models, "sage_pyg.pt"))
    points = []
    try:
        for edges in [int(s) for s in args.sizes.split(",")]:
            graph = synthetic_dir(edges // 10, edges, DIM)
            runs = []
            for i in range(args.repeats * 2):
                archive = i % 2 == 0
                runs.append(one_job(graph, model, archive, args.timeout_s))
                r = runs[-1]
                print(f"{edges:,} edges, archive={archive}: {r['wall_s']} s wall, {r['cpu_s']} s CPU", flush=True)
            points.append({"edges": edges, "nodes": edges // 10, "runs": runs, "summary": summarise(runs)})
    finally:
        shutil.rmtree(models, ignore_errors=True)
    result = {
        "what": "cold python spark_jobs/batch_inference.py (fresh work dir) with and without the class-data archive",
        "machine": machine(),
        "loadavg": os.getloadavg(),
        "archive_mib": round(os.path.getsize(cds.archive_path() or "") / 2**20),
        "points": points,
    }
    print(write_result("cds", result))
    plot(result, os.path.join(RESULTS, "cds.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
