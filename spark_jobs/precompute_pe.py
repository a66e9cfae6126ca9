"""Offline PE precomputation: per-layer embeddings h^(1..k), their aggregation states and workload
metrics of a trained model over a graph, into a PE store.

    spark-submit spark_jobs/precompute_pe.py --graph DIR --model PATH --store DIR [options]
    python spark_jobs/precompute_pe.py ...              (creates a local session)

Layers commit atomically; a rerun resumes after the last committed layer (--force recomputes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from sparkgnn.cliargs import int_list, positive_int, require_inputs, run_cli
from sparkgnn.engine.phases import PhaseClock, activate, phase, process_start_time
from sparkgnn.logs import install_cli_handler
from sparkgnn.planner import STRATEGIES


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="precompute_pe.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", required=True, help="graph directory (vertices/, edges/, graph.json)")
    parser.add_argument("--model", required=True, help="model saved with sparkgnn Model.save")
    parser.add_argument("--store", required=True, help="PE store root directory")
    parser.add_argument("--no-states", action="store_true", help="store embeddings only, no aggregation states")
    parser.add_argument("--no-metrics", action="store_true", help="skip workload metrics (degrees, PSGS, FAP)")
    parser.add_argument(
        "--fanouts", type=int_list(1), default=[25, 10], help="fanouts for PSGS, comma separated (default 25,10)"
    )
    parser.add_argument("--workers", default="inprocess", help="inprocess (default) | local[N] | tcp://host:port")
    parser.add_argument("--strategy", default="auto", choices=["auto", *STRATEGIES])
    parser.add_argument("--partitions", type=positive_int, default=None)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--force", action="store_true", help="recompute every layer even if committed")
    parser.add_argument(
        "--report",
        default=None,
        help="write a JSON report of where the job's time went (the phase table, each step, the metrics)",
    )
    args = parser.parse_args(argv)
    require_inputs(parser, {"--graph": args.graph, "--model": args.model})
    return args


def main(argv=None, *, started_at: float | None = None) -> int:
    """Run the job; `started_at` (epoch seconds, the process's start when run as a script) is
    where its time table begins, so the interpreter's start and the imports are in it."""
    clock = PhaseClock(started_at=started_at)
    clock.claim("python start and imports")
    with clock.phase("argument checks"):
        args = parse_args(argv)
    install_cli_handler()  # the job's progress lines (sparkgnn loggers) on stdout
    with activate(clock):
        return run_cli("precompute_pe", lambda: _run(args, clock))


def _run(args, clock: PhaseClock) -> int:
    with phase("imports (pyspark, torch, sparkgnn)"):
        from sparkgnn.engine.precompute import precompute
        from sparkgnn.engine.session import active_session, job_session

    started = time.perf_counter()
    owned = active_session() is None  # a session this job starts, it also stops
    with phase("JVM and session start"):
        spark = job_session("sparkgnn-precompute-pe")
    result = precompute(
        spark,
        args.graph,
        args.model,
        store=args.store,
        states=not args.no_states,
        metrics=not args.no_metrics,
        workers=args.workers,
        force=args.force,
        strategy=args.strategy,
        partitions=args.partitions,
        work_dir=args.work_dir,
        fanouts=args.fanouts,
    )
    if owned:
        with phase("shutdown (stop the session)"):
            spark.stop()
    total_s = time.perf_counter() - started
    print(
        f"precompute_pe: store complete ({len(result.store.layers)} layers, verified) at {args.store} "
        f"in {total_s:.1f} s"
    )
    if args.report:
        _write_report(args.report, result, total_s, clock.summary())
    clock.log_table("precompute_pe")
    return 0


def _write_report(path: str, result, total_s: float, timing: dict) -> None:
    """The job's cost as a user paid it (cold JVM included), written atomically: the engine's
    steps (none when every layer was already committed) and the whole process's phase table."""
    doc = {"total_s": round(total_s, 3), "layers": list(result.store.layers)}
    if result.report is not None:
        doc.update(partitions=result.plan.partitions, **result.report.to_json())
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump({**doc, **timing}, fh, indent=2)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(started_at=process_start_time()))
