"""Streaming refresh benchmark (make bench-follow): the follower's sustained edge updates/s and
batch latency p50 / p99 with update files of 10 / 100 / 1,000 edge inserts OFFERED open-loop
(bench_follow_open.run: a producer process delivers files at a fixed rate, the follower coalesces
what arrived) on the 2M- and 8M-edge graphs (200K / 800K nodes, 32-d) with a 2-layer SAGE-mean
and a 2-layer GCN (stores with states), next to a precompute and a cold and warm `refresh_local`
of a 1,000-edge update in the same run, and the freshness p50 / p99 of a service following the
store at 100-edge batches on a 200K-edge graph (bench_follow_fresh.run), against the issue's
targets (>= 20,000 updates/s at 2M edges, >= 10,000 at 8M, freshness p99 <= 200 ms). Writes
bench/results/follow.json + follow.png; records the load average at the start (other processes
on a shared box move the wall-clock figures). `--quick`: 10x smaller graphs and fewer updates;
`--sizes 2000000`: the 2M graph alone.

    .venv/bin/python bench/bench_follow.py [--quick] [--out bench/results/follow.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_follow_fresh  # noqa: E402
import bench_follow_open  # noqa: E402

log = logging.getLogger("bench_follow")

TARGET_UPDATES_PER_S = {"2M": 20_000, "8M": 10_000}  # by graph
OFFERED = {2_000_000: 40_000, 8_000_000: 20_000}  # updates/s offered, twice the target
UPDATES = {2_000_000: 50_000, 8_000_000: 30_000}  # per offered point
TARGET_FRESHNESS_P99_MS = 200.0  # at 100-edge batches


def run(*, quick: bool, out: str, sizes: tuple[int, ...] = (2_000_000, 8_000_000)) -> dict:
    """Both halves, written as JSON to `out` and a PNG beside it; returns the result."""
    scale = 10 if quick else 1
    result: dict = {"loadavg": list(os.getloadavg()), "started": time.time(), "quick": quick}
    started = time.perf_counter()
    throughput = bench_follow_open.run(
        sizes=tuple(edges // scale for edges in sizes),
        offered=tuple(float(OFFERED.get(edges, 20_000)) for edges in sizes),
        updates=tuple(UPDATES.get(edges, 30_000) // scale for edges in sizes),
    )
    result["throughput"] = {
        "graphs_are": "synthetic, nodes = edges / 10, 32-d; 2-layer SAGE-mean and GCN (hidden 64, 16 outputs)",
        **throughput,
        "target_updates_per_s": TARGET_UPDATES_PER_S,
    }
    fresh_args = argparse.Namespace(
        nodes=20_000 // scale,
        edges=200_000 // scale,
        dim=32,
        batch=100,
        period=0.25,
        updates=20 if quick else 40,
        commit_every_s=0.05,  # the freshness target's settings: a version per 50 ms, checked every 20 ms
        interval_s=0.02,
    )
    result["freshness"] = {**bench_follow_fresh.run(fresh_args), "target_p99_ms": TARGET_FRESHNESS_P99_MS}
    result["seconds"] = round(time.perf_counter() - started, 1)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(result, fh, indent=2)
    plot(result, os.path.splitext(out)[0] + ".png")
    log.info(f"bench-follow: {out} written ({result['seconds']} s)")
    return result


def plot(result: dict, path: str) -> None:
    """Updates/s per batch size against the target, and freshness p50 / p99 against the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    graphs = result["throughput"]["graphs"]
    series = [(g, m) for g in graphs for m in graphs[g]["models"]]
    width = 0.8 / max(len(series), 1)
    for i, (g, m) in enumerate(series):
        entry = graphs[g]["models"][m]
        by = entry["by_file_edges"]
        xs = [j + i * width for j in range(len(by))]
        bars = left.bar(xs, [p["updates_per_s"] for p in by.values()], width, label=f"{g} {m}: follow")
        colour = bars.patches[0].get_facecolor()
        left.hlines(entry["refresh_local_warm_updates_per_s"], xs[0] - width / 2, xs[-1] + width / 2, colors=[colour])
        left.plot([xs[-1]], [entry["refresh_local_warm_updates_per_s"]], "v", color=colour)
    for g, target in TARGET_UPDATES_PER_S.items():
        if g in graphs:
            left.axhline(target, color="r", linestyle="--", linewidth=1)
            left.text(-0.4, target * 1.05, f"target {g}", color="r", fontsize=7)
    sizes = list(next(iter(graphs.values()))["models"].values())[0]["by_file_edges"] if graphs else {}
    left.set_xticks([j + 0.4 - width / 2 for j in range(len(sizes))], [f"{s} edges/file" for s in sizes])
    left.set_yscale("log")
    left.set_ylabel("sustained edge updates / s (offered open-loop)")
    left.set_title("follower vs refresh_local warm (line, v) of a 1,000-edge update", fontsize=9)
    left.legend(fontsize=7, ncol=2)
    fresh = result["freshness"]
    values = [fresh.get("freshness_p50_ms") or 0.0, fresh.get("freshness_p99_ms") or 0.0]
    right.bar(["p50", "p99"], values)
    right.axhline(TARGET_FRESHNESS_P99_MS, color="r", linestyle="--", label="p99 target")
    right.set_ylabel("update arrival -> answer reflecting it (ms)")
    right.set_title(f"freshness, {fresh['edges']} edges, {fresh['batch_edges']}-edge batches", fontsize=9)
    right.legend(fontsize=8)
    fig.suptitle(f"bench-follow (load average at start {result['loadavg'][0]:.1f})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10x smaller graphs, fewer batches")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "follow.json"))
    parser.add_argument("--sizes", type=int, nargs="+", default=[2_000_000, 8_000_000], help="graph edges")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("sparkgnn").setLevel(logging.WARNING)
    run(quick=args.quick, out=args.out, sizes=tuple(args.sizes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
