"""Incremental PE refresh: apply a graph update to a PE store, recomputing only the vertices it
reaches, and commit the result as the updated graph's store version (rows that changed only).

    spark-submit spark_jobs/refresh_pe.py --store DIR --graph DIR --model PATH --updates DIR
                                          [--out-graph DIR] [--partitions N] [--work-dir DIR]
    python spark_jobs/refresh_pe.py ...                 (creates a local session)
    python spark_jobs/refresh_pe.py --engine local ...  (one machine, no Spark: pe.refresh)

--model is required (the issue's command line has none): a store keeps the model's fingerprint,
not its weights, and a refresh computes with them. A killed refresh leaves the old version
readable; a rerun with the same arguments commits the layers still missing. User errors (a bad
update, a stale store, a store without states): one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from sparkgnn.cliargs import positive_int, require_inputs, run_cli


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="refresh_pe.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True, help="PE store root directory (the old version is read from it)")
    parser.add_argument("--graph", required=True, help="the graph directory the store was computed for")
    parser.add_argument("--model", required=True, help="the model the store was computed with (Model.save)")
    parser.add_argument("--updates", required=True, help="graph update: a Parquet file or folder (graph.updates)")
    parser.add_argument("--out-graph", default=None, help="write the updated graph here (serving needs it)")
    parser.add_argument("--engine", default="spark", choices=sorted(ENGINES), help="spark (default) or local")
    parser.add_argument("--partitions", type=positive_int, default=None, help="pieces of the graph (spark)")
    parser.add_argument("--work-dir", default=None, help="scratch space every executor reaches (spark)")
    parser.add_argument("--report", default=None, help="also write the refresh report (JSON) here")
    args = parser.parse_args(argv)
    require_inputs(parser, {"--store": args.store, "--graph": args.graph, "--model": args.model,
                            "--updates": args.updates})  # fmt: skip
    return args


def _spark(args):
    from sparkgnn.engine.refresh import refresh
    from sparkgnn.engine.session import job_session

    spark = job_session("sparkgnn-refresh-pe")
    return refresh(spark, args.graph, args.model, args.store, args.updates, out_graph=args.out_graph,
                   partitions=args.partitions, work_dir=args.work_dir)  # fmt: skip


def _local(args):
    from sparkgnn.graph.reader import read_graph_dir
    from sparkgnn.graph.updates import GraphUpdate
    from sparkgnn.pe.refresh import refresh_local

    graph = read_graph_dir(args.graph)
    return refresh_local(graph, GraphUpdate.read(args.updates), args.model, args.store, out_graph=args.out_graph)


ENGINES = {"spark": _spark, "local": _local}


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_cli("refresh_pe", lambda: _run(args))


def _run(args) -> int:
    started = time.perf_counter()
    store, report = ENGINES[args.engine](args)
    if args.report:
        with open(args.report, "w") as fh:
            json.dump(report.to_json(), fh, indent=2)
    recomputed = ", ".join(f"L{s['layer']} {s['targets']}" for s in report.layers) or "nothing"
    print(
        f"refresh_pe: store version {report.graph_fingerprint[:12]} at {store.base} (recomputed: {recomputed}) "
        f"in {time.perf_counter() - started:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
