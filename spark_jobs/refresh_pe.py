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

Outputs go through the batch job's guard (sparkgnn.outputs.check_output), checked before any
work: neither --out-graph nor --report may be, contain or lie inside an input (the graph, the
store and its root, the model, the update file, the work dir), so the graph's parent folder or
the model's directory is refused, and --report never writes over an input file. An existing
--out-graph or --report is replaced only with --overwrite; the updated graph is written into a
staging sibling and swapped into place when the refresh has succeeded, the report atomically.
"""

from __future__ import annotations

import argparse
import sys
import time

from sparkgnn.cliargs import positive_int, require_inputs, run_cli
from sparkgnn.logs import install_cli_handler


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
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out-graph / --report")
    args = parser.parse_args(argv)
    require_inputs(parser, {"--store": args.store, "--graph": args.graph, "--model": args.model,
                            "--updates": args.updates})  # fmt: skip
    return args


def _spark(args):
    from sparkgnn.engine.refresh import refresh
    from sparkgnn.engine.session import job_session

    spark = job_session("sparkgnn-refresh-pe")
    result = refresh(spark, args.graph, args.model, store=args.store, updates=args.updates, out_graph=args.out_graph,
                     partitions=args.partitions, work_dir=args.work_dir)  # fmt: skip
    return result.store, result.report


def _local(args):
    from sparkgnn.graph.reader import read_graph_dir
    from sparkgnn.graph.updates import GraphUpdate
    from sparkgnn.pe.refresh import refresh_local

    graph = read_graph_dir(args.graph)
    return refresh_local(graph, GraphUpdate.read(args.updates), args.model, args.store, out_graph=args.out_graph)


ENGINES = {"spark": _spark, "local": _local}


def main(argv=None) -> int:
    args = parse_args(argv)
    install_cli_handler()  # the job's progress lines (sparkgnn loggers) on stdout
    return run_cli("refresh_pe", lambda: _run(args))


def check_outputs(args) -> None:
    """Refuse (OutputError, one line) an --out-graph or --report that is, contains or lies inside
    an input, or that exists without --overwrite; a --report that is a directory."""
    from sparkgnn import files
    from sparkgnn.errors import OutputError
    from sparkgnn.outputs import check_output
    from sparkgnn.serving.online.deployments import store_root

    inputs = {"--graph": args.graph, "--store": args.store, "store root": store_root(args.store),
              "--model": args.model, "--updates": args.updates, "--work-dir": args.work_dir}  # fmt: skip
    if args.out_graph:
        check_output(args.out_graph, inputs, overwrite=args.overwrite, flag="--out-graph")
    if args.report:
        check_output(args.report, {**inputs, "--out-graph": args.out_graph}, overwrite=args.overwrite, flag="--report")
        if files.kind(args.report) == "dir":
            raise OutputError(f"--report {args.report} is a directory; name the JSON file to write")


def _run(args) -> int:
    from sparkgnn import files
    from sparkgnn.outputs import discard, staging_path, swap_into_place

    started = time.perf_counter()
    check_outputs(args)
    staged = staging_path(args.out_graph) if args.out_graph else None
    try:
        store, report = ENGINES[args.engine](argparse.Namespace(**{**vars(args), "out_graph": staged}))
    except BaseException:
        if staged:
            discard(staged)
        raise
    if staged:
        swap_into_place(staged, args.out_graph, job="refresh_pe")
    if args.report:
        files.write_json_atomic(args.report, report.to_json(), indent=2)
    recomputed = ", ".join(f"L{s['layer']} {s['targets']}" for s in report.layers) or "nothing"
    print(
        f"refresh_pe: store version {report.graph_fingerprint[:12]} at {store.base} (recomputed: {recomputed}) "
        f"in {time.perf_counter() - started:.1f} s" + (f"; updated graph at {args.out_graph}" if args.out_graph else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
