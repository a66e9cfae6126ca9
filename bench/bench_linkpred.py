"""Link prediction as a spark-submit user pays it (make bench-linkpred).

On the bench-scale graphs (synthetic Zipf, nodes = edges / 10, 128-d, seeded; bench_common) and the
2-layer GraphSAGE of bench-scale (hidden 128) with a dot and a concat-MLP decoder, each cold in its
own process:
  - scoring: `python spark_jobs/score_edges.py` over --pairs seeded random (src, dst) pairs (one
    Parquet per graph) vs bench/pyg_linkpred_job.py --mode score (the same encoder and decoder in
    memory, the same Parquet read, scores written), per decoder;
  - top-k (dot decoder, k = 10, every node a candidate): `python spark_jobs/topk.py` exact and
    --approx (--recall-sample 0: recall@10 is measured here against the exact job's output) vs
    pyg_linkpred_job.py --mode topk (torch.topk over blocks of a matrix product), for the same
    seeded sample of --topk-sources sources (all nodes when it is 0).
Peak RSS is the largest sum over the process tree (bench_scale.PeakRss). Phases of a Spark job are
read from the seconds at which its progress lines arrive (`phases`). Ratios are sparkgnn / PyG.

Writes RESULTS/linkpred.json and linkpred.png (RESULTS: bench/results unless --results).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import DATA, RESULTS, ROOT, machine, synthetic_dir  # noqa: E402
from bench_scale import DIM, HIDDEN, LAYERS, PeakRss  # noqa: E402
from pyg_linkpred_job import ConcatMLPDecoder, DotDecoder  # noqa: E402

DEFAULT_SIZES = (2_000_000, 8_000_000)
DECODER_HIDDEN = 64
K = 10
HERE = os.path.dirname(os.path.abspath(__file__))


def make_models(root: str) -> dict[str, tuple[str, str]]:
    """{decoder: (sparkgnn model dir, PyG state file)}: bench-scale's encoder (seed 0) with each decoder."""
    from torch_geometric.nn import GraphSAGE

    from sparkgnn.models import Model

    torch.manual_seed(0)
    encoder = GraphSAGE(DIM, HIDDEN, LAYERS, aggr="mean").eval()
    decoders = {"dot": DotDecoder(), "mlp": ConcatMLPDecoder(HIDDEN, DECODER_HIDDEN).eval()}
    models = {}
    for name, decoder in decoders.items():
        spark_model, pyg_model = os.path.join(root, f"lp_{name}"), os.path.join(root, f"lp_{name}_pyg.pt")
        Model.from_pyg(encoder, output="embedding", decoder=decoder).save(spark_model)
        state = {"weights": encoder.state_dict(), "in": DIM, "hidden": HIDDEN, "layers": LAYERS, "decoder": name}
        if name == "mlp":
            state.update(decoder_weights=decoder.state_dict(), decoder_hidden=DECODER_HIDDEN)
        torch.save(state, pyg_model)
        models[name] = (spark_model, pyg_model)
    return models


def node_ids(graph: str) -> np.ndarray:
    import pyarrow.dataset as ds

    return np.sort(
        ds.dataset(os.path.join(graph, "vertices"), format="parquet").to_table(columns=["id"])["id"].to_numpy()
    )


def pairs_file(graph: str, ids: np.ndarray, count: int, seed: int = 0) -> str:
    """Parquet of `count` seeded uniform (src, dst) pairs of the graph's ids, made once per graph."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(DATA, f"linkpred_pairs_{os.path.basename(graph)}_{count}_s{seed}.parquet")
    if not os.path.exists(path):
        rng = np.random.default_rng(seed)
        table = pa.table({"src": ids[rng.integers(0, len(ids), count)], "dst": ids[rng.integers(0, len(ids), count)]})
        pq.write_table(table, path + ".tmp")
        os.replace(path + ".tmp", path)
    return path


def sources_file(scratch: str, ids: np.ndarray, count: int, seed: int = 0) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    chosen = (
        ids
        if not count or count >= len(ids)
        else np.sort(np.random.default_rng(seed).choice(ids, count, replace=False))
    )
    path = os.path.join(scratch, "sources.parquet")
    pq.write_table(pa.table({"id": chosen}), path)
    return path


def run_timed(cmd: list[str], timeout_s: float) -> dict:
    """Run a command in its own process: wall seconds, peak tree RSS, exit code, and each output line
    with the seconds since the start at which it arrived."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    peak = PeakRss(proc.pid)
    lines: list[tuple[float, str]] = []
    deadline = started + timeout_s
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append((round(time.perf_counter() - started, 2), line.rstrip()))
        if time.perf_counter() > deadline:
            proc.kill()
            break
    proc.wait()
    wall = time.perf_counter() - started
    rss = peak.stop()
    return {
        "wall_s": round(wall, 2),
        "peak_rss_gib": round(rss / 2**30, 2),
        "peak_private_gib": round(peak.peak_private / 2**30, 2),
        "rc": proc.returncode,
        "lines": lines,
    }


# A Spark job's progress lines: Spark's own log-level line (the JVM is up), the first sparkgnn line
# (its trailing "N s" is the first engine step, so that step starts N s before it arrives), the last
# engine line before the job's own end line (node outputs done), the end line. Phases are the gaps.
JVM_UP = re.compile(r"^Setting default log level")
ENGINE = re.compile(r"^sparkgnn")
JOB_LINE = re.compile(r"^(score_edges|topk): ")  # the job's own lines (choices, its end line)
SECONDS = re.compile(r"(\d+(?:\.\d+)?) s\b")


def phases(lines: list[tuple[float, str]], wall: float, end: re.Pattern) -> dict:
    """{phase: seconds} of a Spark job from its timestamped lines (the marks above): JVM start,
    reading and checking the inputs, the node outputs (sparkgnn.infer: prepare and layers), the
    link-prediction work with its write, and the exit."""
    jvm = next((t for t, line in lines if JVM_UP.search(line)), None)
    done = next((t for t, line in lines if end.search(line)), None)
    engine = [(t, line) for t, line in lines if ENGINE.search(line) and (done is None or t <= done)]
    if jvm is None or done is None or not engine:
        return {}
    first_t, first_line = engine[0]
    took = SECONDS.findall(first_line)
    infer_start = max(jvm, first_t - (float(took[-1]) if took else 0.0))
    infer_end = engine[-1][0]
    return {
        "jvm_start_s": jvm,
        "read_and_check_s": round(infer_start - jvm, 2),
        "node_outputs_s": round(infer_end - infer_start, 2),
        "linkpred_and_write_s": round(done - infer_end, 2),
        "exit_s": round(wall - done, 2),
    }


def spark_job(script: str, argv: list[str], scratch: str, timeout_s: float, end: str) -> dict:
    out = os.path.join(scratch, "out")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, os.path.join(ROOT, "spark_jobs", script), *argv, "--out", out]
    cmd += ["--work-dir", os.path.join(scratch, "work")]
    run = run_timed(cmd, timeout_s)
    shutil.rmtree(os.path.join(scratch, "work"), ignore_errors=True)  # cold: every job prepares
    result = {k: run[k] for k in ("wall_s", "peak_rss_gib", "peak_private_gib")}
    result["ok"] = run["rc"] == 0
    result["phases"] = phases(run["lines"], run["wall_s"], re.compile(end))
    result["progress"] = [
        f"{t:7.2f} {line}" for t, line in run["lines"] if ENGINE.search(line) or JOB_LINE.search(line)
    ]
    if not result["ok"]:
        result["tail"] = [line for _t, line in run["lines"][-30:]]
        result["errors"] = [
            line for _t, line in run["lines"] if re.search(r"Error|Exception|exceed", line) and "\tat " not in line
        ][:20]
    return result


def pyg_job(argv: list[str], timeout_s: float) -> dict:
    run = run_timed([sys.executable, os.path.join(HERE, "pyg_linkpred_job.py"), *argv], timeout_s)
    found = [line for _t, line in run["lines"] if line.startswith("{")]
    result = json.loads(found[-1]) if found else {"ok": False, "error": "\n".join(l for _t, l in run["lines"][-5:])}
    if run["rc"] in (-9, 137) and not found:
        result = {"ok": False, "error": "killed (out of memory)"}
    if result.get("index_build_s") is not None:  # the in-memory index probe is no part of PyG's job
        result["job_s"] = round(run["wall_s"] - result["index_build_s"] - result["index_query_s"], 2)
    return {**result, "wall_s": run["wall_s"], "peak_rss_gib": run["peak_rss_gib"]}


def read_topk(path: str) -> dict[int, set[int]]:
    import pyarrow.dataset as ds

    table = ds.dataset(path, format="parquet").to_table(columns=["src", "dst"])
    out: dict[int, set[int]] = {}
    for s, d in zip(table["src"].to_numpy(), table["dst"].to_numpy(), strict=True):
        out.setdefault(int(s), set()).add(int(d))
    return out


def recall(approx: dict[int, set[int]], exact: dict[int, set[int]]) -> float:
    """Mean over the exact answer's sources of |approx & exact| / |exact|."""
    return float(np.mean([len(approx.get(s, set()) & want) / len(want) for s, want in exact.items()]))


def measure(edges: int, models: dict, args) -> dict:
    nodes = edges // 10
    graph = synthetic_dir(nodes, edges, DIM)
    ids = node_ids(graph)
    point: dict = {"edges": edges, "nodes": nodes, "candidates": len(ids), "loadavg": os.getloadavg()}
    scratch = tempfile.mkdtemp(prefix="sparkgnn-linkpred-", dir=DATA)
    try:
        pairs = pairs_file(graph, ids, args.pairs)
        point["pairs"] = args.pairs
        for name, (spark_model, pyg_model) in models.items():
            if "score" not in args.parts or name not in args.decoders:
                continue
            print(f"linkpred {edges:,} edges: score {args.pairs:,} pairs, {name} decoder ...", flush=True)
            s = spark_job(
                "score_edges.py",
                ["--graph", graph, "--model", spark_model, "--pairs", pairs],
                scratch,
                args.timeout_s,
                r"^score_edges: wrote",
            )
            p = pyg_job(["--graph", graph, "--model", pyg_model, "--mode", "score", "--pairs", pairs,
                         "--out", os.path.join(scratch, "pyg_scores.parquet")], args.timeout_s)  # fmt: skip
            entry = {"sparkgnn": s, "pyg": p}
            if s["ok"] and p.get("ok"):
                entry["job_ratio_vs_pyg"] = round(s["wall_s"] / p["wall_s"], 2)
            point[f"score_{name}"] = entry
            print(f"  sparkgnn {s['wall_s']} s {s['phases']}; PyG {p['wall_s']} s", flush=True)
        if "topk" not in args.parts:
            return point
        sources = sources_file(scratch, ids, args.topk_sources)
        point["topk_sources"] = len(ids) if not args.topk_sources else min(args.topk_sources, len(ids))
        spark_model, pyg_model = models["dot"]
        answers = {}
        for variant, extra in (("exact", []), ("approx", ["--approx", "--recall-sample", "0"])):
            print(f"linkpred {edges:,} edges: top-{K} of {point['topk_sources']:,} sources, {variant} ...", flush=True)
            argv = ["--graph", graph, "--model", spark_model, "--k", str(K), "--sources", sources, *extra]
            point[f"topk_{variant}"] = spark_job("topk.py", argv, scratch, args.timeout_s, r"topk: wrote")
            if point[f"topk_{variant}"]["ok"]:
                answers[variant] = read_topk(os.path.join(scratch, "out"))
            print(f"  {point[f'topk_{variant}']['wall_s']} s {point[f'topk_{variant}']['phases']}", flush=True)
        pyg_out = os.path.join(scratch, "pyg_topk.parquet")
        point["topk_pyg"] = pyg_job(["--graph", graph, "--model", pyg_model, "--mode", "topk", "--sources", sources,
                                     "--k", str(K), "--out", pyg_out,
                                     *(["--index-probe"] if len(ids) <= args.index_probe_max else [])],
                                    args.timeout_s)  # fmt: skip
        if point["topk_pyg"].get("ok"):
            answers["pyg"] = read_topk(pyg_out)
        summarise_topk(point, answers)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return point


def summarise_topk(point: dict, answers: dict) -> None:
    exact, approx = point["topk_exact"], point["topk_approx"]
    if "exact" in answers and "approx" in answers:
        point["recall_at_10_approx_vs_exact"] = round(recall(answers["approx"], answers["exact"]), 4)
    if "exact" in answers and "pyg" in answers:
        point["exact_equals_pyg_share"] = round(recall(answers["exact"], answers["pyg"]), 4)
    if exact["ok"] and approx["ok"]:
        point["approx_speedup_job"] = round(exact["wall_s"] / approx["wall_s"], 2)
        e, a = exact["phases"].get("linkpred_and_write_s"), approx["phases"].get("linkpred_and_write_s")
        if e and a:
            point["approx_speedup_topk_phase"] = round(e / a, 2)
    pyg, nodes, sources = point["topk_pyg"], point["candidates"], point["topk_sources"]
    if exact["ok"] and exact["phases"].get("linkpred_and_write_s") and sources < nodes:
        # the exact tiles cost sources x candidates: linear in the sources
        point["exact_topk_all_nodes_projected_s"] = round(exact["phases"]["linkpred_and_write_s"] * nodes / sources, 1)
    if pyg.get("index_build_s") is not None and sources < nodes:
        # one shard per task, the tasks in parallel: a shard's build plus every node's search of it
        per_source = pyg["index_query_s"] / sources
        point["approx_topk_all_nodes_projected_s"] = round(pyg["index_build_s"] + per_source * nodes, 1)
        if "exact_topk_all_nodes_projected_s" in point:
            point["approx_speedup_all_nodes_projected"] = round(
                point["exact_topk_all_nodes_projected_s"] / point["approx_topk_all_nodes_projected_s"], 2
            )
    if exact["ok"] and point["topk_pyg"].get("ok"):
        pyg_job_s = point["topk_pyg"].get("job_s", point["topk_pyg"]["wall_s"])
        point["exact_job_ratio_vs_pyg"] = round(exact["wall_s"] / pyg_job_s, 2)


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = result["points"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    names = ("jvm_start_s", "read_and_check_s", "node_outputs_s", "linkpred_and_write_s", "exit_s")
    bars: list[tuple[str, dict | None, dict]] = []
    for p in points:
        size = f"{p['edges'] / 1e6:g}M"
        for dec in ("dot", "mlp"):
            entry = p.get(f"score_{dec}", {})
            bars.append((f"{size}\nscore {dec}", entry.get("sparkgnn"), entry.get("pyg", {})))
    for ax, rows, title in (
        (ax1, bars, f"scoring {points[0]['pairs'] / 1e6:g}M pairs, cold jobs"),
        (
            ax2,
            [
                (f"{p['edges'] / 1e6:g}M\n{v}", p.get(f"topk_{v}"), p.get("topk_pyg", {}) if v == "exact" else {})
                for p in points
                for v in ("exact", "approx")
            ],
            f"top-{K} over every node, {points[0].get('topk_sources', 0):,} sampled sources, cold jobs",
        ),
    ):
        bottom = [0.0] * len(rows)
        for name in names:
            values = [(s or {}).get("phases", {}).get(name, 0.0) for _label, s, _p in rows]
            ax.bar([i - 0.2 for i in range(len(rows))], values, 0.4, bottom=bottom, label=f"sparkgnn: {name[:-2]}")
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        pyg = [p.get("job_s", p.get("wall_s", 0)) if p.get("ok") else 0 for _label, _s, p in rows]
        ax.bar([i + 0.2 for i in range(len(rows))], pyg, 0.4, color="gray", label="PyG cold job")
        ax.set_xticks(range(len(rows)), [label for label, _s, _p in rows], fontsize=8)
        ax.set_ylabel("seconds")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def summary_keys(points: list[dict]) -> dict:
    out: dict = {}
    for p in points:
        suffix = f"{p['edges'] // 1_000_000}m"
        for dec in ("dot", "mlp"):
            out[f"score_{dec}_job_ratio_vs_pyg_{suffix}"] = p.get(f"score_{dec}", {}).get("job_ratio_vs_pyg")
        for key in ("approx_speedup_job", "approx_speedup_topk_phase", "recall_at_10_approx_vs_exact",
                    "exact_job_ratio_vs_pyg", "exact_equals_pyg_share", "exact_topk_all_nodes_projected_s",
                    "approx_topk_all_nodes_projected_s", "approx_speedup_all_nodes_projected"):  # fmt: skip
            out[f"{key}_{suffix}"] = p.get(key)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES), help="edge counts, comma-separated")
    parser.add_argument("--pairs", type=int, default=10_000_000, help="pairs scored per graph")
    parser.add_argument("--topk-sources", type=int, default=0, help="sampled top-k sources (0: every node)")
    parser.add_argument(
        "--index-probe-max", type=int, default=250_000, help="time one HNSW shard in memory up to this many nodes"
    )
    parser.add_argument(
        "--merge", default=None, help="an earlier linkpred.json whose points of other sizes this run keeps"
    )
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per cold job")
    parser.add_argument("--results", default=RESULTS, help="where linkpred.json and linkpred.png go")
    parser.add_argument("--note", default=None, help="recorded in the JSON (why a run is smaller than the default)")
    parser.add_argument(
        "--parts", default="score,topk", help="what to measure: score, topk or both (with --merge, the rest is kept)"
    )
    parser.add_argument("--decoders", default="dot,mlp", help="score: the decoders to measure (dot, mlp)")
    args = parser.parse_args()
    args.parts = {s.strip() for s in args.parts.split(",") if s.strip()}
    args.decoders = {s.strip() for s in args.decoders.split(",") if s.strip()}
    if not args.parts or not args.parts <= {"score", "topk"} or not args.decoders <= {"dot", "mlp"}:
        parser.error("--parts takes score and/or topk, --decoders dot and/or mlp")
    loadavg = os.getloadavg()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    os.makedirs(DATA, exist_ok=True)
    model_dir = tempfile.mkdtemp(prefix="sparkgnn-linkpred-models-", dir=DATA)
    try:
        return run_sizes(args, sizes, make_models(model_dir), loadavg)
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)


def run_sizes(args, sizes: list[int], models: dict, loadavg: tuple) -> int:
    """Measure each size and rewrite the result files after each (a run cut short keeps what it measured)."""
    earlier: dict = {"points": []}
    if args.merge:
        with open(args.merge) as fh:
            earlier = json.load(fh)
    points = [p for p in earlier["points"] if p["edges"] not in sizes]
    before = {p["edges"]: p for p in earlier["points"]}
    for edges in sizes:
        point = {**before.get(edges, {}), **measure(edges, models, args)}  # what was not measured is kept
        if "topk" not in args.parts and "loadavg" in before.get(edges, {}):
            point["loadavg_of_kept_topk"] = before[edges].get("loadavg_of_kept_topk", before[edges]["loadavg"])
        points = sorted([*points, point], key=lambda p: p["edges"])
        result = {
            "what": "cold score_edges.py / topk.py jobs vs cold PyG scripts (pyg_linkpred_job.py), per graph size",
            "graph": f"synthetic Zipf, nodes = edges/10, {DIM}-d, seed 0",
            "model": f"{LAYERS}-layer GraphSAGE (mean), hidden {HIDDEN}; dot, MLP(concat, {DECODER_HIDDEN}) decoders",
            "k": K,
            "loadavg": loadavg,
            "loadavg_of_merged_run": earlier.get("loadavg"),
            "note": args.note or earlier.get("note"),
            "machine": machine(),
            "points": points,
            **summary_keys(points),
        }
        os.makedirs(args.results, exist_ok=True)
        path = os.path.join(args.results, "linkpred.json")
        with open(path, "w") as fh:
            json.dump(result, fh, indent=2, sort_keys=True)
        plot(result, os.path.join(args.results, "linkpred.png"))
    print(json.dumps(summary_keys(points), indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
