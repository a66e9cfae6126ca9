"""Streaming refresh benchmark (make bench-follow): the follower's sustained edge updates/s and
batch latency p50 / p99 at 10 / 100 / 1,000 edge inserts per batch on the 2M-edge graph
(bench_follow_quick.run: 200K nodes, 32-d, 2-layer SAGE-mean with states), and the freshness
p50 / p99 of a service following the store at 100-edge batches on a 200K-edge graph
(bench_follow_fresh.run), against the issue's targets (>= 20,000 updates/s at 2M edges,
freshness p99 <= 200 ms). Writes bench/results/follow.json + follow.png; records the load
average at the start (other processes on a shared box move the wall-clock figures: the
updates per CPU second are the steadier ones). `--quick`: 10x smaller graphs and fewer batches.

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
import bench_follow_quick  # noqa: E402

log = logging.getLogger("bench_follow")

TARGET_UPDATES_PER_S = 20_000  # at 2M edges
TARGET_FRESHNESS_P99_MS = 200.0  # at 100-edge batches


def run(*, quick: bool, out: str) -> dict:
    """Both halves, written as JSON to `out` and a PNG beside it; returns the result."""
    scale = 10 if quick else 1
    nodes, edges = 200_000 // scale, 2_000_000 // scale
    result: dict = {"loadavg": list(os.getloadavg()), "started": time.time(), "quick": quick}
    started = time.perf_counter()
    throughput = bench_follow_quick.run(nodes, edges, 32, 10 if quick else 20, (10, 100, 1000), False, 1.0)
    result["throughput"] = {
        "graph": f"synthetic {nodes // 1000}K / {edges / 1e6:g}M / 32-d, 2-layer SAGE-mean",
        "by_batch_edges": {str(k): v for k, v in throughput.items()},
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

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    by = result["throughput"]["by_batch_edges"]
    sizes = list(by)
    left.bar([f"{s}/batch" for s in sizes], [by[s]["updates_per_s"] for s in sizes], label="wall")
    left.plot([f"{s}/batch" for s in sizes], [by[s]["updates_per_cpu_s"] for s in sizes], "ko", label="per CPU second")
    left.axhline(TARGET_UPDATES_PER_S, color="r", linestyle="--", label="target")
    left.set_yscale("log")
    left.set_ylabel("edge updates / s")
    left.set_title(result["throughput"]["graph"], fontsize=9)
    left.legend(fontsize=8)
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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("sparkgnn").setLevel(logging.WARNING)
    run(quick=args.quick, out=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
