"""Offline PE precomputation: per-layer embeddings h^(1..k), their aggregation states and workload
metrics of a trained model over a graph, into a PE store.

    spark-submit spark_jobs/precompute_pe.py --graph DIR --model PATH --store DIR [options]
    python spark_jobs/precompute_pe.py ...              (creates a local session)

Layers commit atomically; a rerun resumes after the last committed layer (--force recomputes).
"""

from __future__ import annotations

import argparse
import sys
import time

from sparkgnn.cliargs import int_list, positive_int, require_inputs, run_cli
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
    args = parser.parse_args(argv)
    require_inputs(parser, {"--graph": args.graph, "--model": args.model})
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    install_cli_handler()  # the job's progress lines (sparkgnn loggers) on stdout
    return run_cli("precompute_pe", lambda: _run(args))


def _run(args) -> int:
    from sparkgnn.engine.precompute import precompute
    from sparkgnn.engine.session import job_session

    started = time.perf_counter()
    spark = job_session("sparkgnn-precompute-pe")
    store = precompute(
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
    ).store
    print(
        f"precompute_pe: store complete ({len(store.layers)} layers, verified) at {args.store} "
        f"in {time.perf_counter() - started:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
