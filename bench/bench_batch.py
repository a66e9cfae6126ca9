"""Batch inference benchmark (make bench-batch): sparkgnn on local Spark vs PyG in memory.

Bench graph: synthetic 200K nodes / 2M edges / 128-d (Zipf in-degrees), 2-layer SAGE-mean, hidden 128.
Measured in one run: PyG full-graph forward seconds per layer, both with `edge_index` and with the
transposed adjacency as a torch sparse CSR tensor (`adj_t`, PyG's fast path; outputs checked equal
to 1e-5, ratios quoted against the faster); sparkgnn seconds per layer for each
strategy (steady state: after a warm-up run in the same JVM; session start reported apart); bytes
shuffled per layer (Spark's stage metrics); max relative error vs PyG; the planner's auto choice;
a scaling series; and a graph that PyG cannot run under an address-space cap that sparkgnn's
Python workers run under too (spark.executor.pyspark.memory). Last, the generic-fallback section
(bench_generic.py, `--section generic` alone): cold jobs of the generic fallback vs the native layer
of the same conv, next to PyG, at 2M and 8M edges.
Writes bench/results/batch.json and bench/results/batch.png.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import DATA, RESULTS, graph_arguments, machine, median_seconds, synthetic_dir, write_result  # noqa: E402
from bench_generic import add_arguments as add_generic_arguments  # noqa: E402
from bench_generic import check_arguments as check_generic_arguments  # noqa: E402
from bench_generic import run_section as run_generic_section  # noqa: E402

STRATEGIES = ["edge_join", "replicate", "combine", "pushdown"]
# The pushdown comparison (issue 17): every strategy through Spark's shuffle (like for like: pushdown
# needs Spark's rows, the files exchange serves only replicate and combine), at two graph sizes.
PUSHDOWN_SIZES = (2_000_000, 8_000_000)
# Each configuration runs REPEATS times after the warm-up and the fastest counts (all are kept):
# the first runs in a JVM are still slower (docs/PLATFORM.md: 2-3x for the very first).
REPEATS = 2


def best_of(repeats: int, run):
    attempts = [run() for _ in range(repeats)]
    result, best = min(attempts, key=lambda pair: pair[1]["seconds_per_layer"])
    best = dict(best, all_runs_seconds_per_layer=[a[1]["seconds_per_layer"] for a in attempts])
    return result, best


def pyg_per_layer(module, data, adj) -> list[float]:
    """Median seconds of each of the module's two layers given the graph as `adj` (edge_index or
    a sparse adj_t)."""
    x = torch.from_numpy(data.x)
    with torch.no_grad():
        h1 = module.act(module.convs[0](x, adj))
        timings = [
            median_seconds(lambda: module.convs[0](x, adj)),
            median_seconds(lambda: module.convs[1](h1, adj)),
        ]
    return timings


def pyg_both_ways(module, data) -> tuple[dict, np.ndarray]:
    """PyG's layers with edge_index and with the sparse CSR adj_t (pyg_cold_job.csr_adj_t), their
    outputs checked equal (1e-5 relative, else the bench stops), and the edge_index output as the
    reference sparkgnn is compared with."""
    import warnings

    from pyg_cold_job import csr_adj_t

    warnings.filterwarnings("ignore", message=".*[Ss]parse.*")  # torch's beta notice on CSR tensors
    x, edge_index = torch.from_numpy(data.x), data.edge_index_torch()
    adj_t = csr_adj_t(edge_index, data.num_nodes)
    with torch.no_grad():
        reference = module(x, edge_index).numpy()
        via_csr = module(x, adj_t).numpy()
    error = float(np.abs(via_csr - reference).max() / np.abs(reference).max())
    if error > 1e-5:
        raise RuntimeError(f"PyG's adj_t output differs from its edge_index output ({error:.1e})")
    layers = {"edge_index": pyg_per_layer(module, data, edge_index), "csr": pyg_per_layer(module, data, adj_t)}
    per_layer = {name: float(np.mean(seconds)) for name, seconds in layers.items()}
    faster = min(per_layer, key=per_layer.get)
    return {
        "layers": layers,
        "per_layer": per_layer,
        "faster": faster,
        "csr_max_rel_error_vs_edge_index": error,
    }, reference


def spark_output(result, num_nodes: int, index_of) -> np.ndarray:
    table = result.toArrow()
    h = np.stack(table.column("h").to_numpy(zero_copy_only=False))
    out = np.empty((num_nodes, h.shape[1]), dtype=np.float32)
    out[index_of(table.column("id").to_numpy())] = h
    return out


def run_strategy(spark, graph_dir, model, strategy, work_dir, partitions=None, workers="inprocess", exchange="auto"):
    from sparkgnn import infer

    started = time.perf_counter()
    job = infer(
        spark,
        graph_dir,
        model,
        strategy=strategy,
        partitions=partitions,
        work_dir=work_dir,
        validate=False,
        workers=workers,
        exchange=exchange,
    )
    result, report, plan = job.frame, job.report, job.plan
    wall = time.perf_counter() - started
    steps = [
        {"label": s.label, "seconds": s.seconds, **(s.shuffle or {}), "task_seconds": s.task_seconds}
        for s in report.steps
    ]
    return result, {
        "strategy": strategy,
        "exchange": report.exchange,
        "chosen": [layer.strategy for layer in plan.layers],
        "partitions": plan.partitions,
        "steps": steps,
        "seconds_total": sum(s["seconds"] for s in steps),
        "seconds_per_layer": sum(s["seconds"] for s in steps) / len(plan.layers),
        "wall_seconds_incl_planning": wall,
        "shuffle_write_bytes_per_layer": sum(s.get("shuffle_write_bytes", 0) for s in steps) / len(plan.layers),
        "planner_estimate_seconds": plan.estimates.get("seconds") if isinstance(plan.estimates, dict) else None,
    }


def _note_in_messenger_report(run: dict) -> None:
    """The messenger report (make bench-messenger) carries the end-to-end batch inference ratio."""
    path = os.path.join(RESULTS, "messenger.json")
    if not os.path.exists(path):
        return
    with open(path) as fh:
        report = json.load(fh)
    report["batch_inference_end_to_end"] = {
        "strategy": run["strategy"],
        "messenger_local2_seconds_per_layer": run["seconds_per_layer"],
        "messenger_vs_inprocess": run["messenger_vs_inprocess"],
        "source": "bench/bench_batch.py",
    }
    with open(path, "w") as fh:
        json.dump(report, fh, indent=2, sort_keys=True)


def save_pyg_model(module, path: str, dims: dict) -> None:
    torch.save({"weights": module.state_dict(), **dims}, path)


def pyg_probe(graph_dir: str, model_path: str, cap_bytes: int = 0, adj: str = "edge_index") -> dict:
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(os.path.dirname(__file__), "pyg_layer_probe.py"),
            "--graph",
            graph_dir,
            "--model",
            model_path,
            "--cap-bytes",
            str(cap_bytes),
            "--adj",
            adj,
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if lines:
        return json.loads(lines[-1])
    return {
        "ok": False,
        "error": f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1:] if out.stderr else ''}",
    }


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    names = ["PyG (in memory)"] + [f"sparkgnn {r['strategy']}" for r in result["strategies"]]
    seconds = [result["pyg_seconds_per_layer"]] + [r["seconds_per_layer"] for r in result["strategies"]]
    axes[0].bar(names, seconds, color=["tab:gray"] + ["tab:blue"] * len(result["strategies"]))
    axes[0].set_ylabel("seconds per layer")
    axes[0].set_title(f"{result['graph']['label']}\nbest/PyG = {result['ratio_best_vs_pyg']:.2f}x")
    axes[0].tick_params(axis="x", rotation=20)
    axes[1].bar(
        [r["strategy"] for r in result["strategies"]],
        [r["shuffle_write_bytes_per_layer"] / 2**20 for r in result["strategies"]],
        color="tab:orange",
    )
    axes[1].set_ylabel("MiB shuffled per layer")
    axes[1].set_title("bytes moved by strategy")
    if result.get("scaling"):
        edges = [p["edges"] for p in result["scaling"]]
        axes[2].plot(edges, [p["sparkgnn_seconds_per_layer"] for p in result["scaling"]], "o-", label="sparkgnn (auto)")
        axes[2].plot(edges, [p["pyg_seconds_per_layer"] or np.nan for p in result["scaling"]], "s-", label="PyG")
        axes[2].set_xscale("log")
        axes[2].set_yscale("log")
        axes[2].set_xlabel("edges")
        axes[2].set_ylabel("seconds per layer")
        axes[2].legend()
        axes[2].set_title("scaling (nodes = edges / 10, 128-d)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def pushdown_section(spark, model, dim: int, work_dir: str, log=print) -> dict:
    """Seconds per layer and bytes shuffled per layer of every strategy at each of PUSHDOWN_SIZES,
    all through Spark's shuffle (one run each after a warm-up on that graph), next to auto with the
    default exchange; pushdown's ratio to the fastest other strategy, whether auto picks it, and
    where its layer time goes (Spark task seconds from the JVM module's listener, Python task
    seconds per phase)."""
    section = {"how": "exchange=shuffle for every strategy; one run each after a warm-up (auto) on the graph"}
    for edges in PUSHDOWN_SIZES:
        path = synthetic_dir(edges // 10, edges, dim)
        run_strategy(spark, path, model, "auto", work_dir)  # warm-up: prepare, Python workers, caches
        runs = {}
        for strategy in STRATEGIES:
            _, run = run_strategy(spark, path, model, strategy, work_dir, exchange="shuffle")
            runs[strategy] = run
            log(
                f"{edges / 1e6:g}M {strategy} (shuffle): {run['seconds_per_layer']:.2f} s/layer, "
                f"shuffled {run['shuffle_write_bytes_per_layer'] / 2**20:.0f} MiB/layer",
            )
        _, auto = run_strategy(spark, path, model, "auto", work_dir)
        others = {name: run for name, run in runs.items() if name != "pushdown"}
        fastest = min(others, key=lambda name: others[name]["seconds_per_layer"])
        pushdown = runs["pushdown"]
        section[f"{edges // 1_000_000}M"] = {
            "edges": edges,
            "strategies": {
                name: {
                    "seconds_per_layer": run["seconds_per_layer"],
                    "shuffle_write_bytes_per_layer": run["shuffle_write_bytes_per_layer"],
                    "planner_estimate_seconds": run["planner_estimate_seconds"],
                    "partitions": run["partitions"],
                    "steps": run["steps"],
                }
                for name, run in runs.items()
            },
            "fastest_other": fastest,
            "pushdown_time_ratio_vs_fastest_other": pushdown["seconds_per_layer"]
            / others[fastest]["seconds_per_layer"],
            "pushdown_bytes_ratio_vs_fastest_other": pushdown["shuffle_write_bytes_per_layer"]
            / max(others[fastest]["shuffle_write_bytes_per_layer"], 1),
            "auto_default_exchange": {
                "chosen": auto["chosen"],
                "exchange": auto["exchange"],
                "seconds_per_layer": auto["seconds_per_layer"],
            },
            "auto_picks_pushdown": "pushdown" in auto["chosen"],
        }
    return section


def pushdown_cold(section: dict, model, dim: int, log=print) -> dict:
    """What a spark-submit user sees: one cold job per strategy (its own JVM, a fresh work dir so
    prepare is paid, every layer once; `python spark_jobs/batch_inference.py`, the local session
    carrying the jar) for pushdown and the fastest other strategy of the warm runs, through the
    shuffle, at each size."""
    import tempfile

    from bench_scale import sparkgnn_job

    cold = {}
    with tempfile.TemporaryDirectory(prefix="sparkgnn-pushdown-cold-") as scratch:
        model_path = os.path.join(scratch, "model")
        model.save(model_path)
        for size in [key for key in section if key.endswith("M")]:
            edges = section[size]["edges"]
            path = synthetic_dir(edges // 10, edges, dim)
            cold[size] = {}
            for strategy in ("pushdown", section[size]["fastest_other"]):
                job_dir = os.path.join(scratch, f"{size}-{strategy}")
                run = sparkgnn_job(
                    path, model_path, job_dir, 1800, extra_args=["--strategy", strategy, "--exchange", "shuffle"]
                )
                cold[size][strategy] = {
                    k: run.get(k) for k in ("ok", "wall_s", "session_start_s", "prepare_s", "load_s", "layer_s")
                }
                log(f"cold {size} {strategy}: {run.get('wall_s')} s job, layers {run.get('layer_s')}")
            jobs = cold[size]
            other = section[size]["fastest_other"]
            if jobs["pushdown"]["ok"] and jobs[other]["ok"]:
                jobs["pushdown_job_ratio_vs_fastest_other"] = jobs["pushdown"]["wall_s"] / jobs[other]["wall_s"]
    return cold


def plot_pushdown(section: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [key for key in section if key.endswith("M")]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(STRATEGIES)
    for i, strategy in enumerate(STRATEGIES):
        xs = [k + i * width for k in range(len(sizes))]
        runs = [section[size]["strategies"][strategy] for size in sizes]
        axes[0].bar(xs, [r["seconds_per_layer"] for r in runs], width, label=strategy)
        axes[1].bar(xs, [r["shuffle_write_bytes_per_layer"] / 2**20 for r in runs], width, label=strategy)
    for ax, title in zip(axes, ("seconds per layer (shuffle exchange)", "MiB shuffled per layer"), strict=True):
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(sizes))], [f"{s} edges" for s in sizes])
        ax.set_title(title)
        ax.legend()
    fig.suptitle("pushdown (native aggregates in Spark) vs the Python-side strategies, 2-layer SAGE-mean, 2 cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def merge_pruning(spark, dim: int, model, result: dict, log=print) -> None:
    """The k-hop pruning section (bench_pruning.py) on the 2M-edge graph, merged into batch.json
    (`result`, or the file's current content when empty) with `pruned_ids_speedup` at the top."""
    from bench_pruning import plot_pruning, pruning_section
    from torch_geometric.nn import GCN

    from sparkgnn.models import Model

    torch.manual_seed(1)
    gcn = Model.from_pyg(GCN(dim, 128, 2).eval(), output="embedding")
    section = pruning_section(spark, synthetic_dir(200_000, 2_000_000, dim), model, gcn, log=log)
    path = os.path.join(RESULTS, "batch.json")
    if not result:
        result.update(json.load(open(path)) if os.path.exists(path) else {})
    result["pruning"] = section
    result["pruned_ids_speedup"] = section["pruned_ids_speedup"]
    write_result("batch", result)
    plot_pruning(section, os.path.join(RESULTS, "batch_pruning.png"))


def main() -> int:
    parser = graph_arguments(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("--scaling", default="500000,1000000,2000000,4000000,8000000")
    parser.add_argument("--cap-gb", type=float, default=4.0)
    parser.add_argument("--cap-edges", type=int, default=8_000_000)
    parser.add_argument(
        "--section",
        choices=("all", "pushdown", "pushdown-cold", "pruned-ids", "generic"),
        default="all",
        help="pushdown / generic: run only that comparison and merge it into the existing batch.json",
    )
    add_generic_arguments(parser)
    args = parser.parse_args()
    try:
        check_generic_arguments(args)
    except ValueError as e:
        parser.error(str(e))
    if args.section == "generic":  # cold jobs only: no session in this process
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        run_generic_section(args)
        return 0

    from pyspark.sql import SparkSession  # noqa: F401  (bench drives Spark directly)
    from torch_geometric.nn import GraphSAGE

    from sparkgnn.engine.session import local_session
    from sparkgnn.graph import read_graph_dir
    from sparkgnn.models import Model

    torch.set_num_threads(2)
    cap_bytes = int(args.cap_gb * 2**30)
    work_dir = os.path.join(DATA, "work")
    started = time.perf_counter()
    spark = local_session("sparkgnn-bench-batch", cores=2)
    session_start = time.perf_counter() - started

    torch.manual_seed(0)
    module = GraphSAGE(args.dim, 128, 2).eval()
    model = Model.from_pyg(module, output="embedding")
    if args.section == "pruned-ids":
        merge_pruning(spark, args.dim, model, {}, log=lambda line: print(line, flush=True))
        spark.stop()
        return 0
    if args.section == "pushdown-cold":  # cold jobs next to the warm section already in batch.json
        spark.stop()
        path = os.path.join(RESULTS, "batch.json")
        result = json.load(open(path))
        result["pushdown"]["cold"] = pushdown_cold(result["pushdown"], model, args.dim, log=print)
        write_result("batch", result)
        print(json.dumps(result["pushdown"]["cold"], indent=1))
        return 0
    if args.section == "pushdown":
        section = pushdown_section(spark, model, args.dim, work_dir, log=lambda line: print(line, flush=True))
        spark.stop()
        path = os.path.join(RESULTS, "batch.json")
        result = json.load(open(path)) if os.path.exists(path) else {}
        result["pushdown"] = {**section, "machine": machine(), "session_start_seconds": session_start}
        write_result("batch", result)
        plot_pushdown(section, os.path.join(RESULTS, "batch_pushdown.png"))
        print(json.dumps({k: v for k, v in section.items() if k.endswith("M")}, default=str)[:2000])
        return 0
    graph_dir = synthetic_dir(args.nodes, args.edges, args.dim)
    data = read_graph_dir(graph_dir)
    pyg, reference = pyg_both_ways(module, data)
    pyg_seconds = pyg["per_layer"][pyg["faster"]]  # ratios are quoted against PyG's faster path
    print(f"PyG: {pyg['layers']} s per layer (faster: {pyg['faster']})", flush=True)

    _, warm = run_strategy(spark, graph_dir, model, "auto", work_dir)  # warm-up: JVM, Python workers, prepare
    print(f"warm-up (auto -> {warm['chosen']}): {warm['seconds_per_layer']:.2f} s/layer", flush=True)
    runs = []
    for strategy in STRATEGIES:
        result, run = best_of(REPEATS, lambda: run_strategy(spark, graph_dir, model, strategy, work_dir))
        actual = spark_output(result, data.num_nodes, data.index_of)
        run["max_rel_error_vs_pyg"] = float(np.abs(actual - reference).max() / np.abs(reference).max())
        runs.append(run)
        print(
            f"{strategy}: {run['seconds_per_layer']:.2f} s/layer, "
            f"shuffled {run['shuffle_write_bytes_per_layer'] / 2**20:.0f} MiB/layer, "
            f"err {run['max_rel_error_vs_pyg']:.1e}",
            flush=True,
        )
    _, auto = best_of(REPEATS, lambda: run_strategy(spark, graph_dir, model, "auto", work_dir))
    best = min(runs, key=lambda r: r["seconds_per_layer"])
    via, messenger_run = best_of(
        REPEATS, lambda: run_strategy(spark, graph_dir, model, best["strategy"], work_dir, workers="local[2]")
    )
    messenger_run["max_rel_error_vs_pyg"] = float(
        np.abs(spark_output(via, data.num_nodes, data.index_of) - reference).max() / np.abs(reference).max()
    )
    print(f"{best['strategy']} via messenger local[2]: {messenger_run['seconds_per_layer']:.2f} s/layer", flush=True)
    result = {
        "machine": machine(),
        "graph": {
            "nodes": args.nodes,
            "edges": args.edges,
            "dim": args.dim,
            "label": f"synthetic {args.nodes // 1000}K nodes / {args.edges / 1e6:g}M edges / {args.dim}-d",
        },
        "model": "2-layer GraphSAGE (mean), hidden 128",
        "session_start_seconds": session_start,
        "pyg_seconds_per_layer": pyg_seconds,
        "pyg_faster_path": pyg["faster"],
        "pyg_layers_seconds": pyg["layers"][pyg["faster"]],
        "pyg_by_path": pyg,
        "strategies": runs,
        "auto": {
            "chosen": auto["chosen"],
            "seconds_per_layer": auto["seconds_per_layer"],
            "matches_fastest": all(s == best["strategy"] for s in auto["chosen"]),
        },
        "best_strategy": best["strategy"],
        "messenger": {
            **messenger_run,
            "messenger_vs_inprocess": messenger_run["seconds_per_layer"] / best["seconds_per_layer"],
        },
        "ratio_best_vs_pyg": best["seconds_per_layer"] / pyg_seconds,
        "ratio_best_vs_pyg_edge_index": best["seconds_per_layer"] / pyg["per_layer"]["edge_index"],
        "ratio_best_vs_pyg_csr": best["seconds_per_layer"] / pyg["per_layer"]["csr"],
        "scaling": [],
    }
    write_result("batch", result)

    module_path = os.path.join(DATA, "pyg_sage_128.pt")
    save_pyg_model(module, module_path, {"in": args.dim, "hidden": 128, "layers": 2})
    for edges in [int(e) for e in args.scaling.split(",") if e]:
        nodes = edges // 10
        path = synthetic_dir(nodes, edges, args.dim)
        _, run_auto = run_strategy(spark, path, model, "auto", work_dir)
        probes = {adj: pyg_probe(path, module_path, adj=adj) for adj in ("edge_index", "csr")}
        per_layer = [p["seconds"] / 2 for p in probes.values() if p.get("ok")]
        point = {
            "edges": edges,
            "nodes": nodes,
            "sparkgnn_seconds_per_layer": run_auto["seconds_per_layer"],
            "sparkgnn_chosen": run_auto["chosen"],
            "pyg_seconds_per_layer": min(per_layer) if per_layer else None,  # the faster path
            "pyg_probe": probes["edge_index"],
            "pyg_csr_probe": probes["csr"],
        }
        result["scaling"].append(point)
        print(
            f"scaling {edges}: sparkgnn {point['sparkgnn_seconds_per_layer']:.2f} s/layer, "
            f"PyG {point['pyg_seconds_per_layer']}",
            flush=True,
        )
        write_result("batch", result)

    result["pushdown"] = pushdown_section(spark, model, args.dim, work_dir, log=lambda line: print(line, flush=True))
    result["pushdown"]["cold"] = pushdown_cold(result["pushdown"], model, args.dim, log=print)
    plot_pushdown(result["pushdown"], os.path.join(RESULTS, "batch_pushdown.png"))
    write_result("batch", result)

    merge_pruning(spark, args.dim, model, result, log=lambda line: print(line, flush=True))

    cap_path = synthetic_dir(args.cap_edges // 10, args.cap_edges, args.dim)
    capped = pyg_probe(cap_path, module_path, cap_bytes)
    capped_csr = pyg_probe(cap_path, module_path, cap_bytes, adj="csr")
    spark.stop()  # the capped run gets a session whose Python workers Spark caps (RLIMIT_AS)
    spark = local_session(
        "sparkgnn-bench-batch-capped",
        cores=2,
        extra_conf={"spark.executor.pyspark.memory": f"{int(args.cap_gb * 1024)}m"},
    )
    _, capped_spark = run_strategy(spark, cap_path, model, "auto", work_dir)
    result["memory_cap"] = {
        "cap_bytes": cap_bytes,
        "edges": args.cap_edges,
        "nodes": args.cap_edges // 10,
        "pyg": capped,
        "pyg_csr": capped_csr,
        "sparkgnn_completed": True,
        "sparkgnn_seconds_per_layer": capped_spark["seconds_per_layer"],
        "sparkgnn_partitions": capped_spark["partitions"],
        "how": (
            "PyG in a child process with RLIMIT_AS = cap; "
            "sparkgnn's Python workers with spark.executor.pyspark.memory = cap"
        ),
    }
    path = write_result("batch", result)
    _note_in_messenger_report(result["messenger"])
    plot(result, os.path.join(RESULTS, "batch.png"))
    print(json.dumps({k: result[k] for k in ("ratio_best_vs_pyg", "best_strategy", "pyg_seconds_per_layer")}, indent=1))
    print(f"wrote {path} and {os.path.join(RESULTS, 'batch.png')}")
    spark.stop()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    run_generic_section(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
