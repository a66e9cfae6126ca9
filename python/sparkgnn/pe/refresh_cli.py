"""`sparkgnn-refresh follow`: keep a PE store fresh under a folder of graph update files.

    sparkgnn-refresh follow --graph DIR --model PATH --store DIR --updates DIR --state DIR
                            [--max-batch-updates N] [--max-latency-s S] [--poll-s S]
                            [--max-batches N] [--idle-timeout-s S] [--verify sizes|checksums]
                            [--commit-every-s S] [--commit-rows N] [--commit-spacing X] [--no-publish]
                            [--inline-commits] [--torch-threads N]

Runs pe/follow.RefreshFollower until --max-batches batches ran, nothing arrived for
--idle-timeout-s, or SIGTERM / SIGINT (the batch in progress finishes first; a kill at any point
is safe: a restart on the same --state resumes with nothing applied twice). Batches are held in
memory and committed as one store version every --commit-every-s seconds or --commit-rows held
rows (0 s: a version per batch), and when the follower stops; a version due after a batch is
written on a background thread while the next batches run (--inline-commits: before them); each
version's graph is published
under the store root for a `sparkgnn-serve --follow-store` service (pe/published.py) unless
--no-publish. One progress line per batch on
stdout, and at the end the run's updates/s, batch latency p50 / p99 and vertices recomputed per
layer; a user error (a state folder of another graph, a stale store): one line on stderr, exit 2.
A typed graph is refused in one line: typed stores are refreshed one update at a time by
`spark_jobs/refresh_pe.py --engine local`.

--torch-threads (default 1) sets torch's intra-op threads for the process. WHY one: a batch's
kernels are small (a few thousand rows), so a second thread gains little, and while other work
shares the cores OpenMP's threads wait on each other at every op (on the 2-core box under load,
100-edge batches ran an order of magnitude slower with two threads than with one).
"""

from __future__ import annotations

import argparse
import signal
import sys

from sparkgnn.cliargs import positive_float, positive_int, require_inputs, run_cli


def _seconds(text: str) -> float:
    """argparse type: a finite number of seconds >= 0 (0: a store version per batch)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sparkgnn-refresh", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    follow = commands.add_parser("follow", help="apply update files as they arrive, batch by batch")
    follow.add_argument("--graph", required=True, help="the graph directory the store's version was computed for")
    follow.add_argument("--model", required=True, help="the model the store was computed with (Model.save)")
    follow.add_argument("--store", required=True, help="PE store root (each batch commits a new version there)")
    follow.add_argument("--updates", required=True, help="folder the update files (graph.updates Parquet) arrive in")
    follow.add_argument("--state", required=True, help="checkpoint, batch log and dead letters (resume from it)")
    follow.add_argument("--max-batch-updates", type=positive_int, default=10_000, help="update rows per batch")
    follow.add_argument("--max-latency-s", type=positive_float, default=0.2, help="oldest file's wait per batch")
    follow.add_argument("--poll-s", type=positive_float, default=0.05, help="how often the folder is listed")
    follow.add_argument("--max-batches", type=positive_int, default=None, help="stop after this many batches")
    follow.add_argument("--idle-timeout-s", type=positive_float, default=None, help="stop when idle this long")
    follow.add_argument("--verify", default="sizes", choices=["sizes", "checksums"], help="store check on open")
    follow.add_argument("--commit-every-s", type=_seconds, default=1.0, help="seconds between store versions (>= 0)")
    follow.add_argument("--commit-rows", type=positive_int, default=100_000, help="held rows that force a commit")
    follow.add_argument(
        "--commit-spacing", type=_seconds, default=0.0, help="least time between commits, in last commit's seconds"
    )
    follow.add_argument(
        "--no-publish",
        action="store_true",
        help="do not publish each version's graph under the store root (what a --follow-store service swaps to)",
    )
    follow.add_argument(
        "--inline-commits",
        action="store_true",
        help="write each store version before the next batch, not on a background thread beside it",
    )
    follow.add_argument(
        "--torch-threads", type=positive_int, default=1, help="torch intra-op threads (small batches: 1)"
    )
    args = parser.parse_args(argv)
    require_inputs(parser, {"--graph": args.graph, "--model": args.model, "--store": args.store,
                            "--updates": args.updates})  # fmt: skip
    return args


def refuse_typed(args: argparse.Namespace) -> None:
    """Refuse (UnsupportedModelError, one line) a typed graph directory: a typed store has no
    follower; each typed update is applied by the one-shot refresh (spark_jobs/refresh_pe.py
    --engine local, pe/typed_refresh.py)."""
    from sparkgnn.errors import UnsupportedModelError
    from sparkgnn.graph.typed_io import is_typed_graph_dir

    if is_typed_graph_dir(args.graph):
        raise UnsupportedModelError(
            f"follow: {args.graph} is a typed graph; typed stores are refreshed one update at a time with the "
            "one-shot mode: python spark_jobs/refresh_pe.py --engine local --graph G --model M --store S "
            "--updates TYPED_UPDATE_DIR"
        )


def _follow(args: argparse.Namespace) -> int:
    import torch

    refuse_typed(args)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.torch_threads)
    try:
        return _follow_on(args)
    finally:  # an in-process caller (a test, a notebook) gets its setting back
        torch.set_num_threads(threads)


def _follow_on(args: argparse.Namespace) -> int:
    from sparkgnn.pe.follow import RefreshFollower

    follower = RefreshFollower(
        graph=args.graph,
        model=args.model,
        store=args.store,
        updates=args.updates,
        state=args.state,
        max_batch_updates=args.max_batch_updates,
        max_latency_s=args.max_latency_s,
        poll_s=args.poll_s,
        verify=args.verify,
        commit_every_s=args.commit_every_s,
        commit_rows=args.commit_rows,
        commit_spacing=args.commit_spacing,
        publish=not args.no_publish,
        background_commit=not args.inline_commits,
    )
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: follower.stop())
    from sparkgnn.procgc import freeze_startup_objects

    freeze_startup_objects()  # Python's own full collections then skip the modules' objects (procgc)
    ran = follower.run(max_batches=args.max_batches, idle_timeout_s=args.idle_timeout_s)
    report = follower.report()
    print(
        f"sparkgnn-refresh follow: {len(ran)} batches this run, {report['batches']} in all; version "
        f"{report['graph_fingerprint'][:12]} at {report['store']}; {report['dead_letters']} dead-lettered"
    )
    t = report["throughput"]
    print(
        f"sparkgnn-refresh follow: {t['updates']} updates in {t['batches']} batches, {t['updates_per_s']:.0f} "
        f"updates/s while refreshing; batch latency p50 {t['latency_p50_s']:.3f}s p99 {t['latency_p99_s']:.3f}s; "
        f"vertices recomputed per batch and layer (mean) {t['recomputed_mean']}"
    )
    return 0


def main(argv=None) -> int:
    from sparkgnn.logs import install_cli_handler

    args = parse_args(argv)
    install_cli_handler()  # the follower's progress lines (sparkgnn loggers) on stdout
    return run_cli("sparkgnn-refresh", lambda: _follow(args))


if __name__ == "__main__":
    sys.exit(main())
