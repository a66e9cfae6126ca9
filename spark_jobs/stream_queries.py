"""Streaming query micro-batches: answer request files dropped into a directory, exactly once per
request, restartable from a checkpoint (Spark Structured Streaming, foreachBatch).

    spark-submit spark_jobs/stream_queries.py --graph DIR --model PATH --requests DIR --out DIR
        --checkpoint DIR [--store DIR] [--mode srpe|exact|he|full|ns] [options]
        [--max-requests-per-batch N] [--max-file-bytes B] [--max-file-rows N]
        [--max-file-decompressed-bytes B] [--max-queries N] [--max-edges N]
    python spark_jobs/stream_queries.py ...             (creates a local session)

A typed graph directory with a typed model is detected: its request files are typed
(serving/typed_request.py) and rows carry each query's node type (qtype).

Output: <out>/batch_id=<id>/part-00000.parquet, one row per request (request_id, qid, h, pred,
error, arrival/queue/service/latency seconds, ...); malformed files, and files over the
--max-file-* caps (checked on the file's size and Parquet footer before it is collected to the
driver), under --dead-letter (default <out>/_dead_letter) with a reason file. Exit codes: 0
stopped cleanly, 2 refused to start (stale PE store, unknown mode or option, output of another
checkpoint), 1 the query failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from sparkgnn.cliargs import int_list, non_negative_int, positive_float, positive_int, run_cli
from sparkgnn.logs import install_cli_handler
from sparkgnn.serving.cliopts import gamma_type, non_negative_float
from sparkgnn.streaming.intake import FileLimits
from sparkgnn.streaming.job import DEFAULT_MAX_FILES_PER_TRIGGER

PROG = "stream_queries.py"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--graph", required=True, help="G's graph directory (edges and features; the store is verified against it)"
    )
    p.add_argument("--model", required=True, help="model saved with sparkgnn Model.save (HeteroModel.save: typed)")
    p.add_argument(
        "--store", default=None, help="PE store root (required except for modes full and ns; typed: for exact)"
    )
    p.add_argument("--requests", required=True, help="directory watched for request files (*.parquet)")
    p.add_argument("--out", required=True, help="answers: <out>/batch_id=<id>/")
    p.add_argument("--checkpoint", required=True, help="Spark checkpoint directory (restart with the same one)")
    p.add_argument(
        "--mode", default="full", help="serving mode (full, ns, he, srpe, exact; typed: full, exact; default full)"
    )
    p.add_argument("--gamma", type=gamma_type, default=None, help="SRPE recomputation budget, in (0, 1]")
    p.add_argument("--policy", default=None, help="SRPE policy (qer, is, random, ae)")
    p.add_argument("--partitions", type=positive_int, default=None, help="CGP partitions (reuse modes)")
    p.add_argument("--fanouts", type=int_list(1), default=None, help="NS fanouts, comma separated, each >= 1")
    p.add_argument(
        "--workers",
        default="inprocess",
        help="inprocess (default: the driver answers) | spark (he/srpe/exact: the --partitions CGP "
        "partitions run as Spark tasks over the PE store cached in the Python workers) | "
        "local[N] | tcp://... | ipc://... (he/srpe/exact: the partitions run on messenger "
        "workers, op serving_partials; local[N] starts and stops N of them)",
    )
    p.add_argument(
        "--engine",
        default=None,
        help="serve://tcp://HOST:PORT (or serve://http://...): a running sparkgnn-serve answers the "
        "requests (its scheduler and workers), not this driver",
    )
    p.add_argument("--grouping", default="degree", help="grouping policy: degree (GSM, default) | fifo")
    p.add_argument(
        "--degree-threshold", type=positive_float, default=None, help="degree grouping: cost sum T_d per engine batch"
    )
    p.add_argument(
        "--aging",
        type=positive_float,
        default=None,
        help="degree grouping: seconds after which a request jumps the queue",
    )
    p.add_argument(
        "--fifo-batch-size", type=positive_int, default=None, help="fifo grouping: requests per engine batch"
    )
    p.add_argument(
        "--trigger",
        type=non_negative_float,
        default=0.0,
        help="seconds between micro-batches (0: as soon as the last one ends)",
    )
    p.add_argument("--available-now", action="store_true", help="answer the files present at start-up, then stop")
    p.add_argument(
        "--max-requests-per-batch",
        type=positive_int,
        metavar="N",
        default=None,
        help="maxFilesPerTrigger: files (= requests, one per file) admitted per micro-batch "
        f"(default {DEFAULT_MAX_FILES_PER_TRIGGER}, oldest first)",
    )
    limits = FileLimits()
    p.add_argument(
        "--max-file-bytes",
        type=positive_int,
        metavar="BYTES",
        default=limits.max_bytes,
        help="a request file larger than this many bytes is dead-lettered before it is read "
        f"(default {limits.max_bytes}); a micro-batch holds at most --max-requests-per-batch x this",
    )
    p.add_argument(
        "--max-file-rows",
        type=positive_int,
        metavar="N",
        default=limits.max_rows,
        help=f"a request file whose Parquet footer declares more rows is dead-lettered (default {limits.max_rows})",
    )
    p.add_argument(
        "--max-file-decompressed-bytes",
        type=positive_int,
        metavar="BYTES",
        default=limits.max_decompressed_bytes,
        help="a request file whose footer declares more uncompressed column bytes (a decompression "
        f"bomb) is dead-lettered unread (default {limits.max_decompressed_bytes})",
    )
    p.add_argument(
        "--max-queries",
        type=positive_int,
        metavar="N",
        default=limits.max_queries,
        help=f"a request with more query nodes is answered with an error row (default {limits.max_queries}, "
        "the online service's cap)",
    )
    p.add_argument(
        "--max-edges",
        type=positive_int,
        metavar="N",
        default=limits.max_edges,
        help=f"a request with more edges is answered with an error row (default {limits.max_edges}, "
        "the online service's cap)",
    )
    p.add_argument("--dead-letter", default=None, help="malformed files go here (default <out>/_dead_letter)")
    p.add_argument("--max-batches", type=positive_int, default=None, help="stop after N micro-batches (tests)")
    p.add_argument("--timeout", type=positive_float, default=None, help="stop after S seconds (tests, demos)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed for sampling modes (ns)")
    p.add_argument("--no-warmup", action="store_true", help="skip the start-up warm-up request")
    p.add_argument(
        "--torch-threads",
        type=positive_int,
        default=None,
        help="torch intra-op threads for the engine (default: torch's)",
    )
    args = p.parse_args(argv)
    for flag, path in (("--graph", args.graph), ("--model", args.model), ("--store", args.store)):
        if path is not None and not os.path.exists(path):
            p.error(f"{flag} {path!r} does not exist")
    return args


def config_from_args(args):
    from sparkgnn.streaming.job import StreamConfig

    mode_options = {
        k: v
        for k, v in (("gamma", args.gamma), ("policy", args.policy), ("partitions", args.partitions))
        if v is not None
    }
    if args.fanouts:
        mode_options["fanouts"] = tuple(args.fanouts)
    grouping_options = {
        k: v
        for k, v in (
            ("threshold", args.degree_threshold),
            ("aging_s", args.aging),
            ("batch_size", args.fifo_batch_size),
        )
        if v is not None
    }
    return StreamConfig(
        graph=args.graph,
        model=args.model,
        store=args.store,
        requests=args.requests,
        out=args.out,
        checkpoint=args.checkpoint,
        mode=args.mode,
        mode_options=mode_options,
        workers=args.workers,
        engine=args.engine,
        grouping=args.grouping,
        grouping_options=grouping_options,
        trigger_s=args.trigger or None,
        available_now=args.available_now,
        max_files_per_trigger=args.max_requests_per_batch,
        max_file_bytes=args.max_file_bytes,
        max_file_rows=args.max_file_rows,
        max_file_decompressed_bytes=args.max_file_decompressed_bytes,
        max_queries=args.max_queries,
        max_edges=args.max_edges,
        dead_letter=args.dead_letter,
        max_batches=args.max_batches,
        timeout_s=args.timeout,
        seed=args.seed,
        warmup=not args.no_warmup,
    )


def main(argv=None) -> int:
    """Usage errors exit 2 through argparse; every refusal after parsing (stale PE store, unknown
    mode or option, output of another checkpoint, a missing or unwritable path) through run_cli:
    one `stream_queries.py: error: ...` line, exit 2. A query that failed while running exits 1."""
    args = parse_args(argv)
    install_cli_handler()  # the job's progress lines (sparkgnn loggers) on stdout
    return run_cli(PROG, lambda: _run(args))


def _run(args) -> int:
    from sparkgnn.engine.session import job_session
    from sparkgnn.streaming.job import StreamJobError, run

    started = time.perf_counter()
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    cfg = config_from_args(args)
    try:
        result = run(cfg, lambda: job_session("sparkgnn-stream-queries"), handle_signals=True)
    except StreamJobError as exc:  # the query started and failed: not a refusal
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return 1
    print(
        f"stream_queries: {result.batches} micro-batches (last batch id {result.last_batch_id}) in "
        f"{time.perf_counter() - started:.1f} s, stopped: {result.stopped_by}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
