"""Shared bench plumbing: result files, timing, the synthetic bench graphs (made once, seeded)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import statistics
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
DATA = os.path.join(ROOT, "data", "bench")


def machine() -> dict:
    import torch

    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }


@contextlib.contextmanager
def logged_lines(since: float | None = None):
    """The sparkgnn loggers' lines (INFO and up) logged inside the block, appended to the list it
    yields (a library call's progress lines for a result file); with `since` (a time.time()), each
    line starts with the seconds from then."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            at = "" if since is None else f"{record.created - since:7.2f} "
            lines.append(at + record.getMessage())

    logger, handler = logging.getLogger("sparkgnn"), Collect()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def median_seconds(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def synthetic_dir(num_nodes: int, num_edges: int, dim: int, seed: int = 0) -> str:
    from sparkgnn.datasets.synthetic import write_synthetic

    path = os.path.join(DATA, f"synthetic_{num_nodes}_{num_edges}_{dim}_s{seed}")
    if not os.path.exists(os.path.join(path, "graph.json")):
        write_synthetic(path, num_nodes, num_edges, dim, seed=seed, overwrite=True)
    return path


def write_result(name: str, result: dict) -> str:
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{name}.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=2, sort_keys=True)
    return path


def graph_arguments(parser):
    """The bench graph every batch/precompute benchmark shares (200K nodes / 2M edges / 128-d)."""
    parser.add_argument("--nodes", type=int, default=200_000)
    parser.add_argument("--edges", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=128)
    return parser
