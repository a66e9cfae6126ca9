"""Incremental PE refresh benchmark (make bench-refresh): on the bench graph (synthetic 200K nodes /
2M edges / 128-d, 2-layer SAGE-mean, hidden 128, states kept) and a 4x smaller one, updates that
change 0.01%, 0.1%, 1% and 10% of the edges (half inserts of random edges, half deletes of existing
ones, plus feature updates of fraction/10 of the vertices) are applied to the store with
`refresh_local`, and compared in the same run with

  - a from-scratch `precompute_local` of the updated graph (the same engine: the strict baseline,
    and the exactness reference: the refreshed store must equal it), and
  - once per size, the Spark precompute (engine.precompute, warm session: what a user reruns
    today when the graph changes).

Refresh is measured cold (the old version opened and read from disk: what a one-shot job pays)
and warm (its layers already in memory: a serving process refreshing in place), each with its
phases (open, apply, fingerprint, per-layer read / compute / write, finish, verify), the vertices
recomputed per layer, and updates per second. Writes bench/results/refresh.json and refresh.png.
Also one update of FIXED_EDGES changed edges on both sizes: how the cost of an equal change grows
with the graph (it should not, beyond the O(N) read of a cold refresh and the O(E) edge arrays).
At 0.1% and 1% the Spark refresh job (sparkgnn.refresh, 4 pieces, warm session) runs too,
against the Spark precompute (`--spark-only`: only those, on the main graph, merged into the
existing JSON). Local refreshes run REPEATS times per point: medians reported.
Key: speedup_1pct = from-scratch precompute seconds / cold refresh seconds at 1% on the 2M graph.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import DATA, RESULTS, graph_arguments, logged_lines, machine, synthetic_dir, write_result  # noqa: E402

FRACTIONS = (0.0001, 0.001, 0.01, 0.1)
SPARK_FRACTIONS = (0.001, 0.01)  # also refreshed by the Spark job (sparkgnn.refresh) in the same run
SPARK_PARTITIONS = 4
REPEATS = 3  # local refreshes per point: the median is reported (the 2M points moved by 1.6x between runs)
FIXED_EDGES = 200  # one update of this many changed edges on every size: cost vs graph size at equal change


def make_update(graph, fraction: float, seed: int):
    """fraction x E edges changed (half random inserts, half deletes of existing edges) and
    feature updates of fraction/10 x N vertices."""
    from sparkgnn.graph.updates import GraphUpdate

    rng = np.random.default_rng(seed)
    half = max(1, int(graph.num_edges * fraction / 2))
    gone = rng.choice(graph.num_edges, half, replace=False)
    features = rng.choice(graph.ids, max(1, int(graph.num_nodes * fraction / 10)), replace=False)
    return GraphUpdate(
        edge_insert_src=rng.choice(graph.ids, half),
        edge_insert_dst=rng.choice(graph.ids, half),
        edge_delete_src=graph.ids[graph.edge_src[gone]],
        edge_delete_dst=graph.ids[graph.edge_dst[gone]],
        feature_update_ids=features,
        feature_update_x=rng.standard_normal((len(features), graph.feature_dim)).astype(np.float32),
    )


def max_relative_error(got, want, ids, layers: int) -> float:
    worst = 0.0
    for l in range(1, layers + 1):
        for a, b in zip(got.lookup(ids, l, states=True), want.lookup(ids, l, states=True), strict=True):
            worst = max(worst, float(np.abs(a - b).max()) / max(1.0, float(np.abs(b).max())))
    return worst


def spark_precompute_seconds(spark, graph_dir: str, model, store: str, work: str) -> float:
    """One Spark precompute (with states) of the graph in a warm local session."""
    from sparkgnn.engine.precompute import precompute

    try:
        shutil.rmtree(store, ignore_errors=True)
        options = {"states": True, "metrics": False, "work_dir": work, "validate": False}
        precompute(spark, graph_dir, model, store=store, **options)  # warm-up: JIT, first-touch, caches
        shutil.rmtree(store, ignore_errors=True)
        started = time.perf_counter()
        precompute(spark, graph_dir, model, store=store, **options)
        return time.perf_counter() - started
    finally:
        shutil.rmtree(store, ignore_errors=True)


def spark_refresh_entry(spark, graph_dir: str, update, model, root: str, work: str, scratch, ids) -> dict:
    """The Spark refresh (sparkgnn.refresh, SPARK_PARTITIONS pieces) of `update` on the store at
    `root`, in the warm session; exactness against the scratch store of the updated graph."""
    from sparkgnn.engine.refresh import refresh
    from sparkgnn.engine.refresh.pieces import pieces_dir

    update_file = update.write(os.path.join(work, f"update-{time.time_ns()}.parquet"))
    runs, phases, jobs = [], [], []
    tracker = spark.sparkContext.statusTracker()
    spark.sparkContext.setJobGroup("bench-refresh", "Spark refresh")  # to count the run's Spark jobs
    try:
        for _run in range(2):  # the first warms the session up (as the Spark precompute's does)
            before = set(tracker.getJobIdsForGroup("bench-refresh"))
            started = time.perf_counter()
            with logged_lines(since=time.time()) as lines:
                result = refresh(spark, graph_dir, model, store=root, updates=update_file,
                                 partitions=SPARK_PARTITIONS, work_dir=work)  # fmt: skip
            store, report = result.store, result.report
            runs.append(time.perf_counter() - started)
            jobs.append(len(set(tracker.getJobIdsForGroup("bench-refresh")) - before))
            phases.append(report.phases)
            # the pieces kept for the updated graph: the bench never refreshes that version again
            shutil.rmtree(pieces_dir(work, report.graph_fingerprint, SPARK_PARTITIONS), ignore_errors=True)
            if _run == 0:
                shutil.rmtree(os.path.join(root, report.graph_fingerprint))
    finally:
        os.remove(update_file)
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    seconds = runs[-1]
    error = max_relative_error(store, scratch, ids, model.num_rounds)
    shutil.rmtree(os.path.join(root, report.graph_fingerprint))
    return {
        "seconds": round(seconds, 3),
        "seconds_first_run_in_session": round(runs[0], 3),
        "phases_first_run": phases[0],  # build_pieces > 0: this graph's pieces were built by Spark
        "spark_jobs": jobs[-1],
        "spark_jobs_first_run": jobs[0],
        "partitions": SPARK_PARTITIONS,
        "log": lines,
        "phases": report.phases,
        "layers": report.layers,
        "max_relative_error": error,
    }


def _median_run(runs: list[dict]) -> dict:
    return sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]


def _fresh_work(nodes: int, edges: int, dim: int):
    """(graph dir, GraphData, work dir, store root, scratch root) of the seeded bench graph, with
    the store and the Spark refresh's pieces cache removed (the first Spark refresh builds them)."""
    from sparkgnn.graph.reader import read_graph_dir

    graph_dir = synthetic_dir(nodes, edges, dim)
    work = os.path.join(DATA, "refresh")
    root, scratch_root = os.path.join(work, "store"), os.path.join(work, "scratch")
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(os.path.join(work, "refresh-pieces"), ignore_errors=True)
    return graph_dir, read_graph_dir(graph_dir), work, root, scratch_root


def bench_size(nodes: int, edges: int, dim: int, model, spark, log=print) -> dict:
    from sparkgnn.graph.updates import apply
    from sparkgnn.pe.local import precompute_local
    from sparkgnn.pe.refresh import refresh_local
    from sparkgnn.pe.store import PEStore

    graph_dir, graph, work, root, scratch_root = _fresh_work(nodes, edges, dim)
    started = time.perf_counter()
    precompute_local(graph, model, root)
    base_seconds = time.perf_counter() - started
    out: dict = {
        "graph": f"synthetic {nodes // 1000}K / {edges / 1e6:g}M / {dim}-d",
        "nodes": nodes,
        "edges": edges,
        "base_precompute_seconds": round(base_seconds, 3),
        "fractions": {},
    }
    updates = [(str(f), f) for f in FRACTIONS] + [("fixed", FIXED_EDGES / edges)]
    for i, (label, fraction) in enumerate(updates):
        update = make_update(graph, fraction, seed=i)
        rows = sum(update.counts().values())
        repeats: dict = {"warm": [], "cold": []}
        for repeat in range(REPEATS):
            for how in ("warm", "cold"):  # the last cold run's version stays for the exactness check
                old = None
                if how == "warm":
                    old = PEStore.open(root, model=model, graph=graph)
                    for l in old.layers:
                        old.table(l)  # loaded before the clock starts, as in a serving process
                started = time.perf_counter()
                refreshed, report = refresh_local(graph, update, model, root, store=old)
                repeats[how].append({"seconds": time.perf_counter() - started, "report": report.to_json()})
                if how == "warm" or repeat < REPEATS - 1:
                    shutil.rmtree(os.path.join(root, report.graph_fingerprint))  # the bench's own version
        runs = {how: _median_run(r) for how, r in repeats.items()}
        new_graph = apply(update, graph).graph
        full_runs = []
        for _repeat in range(REPEATS):  # the baseline is as noisy as the refresh: its median too
            shutil.rmtree(scratch_root, ignore_errors=True)
            started = time.perf_counter()
            scratch = precompute_local(new_graph, model, scratch_root)
            full_runs.append(time.perf_counter() - started)
        full = float(np.median(full_runs))
        error = max_relative_error(refreshed, scratch, new_graph.ids, model.num_rounds)
        shutil.rmtree(os.path.join(root, runs["cold"]["report"]["graph_fingerprint"]))
        cold, warm = runs["cold"], runs["warm"]
        layers = cold["report"]["layers"]
        entry = {
            "edges_changed": int(update.counts()["edge_insert"] + update.counts()["edge_delete"]),
            "update_rows": rows,
            "updates": update.counts(),
            "full_precompute_seconds": round(full, 3),
            "refresh_seconds_cold": round(cold["seconds"], 3),
            "refresh_seconds_warm": round(warm["seconds"], 3),
            "speedup_cold": round(full / cold["seconds"], 3),
            "speedup_warm": round(full / warm["seconds"], 3),
            "updates_per_second_cold": round(rows / cold["seconds"], 1),
            "updates_per_second_warm": round(rows / warm["seconds"], 1),
            "affected_per_layer": [s["targets"] for s in layers],
            "affected_fraction_per_layer": [round(s["targets"] / new_graph.num_nodes, 4) for s in layers],
            "phases_cold": cold["report"]["phases"],
            "phases_warm": warm["report"]["phases"],
            "layers_cold": layers,
            "layers_warm": warm["report"]["layers"],
            "max_relative_error": error,
        }
        entry["full_precompute_seconds_runs"] = [round(t, 3) for t in full_runs]
        entry["refresh_seconds_cold_runs"] = [round(r["seconds"], 3) for r in repeats["cold"]]
        entry["refresh_seconds_warm_runs"] = [round(r["seconds"], 3) for r in repeats["warm"]]
        if spark is not None and fraction in SPARK_FRACTIONS:
            entry["spark_refresh"] = spark_refresh_entry(
                spark, graph_dir, update, model, root, work, scratch, new_graph.ids
            )
            log(f"  Spark refresh ({SPARK_PARTITIONS} pieces): {entry['spark_refresh']['seconds']} s")
        if label == "fixed":
            out["fixed_update"] = entry
        else:
            out["fractions"][label] = entry
        log(
            f"  {out['graph']}: {fraction:.2%} of edges changed -> affected {entry['affected_per_layer']}, refresh "
            f"cold {entry['refresh_seconds_cold']} s / warm {entry['refresh_seconds_warm']} s vs full {full:.2f} s "
            f"(x{entry['speedup_cold']:.2f} / x{entry['speedup_warm']:.2f})"
        )
    shutil.rmtree(scratch_root, ignore_errors=True)
    if spark is not None:
        spark_s = spark_precompute_seconds(spark, graph_dir, model, os.path.join(work, "spark_store"), work)
        out["spark_precompute_seconds_warm"] = round(spark_s, 3)
        for entry in out["fractions"].values():
            entry["speedup_cold_vs_spark_precompute"] = round(spark_s / entry["refresh_seconds_cold"], 3)
            if "spark_refresh" in entry:
                entry["spark_refresh"]["speedup_vs_spark_precompute"] = round(
                    spark_s / entry["spark_refresh"]["seconds"], 3
                )
    shutil.rmtree(root, ignore_errors=True)
    return out


def spark_only(nodes: int, edges: int, dim: int, model, spark, log=print) -> dict:
    """--spark-only: the Spark part of bench_size alone, on one graph: the Spark refresh of the
    same updates (same seeds) at SPARK_FRACTIONS and the warm Spark precompute, in one session.
    Returns {fraction label: spark_refresh entry (with the precompute it is compared with)}."""
    from sparkgnn.graph.updates import apply
    from sparkgnn.pe.local import precompute_local

    graph_dir, graph, work, root, scratch_root = _fresh_work(nodes, edges, dim)
    precompute_local(graph, model, root)
    out = {}
    try:
        for i, fraction in enumerate(FRACTIONS):
            if fraction not in SPARK_FRACTIONS:
                continue
            update = make_update(graph, fraction, seed=i)  # bench_size's update at this fraction
            new_graph = apply(update, graph).graph
            shutil.rmtree(scratch_root, ignore_errors=True)
            scratch = precompute_local(new_graph, model, scratch_root)
            out[str(fraction)] = spark_refresh_entry(
                spark, graph_dir, update, model, root, work, scratch, new_graph.ids
            )
            log(f"  Spark refresh at {fraction:.2%} ({SPARK_PARTITIONS} pieces): {out[str(fraction)]['seconds']} s")
        spark_s = spark_precompute_seconds(spark, graph_dir, model, os.path.join(work, "spark_store"), work)
    finally:
        shutil.rmtree(scratch_root, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    for entry in out.values():
        entry["spark_precompute_seconds_warm"] = round(spark_s, 3)
        entry["speedup_vs_spark_precompute"] = round(spark_s / entry["seconds"], 3)
    log(f"  warm Spark precompute: {spark_s:.2f} s")
    return out


def merge_spark_only(result: dict, entries: dict, loadavg: list) -> None:
    """Replace the main graph's Spark refresh entries and the top-level spark_* keys of an
    existing refresh.json `result` with `entries` (spark_only's), keeping every other key."""
    fractions = result["sizes"][0]["fractions"]
    for label, entry in entries.items():
        fractions[label]["spark_refresh"] = entry
    one = entries[str(0.01)]
    result["spark_refresh_seconds_1pct"] = one["seconds"]
    result["spark_refresh_speedup_1pct_vs_spark_precompute"] = one["speedup_vs_spark_precompute"]
    spark_entries = [
        e["spark_refresh"] for size in result["sizes"] for e in size["fractions"].values() if "spark_refresh" in e
    ]
    result["spark_refresh_max_relative_error"] = max(e["max_relative_error"] for e in spark_entries)
    result["spark_loadavg"] = [round(x, 2) for x in loadavg]


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for size, style in zip(result["sizes"], ("-", "--"), strict=False):
        fr = size["fractions"]
        x = [100 * float(f) for f in fr]
        label = size["graph"]
        axes[0].plot(
            x,
            [e["refresh_seconds_cold"] for e in fr.values()],
            "o" + style,
            color="tab:orange",
            label=f"refresh, cold ({label})",
        )
        axes[0].plot(
            x,
            [e["refresh_seconds_warm"] for e in fr.values()],
            "s" + style,
            color="tab:green",
            label=f"refresh, layers in memory ({label})",
        )
        axes[0].plot(
            x,
            [e["full_precompute_seconds"] for e in fr.values()],
            "^" + style,
            color="tab:gray",
            label=f"precompute from scratch ({label})",
        )
        sparked = [(100 * float(f), e["spark_refresh"]) for f, e in fr.items() if "spark_refresh" in e]
        if sparked:
            axes[0].plot(
                [p for p, _e in sparked],
                [e["seconds"] for _p, e in sparked],
                "D" + style,
                color="tab:blue",
                label=f"Spark refresh job ({label})",
            )
            if "spark_precompute_seconds_warm" in size:
                axes[0].axhline(size["spark_precompute_seconds_warm"], color="tab:blue", linestyle=":", linewidth=1)
        for l in range(len(next(iter(fr.values()))["affected_fraction_per_layer"])):
            axes[1].plot(
                x,
                [100 * e["affected_fraction_per_layer"][l] for e in fr.values()],
                "o" + style,
                label=f"layer {l + 1} ({label})",
            )
    axes[0].set_xscale("log")
    axes[0].set_xlabel("% of edges changed")
    axes[0].set_ylabel("seconds")
    axes[0].legend(fontsize=6, loc="center left")
    axes[0].set_title("refresh vs precompute from scratch")
    axes[1].set_xscale("log")
    axes[1].set_xlabel("% of edges changed")
    axes[1].set_ylabel("% of vertices recomputed")
    axes[1].legend(fontsize=7)
    axes[1].set_title("affected vertices per layer")
    main = result["sizes"][0]
    names, bottoms = list(main["fractions"]), np.zeros(len(main["fractions"]))
    parts = ["open", "apply", "fingerprint", "read", "compute", "write", "finish", "verify"]
    for part in parts:
        values = np.array([phase_seconds(e, part) for e in main["fractions"].values()])
        axes[2].bar([f"{100 * float(n):g}%" for n in names], values, bottom=bottoms, label=part)
        bottoms += values
    axes[2].set_ylabel("seconds (cold refresh)")
    axes[2].set_title(f"cold refresh phases, {main['graph']}", fontsize=10)
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def phase_seconds(entry: dict, part: str) -> float:
    """Seconds of one phase of a cold refresh (per-layer read / compute / write summed)."""
    layers = entry["layers_cold"]
    per_layer = {"read": "read_seconds", "compute": "seconds", "write": "write_seconds"}
    if part in per_layer:
        return sum(s[per_layer[part]] for s in layers)
    return entry["phases_cold"].get(part, 0.0)


def main(argv=None) -> int:
    parser = graph_arguments(argparse.ArgumentParser(description=__doc__))
    parser.add_argument("--small-factor", type=int, default=4, help="the second graph is this many times smaller")
    parser.add_argument(
        "--no-spark", action="store_true", help="skip the Spark precompute baseline and the Spark refresh"
    )
    parser.add_argument(
        "--spark-only",
        action="store_true",
        help="run only the Spark refresh and its Spark precompute baseline on the main graph, merged "
        "into the existing refresh.json (its other keys kept)",
    )
    args = parser.parse_args(argv)
    if args.spark_only and args.no_spark:
        parser.error("--spark-only and --no-spark exclude each other")
    from torch_geometric.nn import GraphSAGE

    from sparkgnn.models import Model

    torch.manual_seed(0)
    model = Model.from_pyg(GraphSAGE(args.dim, 128, 2).eval(), output="embedding")
    sizes = [(args.nodes, args.edges), (args.nodes // args.small_factor, args.edges // args.small_factor)]
    result: dict = {
        "machine": machine(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],  # other work on the box while it ran
        "model": "2-layer GraphSAGE (mean), hidden 128, states kept",
        "update": "fraction x E edges changed: half random inserts, half deletes of existing edges; "
        "feature updates of fraction/10 x N vertices",
        "sizes": [],
    }
    spark = None
    if not args.no_spark:
        from sparkgnn.engine.session import local_session

        spark = local_session("sparkgnn-bench-refresh", cores=2)
    if args.spark_only:
        loadavg = os.getloadavg()
        with open(os.path.join(RESULTS, "refresh.json")) as fh:
            previous = json.load(fh)
        try:
            entries = spark_only(args.nodes, args.edges, args.dim, model, spark)
        finally:
            spark.stop()
        merge_spark_only(previous, entries, loadavg)
        path = write_result("refresh", previous)
        plot(previous, os.path.join(RESULTS, "refresh.png"))
        print(f"wrote {path}: spark_refresh_seconds_1pct {previous['spark_refresh_seconds_1pct']} "
              f"(x{previous['spark_refresh_speedup_1pct_vs_spark_precompute']} vs the Spark precompute)")  # fmt: skip
        return 0
    try:
        for nodes, edges in sizes:
            print(f"bench-refresh: {nodes} nodes / {edges} edges", flush=True)
            result["sizes"].append(bench_size(nodes, edges, args.dim, model, spark))
    finally:
        if spark is not None:
            spark.stop()
    main_size = result["sizes"][0]["fractions"]
    one = main_size[str(0.01)]
    result["speedup_1pct"] = one["speedup_cold"]
    result["speedup_1pct_warm"] = one["speedup_warm"]
    if "speedup_cold_vs_spark_precompute" in one:
        result["speedup_1pct_vs_spark_precompute"] = one["speedup_cold_vs_spark_precompute"]
    spark_one = one.get("spark_refresh")
    if spark_one:
        result["spark_refresh_speedup_1pct_vs_spark_precompute"] = spark_one["speedup_vs_spark_precompute"]
        result["spark_refresh_seconds_1pct"] = spark_one["seconds"]
    entries = [e for size in result["sizes"] for e in [*size["fractions"].values(), size["fixed_update"]]]
    result["max_relative_error"] = max(e["max_relative_error"] for e in entries)
    spark_entries = [e["spark_refresh"] for e in entries if "spark_refresh" in e]
    if spark_entries:
        result["spark_refresh_max_relative_error"] = max(e["max_relative_error"] for e in spark_entries)
    big, small = (size["fixed_update"] for size in result["sizes"])
    result[f"same_{FIXED_EDGES}_edge_update_cold_big_over_small"] = round(
        big["refresh_seconds_cold"] / small["refresh_seconds_cold"], 3
    )
    result[f"same_{FIXED_EDGES}_edge_update_warm_big_over_small"] = round(
        big["refresh_seconds_warm"] / small["refresh_seconds_warm"], 3
    )
    path = write_result("refresh", result)
    plot(result, os.path.join(RESULTS, "refresh.png"))
    print(f"wrote {path}: speedup_1pct {result['speedup_1pct']} (warm {result['speedup_1pct_warm']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
