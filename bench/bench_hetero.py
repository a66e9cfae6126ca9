"""Typed batch inference as a spark-submit user pays it (make bench-hetero).

For each size of the seeded OGB-MAG-shaped typed graph (sparkgnn.datasets.synthetic_mag, with the
rev_ relations so that every type receives messages; 128-d papers, the other types without
features), one run measures, each cold in its own process:
  - sparkgnn: `python spark_jobs/batch_inference.py --report ...` of the saved to_hetero model on
    a fresh work dir (JVM start, each relation's prepare and steps, the merges, the output per
    type); the report's phase table says where the time went;
  - PyG: bench/pyg_hetero_cold_job.py (the same Parquet read into a HeteroData, forward of the
    same to_hetero module and weights, Parquet per type).
Both outputs are then compared row by row (max |a - b| / max |b| per type, target 1e-5), and each
against PyG's forward in float64 (float32 sums over hubs differ by their order).

Per layer: PyG's is its forward's time per conv layer (pyg_hetero_cold_job's hooks); sparkgnn's
is a round's time: its relation jobs (the wall time of the "typed round R: relation jobs" phase,
where they run side by side; else the sum of their steps, loading the rows included, prepare not)
plus the round's merge of the relations per type (the "typed round R: merge" phase);
a round's prepare is its relation jobs' own plus its "relation layouts, prepared concurrently" phase.
Ratios are sparkgnn / PyG per layer (mean over the layers) and for the whole job; peak RSS is the
largest sum over each process tree (bench_scale.run_cold).

Writes bench/results/hetero.json and hetero.png (`--results DIR` elsewhere, for a quick run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import DATA, RESULTS, machine, write_result  # noqa: E402
from bench_generic import max_rel_error, read_sparkgnn_output  # noqa: E402
from bench_scale import batch_job_cmd, run_cold  # noqa: E402
from pyg_hetero_cold_job import FEATURELESS_WIDTH, build_model  # noqa: E402

DEFAULT_SIZES = (2_000_000, 8_000_000)
DIM = 128
HIDDEN = 128
OUT = 128
LAYERS = 2
SEED = 0
EXACT_TOL = 1e-5


def mag_spec(edges: int):
    """The MagSpec whose graph has about `edges` edges (forward and rev_ relations together)."""
    from sparkgnn.datasets.synthetic_mag import MagSpec, _edge_types

    probe = MagSpec(1_000_000, dim=DIM, seed=SEED, reverse=True)
    per_paper = 0.0
    for s, r, d in _edge_types(probe):
        forward = (s, r, d) if not r.startswith("rev_") else (d, r[len("rev_") :], s)
        per_paper += probe.num_edges(forward) / probe.num_papers
    return MagSpec(max(2, round(edges / per_paper)), dim=DIM, seed=SEED, reverse=True)


def mag_dir(edges: int) -> tuple[str, dict]:
    """The typed graph of about `edges` edges, generated once under data/bench (a folder keyed
    by the generator's parameters), and its graph.json."""
    from sparkgnn.datasets.synthetic_mag import write_synthetic_mag

    spec = mag_spec(edges)
    path = os.path.join(DATA, f"synthetic_mag_p{spec.num_papers}_d{spec.dim}_s{spec.seed}_rev")
    if not os.path.exists(os.path.join(path, "graph.json")):
        write_synthetic_mag(path, spec.num_papers, dim=spec.dim, seed=spec.seed, reverse=True, overwrite=True)
    with open(os.path.join(path, "graph.json")) as fh:
        return path, json.load(fh)


def make_models(graph: str, folder: str) -> tuple[str, str]:
    """The to_hetero GraphSAGE for the graph's metadata, saved for both sides: a HeteroModel
    directory for the job and a state dict (with its widths) for the PyG script."""
    from sparkgnn.graph.typed_io import typed_structure
    from sparkgnn.models.hetero import HeteroModel

    meta, _, edge_types = typed_structure(graph)
    metadata = (list(meta["node_types"]), edge_types)
    widths = {t: (meta["types"][t].get("feature_dim") or FEATURELESS_WIDTH) for t in metadata[0]}
    module = build_model(metadata, widths, HIDDEN, OUT, seed=SEED)
    paths = (os.path.join(folder, "hetero_sage_model"), os.path.join(folder, "hetero_sage_pyg.pt"))
    HeteroModel.from_pyg(module, metadata, in_dims=widths).save(paths[0])
    torch.save({"weights": module.state_dict(), "widths": widths, "hidden": HIDDEN, "out": OUT}, paths[1])
    return paths


def _phase_seconds(report: dict, prefix: str) -> float:
    return sum(row["seconds"] for row in report.get("phases", []) if row["name"].startswith(prefix))


def sparkgnn_job(graph: str, model: str, scratch: str, timeout_s: float) -> dict:
    """One cold typed job on a fresh work dir; its round times from the report (module doc)."""
    report_path = os.path.join(scratch, "report.json")
    run = run_cold(batch_job_cmd(graph, model, scratch, os.path.join(scratch, "work"), report_path), timeout_s)
    common = {
        "wall_s": round(run["wall_s"], 2),
        "peak_rss_gib": round(run["peak_rss_gib"], 2),
        "peak_private_gib": round(run["peak_private_gib"], 2),
    }
    if run["rc"] != 0 or not os.path.exists(report_path):
        return {"ok": False, **common, "tail": run["output"][-2000:]}
    with open(report_path) as fh:
        report = json.load(fh)
    rounds: list[dict] = [{"relations": {}, "steps_s": 0.0, "prepare_s": 0.0} for _ in range(LAYERS)]
    for key, relation in report["relations"].items():
        index, name = key.split(":", 1)
        steps = sum(relation["seconds_by_layer"].values())
        entry = rounds[int(index)]
        entry["relations"][name] = {
            "steps_s": round(steps, 3),
            "prepare_s": relation["prepare_s"],
            "prepare_reused": relation["prepare_reused"],
            "strategies": relation["strategies"],
            "partitions": relation["partitions"],
            "exchange": relation["exchange"],
        }
        entry["steps_s"] += steps
        entry["prepare_s"] += relation["prepare_s"] if not relation["prepare_reused"] else 0.0
    for index, entry in enumerate(rounds):
        entry["merge_s"] = round(_phase_seconds(report, f"typed round {index}: merge"), 3)
        # the round's relation layouts prepared side by side before its jobs (engine.typed_prepare)
        entry["prepare_s"] += _phase_seconds(report, f"typed round {index}: relation layouts")
        # relation jobs run side by side (engine.typed_jobs): the round pays their phase's wall
        # time (each job's planning and cleanup included), not the sum of their steps
        jobs = [row for row in report.get("phases", []) if row["name"] == f"typed round {index}: relation jobs"]
        if jobs:
            entry["jobs_wall_s"] = round(jobs[0]["seconds"], 3)
        entry["round_s"] = round(entry.get("jobs_wall_s", entry["steps_s"]) + entry["merge_s"], 3)
        entry["steps_s"], entry["prepare_s"] = round(entry["steps_s"], 3), round(entry["prepare_s"], 3)
    top = sorted(report.get("phases", []), key=lambda row: -row["seconds"])
    return {
        "ok": True,
        **common,
        "session_start_s": report["session_start_s"],
        "total_s": report["total_s"],
        "layer_s": [entry["round_s"] for entry in rounds],
        "rounds": rounds,
        "relation_jobs": len(report["relations"]),
        "rows": report["rows"],
        "phases": report.get("phases", []),
        # the phases of jobs that ran side by side (a round's relation jobs), summed over them
        "phases_inside": report.get("inside", {}),
        "top_phases": [f"{row['name']}: {row['seconds']:.2f} s ({row['calls']}x)" for row in top[:10]],
        "unaccounted_s": report.get("unaccounted_s"),
        "out": os.path.join(scratch, "out"),
    }


def pyg_job(graph: str, model: str, scratch: str, timeout_s: float, *, float64: bool = False) -> dict:
    """The cold PyG script; `float64`: the same forward in float64 (the reference, not timed)."""
    folder = "pyg64_out" if float64 else "pyg_out"
    cmd = [
        sys.executable,
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyg_hetero_cold_job.py"),
        "--graph",
        graph,
        "--model",
        model,
        "--out",
        os.path.join(scratch, folder),
        *(["--float64"] if float64 else []),
    ]
    run = run_cold(cmd, timeout_s)
    lines = [line for line in run["output"].splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"ok": False, "error": run["output"][-500:]}
    if run["rc"] != 0 and result.get("ok"):
        result = {"ok": False, "error": f"exit code {run['rc']}"}
    if run["rc"] in (-9, 137) and not lines:
        result = {"ok": False, "error": "killed (out of memory)"}
    return {
        **result,
        "wall_s": round(run["wall_s"], 2),
        "peak_rss_gib": round(run["peak_rss_gib"], 2),
        "out": os.path.join(scratch, folder),
    }


def _type_rows(folder: str, node_type: str):
    """(ids, h) of a node type from a job's output (OUT/<type>/) or the PyG script's (OUT/<type>.parquet)."""
    path = os.path.join(folder, node_type)
    return read_sparkgnn_output(path if os.path.isdir(path) else f"{path}.parquet")


def compare(got: str, reference: str, types: list[str]) -> dict[str, float]:
    """max |got - reference| / max |reference| per node type, rows matched by id (inf: the ids differ)."""
    return {t: max_rel_error(*_type_rows(got, t), *_type_rows(reference, t)) for t in types}


def measure(edges: int, models: tuple[str, str], timeout_s: float) -> dict:
    started = time.perf_counter()
    graph, meta = mag_dir(edges)
    point: dict = {
        "target_edges": edges,
        "edges": meta["num_edges"],
        "vertices": meta.get("num_vertices"),
        "edges_by_type": {key: rel["num_edges"] for key, rel in meta["relations"].items()},
        "vertices_by_type": {t: node["num_vertices"] for t, node in meta["types"].items()},
        "graph_generation_s": round(time.perf_counter() - started, 1),
    }
    scratch = tempfile.mkdtemp(prefix="sparkgnn-hetero-", dir=DATA)
    try:
        print(f"hetero {point['edges']:,} edges: sparkgnn cold job ...", flush=True)
        point["sparkgnn"] = s = sparkgnn_job(graph, models[0], scratch, timeout_s)
        print(f"  {json.dumps({k: v for k, v in s.items() if k not in ('phases', 'rounds')})}", flush=True)
        print(f"hetero {point['edges']:,} edges: PyG cold job ...", flush=True)
        point["pyg"] = p = pyg_job(graph, models[1], scratch, timeout_s)
        print(f"  {json.dumps(p)}", flush=True)
        if s["ok"] and p.get("ok"):
            types = sorted(s["rows"])
            errors = compare(s["out"], p["out"], types)
            point["max_rel_error_by_type"] = errors
            point["max_rel_error"] = max(errors.values())
            point["exact"] = point["max_rel_error"] <= EXACT_TOL
            # float32 sums over hubs of thousands of rows differ by their order: both float32
            # results against PyG's forward in float64 say which one is off, if any
            reference = pyg_job(graph, models[1], scratch, timeout_s, float64=True)
            if reference.get("ok"):
                point["float64_reference"] = {
                    "sparkgnn_max_rel_error_by_type": compare(s["out"], reference["out"], types),
                    "pyg_max_rel_error_by_type": compare(p["out"], reference["out"], types),
                }
                worst = max(point["float64_reference"]["sparkgnn_max_rel_error_by_type"].values())
                point["exact_vs_float64"] = worst <= EXACT_TOL
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    s, p = point["sparkgnn"], point["pyg"]
    s.pop("out", None)
    p.pop("out", None)
    if s["ok"] and p.get("ok"):
        point["sparkgnn_layer_s"] = round(sum(s["layer_s"]) / LAYERS, 3)
        point["pyg_layer_s"] = round(sum(p["layer_s"]) / LAYERS, 3)
        point["layer_ratio_vs_pyg"] = round(point["sparkgnn_layer_s"] / point["pyg_layer_s"], 2)
        point["job_ratio_vs_pyg"] = round(s["wall_s"] / p["wall_s"], 2)
    return point


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [p for p in result["points"] if p["sparkgnn"]["ok"]]
    if not points:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [f"{p['edges'] / 1e6:.1f}M" for p in points]

    def prepare(s):
        return sum(r["prepare_s"] for r in s["rounds"])

    def rest(s):
        return s["wall_s"] - s["session_start_s"] - prepare(s) - sum(s["layer_s"])

    parts = [
        ("JVM + session", lambda s: s["session_start_s"]),
        ("prepare (relations)", prepare),
        *[(f"round {i + 1} (relation jobs + merge)", lambda s, i=i: s["layer_s"][i]) for i in range(LAYERS)],
        ("rest (plans, inputs, output, shutdown)", rest),
    ]
    bottom = [0.0] * len(points)
    for name, get in parts:
        values = [max(get(p["sparkgnn"]), 0.0) for p in points]
        ax1.bar([i - 0.2 for i in range(len(points))], values, 0.4, bottom=bottom, label=f"sparkgnn: {name}")
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    pyg = [p["pyg"]["wall_s"] if p["pyg"].get("ok") else 0 for p in points]
    ax1.bar([i + 0.2 for i in range(len(points))], pyg, 0.4, color="gray", label="PyG cold job (whole)")
    ax1.set_xticks(range(len(points)), labels)
    ax1.set_ylabel("seconds, cold, one job")
    ax1.set_title("typed job as a user pays it")
    ax1.legend(fontsize=7)
    ok = [p for p in points if "layer_ratio_vs_pyg" in p]
    x = range(len(ok))
    ax2.bar([i - 0.2 for i in x], [p["sparkgnn_layer_s"] for p in ok], 0.4, label="sparkgnn s/round")
    ax2.bar([i + 0.2 for i in x], [p["pyg_layer_s"] for p in ok], 0.4, color="gray", label="PyG s/layer")
    for i, p in enumerate(ok):
        ax2.annotate(f"{p['layer_ratio_vs_pyg']}x", (i, max(p["sparkgnn_layer_s"], p["pyg_layer_s"])), ha="center")
    ax2.set_xticks(list(x), [f"{p['edges'] / 1e6:.1f}M" for p in ok])
    ax2.set_ylabel("seconds per layer (mean of 2)")
    ax2.set_title("per-layer cost, to_hetero SAGE")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES), help="edge counts, comma-separated")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per cold job")
    parser.add_argument("--results", default=RESULTS, help="folder for hetero.json and hetero.png")
    parser.add_argument("--note", default=None, help="a line recorded in the result (why these sizes, ...)")
    args = parser.parse_args()
    loadavg = os.getloadavg()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes or min(sizes) < 1000:
        parser.error(f"--sizes {args.sizes!r}: give edge counts of at least 1000, comma-separated")
    os.makedirs(DATA, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="sparkgnn-hetero-models-", dir=DATA)
    try:
        models = make_models(mag_dir(sizes[0])[0], folder)  # the metadata is the same at every size
        points = [measure(edges, models, args.timeout_s) for edges in sizes]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    by_target = {p["target_edges"]: p for p in points}
    result = {
        "what": "cold typed batch inference job (spark_jobs/batch_inference.py) vs a cold PyG script of the same "
        "to_hetero model, per graph size",
        "graph": f"synthetic OGB-MAG-shaped (synthetic_mag, reverse relations), paper {DIM}-d, other types "
        f"featureless (a constant column of {FEATURELESS_WIDTH}), seed {SEED}",
        "model": f"to_hetero(2 x SAGEConv mean, relu), aggr sum, hidden {HIDDEN}, out {OUT}",
        "machine": machine(),
        "loadavg": loadavg,
        "note": args.note,
        "points": points,
        "layer_ratio_vs_pyg_8m": by_target.get(8_000_000, {}).get("layer_ratio_vs_pyg"),
        "job_ratio_vs_pyg_8m": by_target.get(8_000_000, {}).get("job_ratio_vs_pyg"),
        "all_exact": all(p.get("exact") for p in points),
        "all_exact_vs_float64": all(p.get("exact_vs_float64") for p in points),
    }
    os.makedirs(args.results, exist_ok=True)
    path = os.path.join(args.results, "hetero.json")
    if os.path.abspath(args.results) == os.path.abspath(RESULTS):
        path = write_result("hetero", result)
    else:
        with open(path, "w") as fh:
            json.dump(result, fh, indent=2, sort_keys=True)
    plot(result, os.path.join(args.results, "hetero.png"))
    summary = {
        k: result[k] for k in ("layer_ratio_vs_pyg_8m", "job_ratio_vs_pyg_8m", "all_exact", "all_exact_vs_float64")
    }
    print(json.dumps(summary, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
