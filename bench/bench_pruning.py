"""k-hop pruning for requested ids (issue 18): 1,000 random ids of the 2M-edge bench graph, 2-layer
SAGE-mean, with pruning (prune=auto) against without (prune=off: every vertex computed, the output
filtered), measured three ways in the same run:

  cold jobs   `spark_jobs/batch_inference.py --ids FILE` in its own JVM with a fresh work dir each
              (what a spark-submit user pays: session, prepare when it runs, every layer once);
  fresh dir   `infer(..., ids=...)` in a warm session but a fresh work dir (prepare paid);
  warm        the same call again on a work dir whose layout is prepared (best of REPEATS).

Also recorded: the rows of the pruned run against the unpruned run's (max relative error), the
frontier sizes and the chosen mode with every candidate's estimate, and the same for GCN (whose
degrees need the whole graph's in-edges of every frontier source). Section "pruning" of
bench/results/batch.json (key `pruned_ids_speedup`: the cold job ratio) and batch_pruning.png.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import numpy as np

REQUESTED = 1000
REPEATS = 2


def _run(spark, path, model, ids, prune: str, work_dir: str):
    from sparkgnn import infer

    started = time.perf_counter()
    job = infer(spark, path, model, ids=ids, prune=prune, work_dir=work_dir)
    result, report, plan = job.frame, job.report, job.plan
    table = result.toArrow()
    seconds = time.perf_counter() - started
    order = np.argsort(table.column("id").to_numpy())
    h = np.stack(table.column("h").to_numpy(zero_copy_only=False))[order]
    return {"seconds": round(seconds, 3), "pruning": plan.pruning, "prepare_s": round(report.prepare_s, 3)}, h


def _relative_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def in_session(spark, path: str, model, ids, scratch: str, log=print) -> dict:
    """Fresh-dir and warm figures for prune=off and prune=auto, and the rows' agreement."""
    out: dict = {}
    for prune in ("off", "auto"):
        fresh_dir = os.path.join(scratch, f"fresh-{prune}")
        fresh, h = _run(spark, path, model, ids, prune, fresh_dir)
        warm = min(
            (_run(spark, path, model, ids, prune, fresh_dir) for _ in range(REPEATS)), key=lambda r: r[0]["seconds"]
        )
        out[prune] = {"fresh_dir": fresh, "warm": warm[0]}
        out[f"_h_{prune}"] = h
        log(f"prune={prune}: fresh work dir {fresh['seconds']:.1f} s, warm {warm[0]['seconds']:.1f} s")
        shutil.rmtree(fresh_dir, ignore_errors=True)
    out["max_relative_error_pruned_vs_whole"] = _relative_error(out.pop("_h_auto"), out.pop("_h_off"))
    out["fresh_dir_speedup"] = out["off"]["fresh_dir"]["seconds"] / out["auto"]["fresh_dir"]["seconds"]
    out["warm_speedup"] = out["off"]["warm"]["seconds"] / out["auto"]["warm"]["seconds"]
    return out


def cold_jobs(path: str, model, ids, log=print) -> dict:
    """One cold job per setting (bench_scale.sparkgnn_job: its own JVM, a fresh work dir)."""
    from bench_scale import sparkgnn_job

    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="sparkgnn-pruning-cold-") as scratch:
        model_path = os.path.join(scratch, "model")
        model.save(model_path)
        ids_file = os.path.join(scratch, "ids.txt")
        with open(ids_file, "w") as fh:
            fh.write("\n".join(str(int(i)) for i in ids) + "\n")
        for prune in ("off", "auto"):
            run = sparkgnn_job(
                path, model_path, os.path.join(scratch, prune), 1800, extra_args=["--ids", ids_file, "--prune", prune]
            )
            out[prune] = {k: run.get(k) for k in ("ok", "wall_s", "session_start_s", "prepare_s", "tail")}
            log(f"cold job prune={prune}: {run.get('wall_s')} s")
    if out["off"]["ok"] and out["auto"]["ok"]:
        out["job_speedup"] = out["off"]["wall_s"] / out["auto"]["wall_s"]
    return out


def pruning_section(spark, path: str, model, gcn_model, log=print) -> dict:
    rng = np.random.default_rng(18)
    all_ids = spark.read.parquet(os.path.join(path, "vertices")).select("id").toArrow().column("id").to_numpy()
    ids = np.sort(rng.choice(all_ids, REQUESTED, replace=False))
    section: dict = {"requested_ids": REQUESTED, "graph": path, "model": "2-layer SAGE-mean, hidden 128"}
    with tempfile.TemporaryDirectory(prefix="sparkgnn-pruning-") as scratch:
        section["in_session"] = in_session(spark, path, model, ids, scratch, log)
        gcn, _ = _run(spark, path, gcn_model, ids, "auto", os.path.join(scratch, "gcn"))
        section["gcn_auto"] = gcn
        log(f"GCN prune=auto: {gcn['seconds']:.1f} s ({gcn['pruning'].get('reason')})")
    section["cold"] = cold_jobs(path, model, ids, log)
    section["pruned_ids_speedup"] = section["cold"].get("job_speedup")
    return section


def plot_pruning(section: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["cold job", "fresh work dir", "warm"]
    session = section["in_session"]
    whole = [
        section["cold"]["off"]["wall_s"],
        session["off"]["fresh_dir"]["seconds"],
        session["off"]["warm"]["seconds"],
    ]
    pruned = [
        section["cold"]["auto"]["wall_s"],
        session["auto"]["fresh_dir"]["seconds"],
        session["auto"]["warm"]["seconds"],
    ]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = np.arange(len(labels))
    ax.bar(xs - 0.2, whole, 0.4, label="whole graph, output filtered (prune=off)")
    ax.bar(xs + 0.2, pruned, 0.4, label=f"k-hop pruned ({session['auto']['warm']['pruning'].get('mode')})")
    for x, a, b in zip(xs, whole, pruned, strict=True):
        ax.text(x, max(a, b) * 1.02, f"{a / b:.1f}x", ha="center")
    ax.set_xticks(xs, labels)
    ax.set_ylabel("seconds")
    ax.set_title(f"{section['requested_ids']:,} random ids of the 2M-edge graph, 2-layer SAGE-mean, 2 cores")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
