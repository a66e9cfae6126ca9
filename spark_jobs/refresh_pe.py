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

A typed graph directory (with its typed model and typed store) runs with `--engine local` only:
--updates is then a typed update folder (graph/updates/typed.py: vertices/<node type>/ and
edges/<src>__<relation>__<dst>/), applied by pe/typed_refresh.refresh_typed_local under the same
output rules, report and summary line; --out-graph receives the updated typed graph. WHY local
only: the Spark refresh job merges stored aggregation states, which a typed store does not keep
(engine/api.py refuses typed stores), so the default engine refuses a typed graph in one line
naming `--engine local`, before any Spark session starts. A typed input the typed refresh cannot
take (an update naming an unknown type or relation, a model for other metadata, a store of
another graph, a relation needing GCN's degrees or several passes) is refused in one line naming
the type or relation, nothing written.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from sparkgnn.cliargs import positive_int, require_inputs, run_cli
from sparkgnn.logs import install_cli_handler


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="refresh_pe.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True, help="PE store root directory (the old version is read from it)")
    parser.add_argument("--graph", required=True, help="the graph directory the store was computed for")
    parser.add_argument("--model", required=True, help="the model the store was computed with (Model.save)")
    parser.add_argument(
        "--updates", required=True, help="graph update: Parquet file or folder (graph.updates); typed: a folder"
    )
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
    if args.typed:
        return _local_typed(args)
    from sparkgnn.graph.reader import read_graph_dir
    from sparkgnn.graph.updates import GraphUpdate
    from sparkgnn.pe.refresh import refresh_local

    graph = read_graph_dir(args.graph)
    return refresh_local(graph, GraphUpdate.read(args.updates), args.model, args.store, out_graph=args.out_graph)


def _local_typed(args):
    """--engine local on a typed graph or model: the typed update folder applied to the typed
    store by refresh_typed_local (module doc)."""
    from sparkgnn.engine.typed import is_typed_source
    from sparkgnn.errors import UnsupportedModelError
    from sparkgnn.graph.typed_io import is_typed_graph_dir, read_typed_graph_dir
    from sparkgnn.graph.updates import TypedGraphUpdate
    from sparkgnn.pe.typed_refresh import refresh_typed_local

    if not is_typed_graph_dir(args.graph):  # engine.typed's wording for the same mismatch
        raise UnsupportedModelError(
            f"graph directory {args.graph} is homogeneous but the model is typed (node and edge types)"
        )
    if not is_typed_source(args.model):
        raise UnsupportedModelError(f"model {args.model} is homogeneous but the graph is typed")
    graph = read_typed_graph_dir(args.graph)
    update = TypedGraphUpdate.read(args.updates)
    return refresh_typed_local(graph, update, args.model, args.store, out_graph=args.out_graph)


def _is_typed_update(path: str) -> bool:
    """Whether `path` is laid out as a typed update folder (vertices/ or edges/ inside)."""
    from sparkgnn.graph import layout

    root = layout.strip_scheme(path)
    return os.path.isdir(root) and any(os.path.isdir(os.path.join(root, n)) for n in ("vertices", "edges"))


def check_typed(args) -> bool:
    """Whether the refresh is typed (a typed graph directory or typed model, engine.typed's test);
    refuse (UnsupportedModelError / GraphUpdateError, one line) a typed one on the Spark engine and
    a typed update folder for a homogeneous graph, before any work."""
    from sparkgnn.engine.typed import is_typed_source
    from sparkgnn.errors import GraphUpdateError, UnsupportedModelError

    typed = is_typed_source(args.graph) or is_typed_source(args.model)
    if typed and args.engine != "local":
        raise UnsupportedModelError(
            f"{args.graph}: the Spark refresh job runs homogeneous graphs only; a typed store is refreshed on one "
            "machine: rerun with --engine local"
        )
    if not typed and _is_typed_update(args.updates):
        raise GraphUpdateError(
            f"--updates {args.updates} is a typed update (vertices/<node type>/, edges/<src>__<relation>__<dst>/) "
            f"but graph {args.graph} has one vertex type"
        )
    return typed


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
    typed = check_typed(args)
    check_outputs(args)
    staged = staging_path(args.out_graph) if args.out_graph else None
    try:
        store, report = ENGINES[args.engine](argparse.Namespace(**{**vars(args), "out_graph": staged, "typed": typed}))
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
