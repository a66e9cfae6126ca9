"""What every worker executable shares, and the generic one.

    python -m sparkgnn.messenger.worker --connect EP --handler module:function [options]

`add_common_args` / `announce_connecting` / `run_from_args` are the command line every worker
executable shares (this generic worker, and `sparkgnn-worker`, sparkgnn.worker.cli, which serves
the GNN handler); the loop they run is worker_loop.py (`Worker`, `serve`, re-exported here).
User errors (bad arguments, an unloadable handler, no broker, a taken --data-bind): one line on
stderr, exit code 2 (cli.py).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading

from sparkgnn.messenger import cli, endpoints, memory, security, watchdog
from sparkgnn.messenger.protocol import DEFAULT_MAX_MESSAGE_BYTES, Handler
from sparkgnn.messenger.worker_loop import Worker, serve

log = logging.getLogger("sparkgnn.messenger.worker")  # not __name__: also run as __main__ (-m)

__all__ = [
    "CONNECT_TIMEOUT_S",
    "Worker",
    "add_common_args",
    "announce_connecting",
    "import_handler",
    "main",
    "run_from_args",
    "serve",
]


def import_handler(spec: str) -> Handler:
    """`module:attribute` -> the handler object (local code named on the command line; nothing
    from the wire is ever imported or evaluated)."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"--handler wants module:function, got {spec!r}")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{spec} is not callable")
    return obj


CONNECT_TIMEOUT_S = 60.0  # the CLIs' default: a worker is often started before its broker


def _connect_endpoint(text: str) -> str:
    """argparse type: an endpoint a socket can connect to (checked before anything starts)."""
    try:
        return endpoints.check_connect(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_common_args(p: argparse.ArgumentParser) -> None:
    """Options every worker executable shares (generic and sparkgnn-worker)."""
    p.add_argument(
        "--connect",
        default="tcp://127.0.0.1:5556",
        type=_connect_endpoint,
        help="the broker's --back endpoint (default %(default)s)",
    )
    p.add_argument(
        "--connect-timeout",
        type=cli.non_negative_float,
        default=CONNECT_TIMEOUT_S,
        help="seconds to wait for the broker's first answer; if none comes, exit with "
        "code 2 (default %(default)g; 0 = wait forever). Once connected, a lost "
        "broker is waited for and reconnected to",
    )
    p.add_argument("--heartbeat", type=cli.positive_float, default=1.0, help="heartbeat interval, seconds")
    p.add_argument("--liveness", type=cli.positive_int, default=3, help="silent intervals before reconnecting")
    p.add_argument("--slots", type=cli.positive_int, default=2, help="tasks assigned at once (1 running + prefetch)")
    p.add_argument(
        "--max-message-bytes",
        type=cli.positive_int,
        default=DEFAULT_MAX_MESSAGE_BYTES,
        help="largest task (or result) this worker takes; a larger one is refused with an "
        "error naming both sizes (default %(default)s)",
    )
    p.add_argument(
        "--curve-keys",
        default=os.environ.get(security.KEYS_ENV) or None,
        help="keys folder (sparkgnn-keys): server.key(_secret), worker.key_secret, authorized_clients/ "
        f"(default ${security.KEYS_ENV})",
    )
    p.add_argument("--data-bind", default=None, help="data socket bind (default: next to --connect)")
    p.add_argument("--advertise", default=None, help="host dealers use for a wildcard tcp data bind")
    p.set_defaults(prog=p.prog)  # run_from_args names the program in its stderr lines


def announce_connecting(args: argparse.Namespace) -> None:
    """The first line a worker prints, at once (before a slow handler build): where it goes and
    how long it will look for a broker there."""
    limit = (
        f"exits if none answers within {args.connect_timeout:g} s"
        if args.connect_timeout
        else "waits for it without limit"
    )
    _log_to_stderr(args)
    log.info(f"connecting to broker at {args.connect} ({limit}; --connect-timeout)")


def _log_to_stderr(args: argparse.Namespace) -> None:
    """A worker's lines (the sparkgnn loggers, INFO and up) go to stderr as `[prog] line`."""
    cli.install_cli_handler(stream="stderr", prefix=f"[{args.prog}] ")


def run_from_args(args: argparse.Namespace, handler: Handler, info: dict | None = None) -> int:
    """Shared main body: watchdog, malloc tuning, SIGTERM -> clean stop, serve. Raises
    BrokerUnreachableError when no broker answers within --connect-timeout (the mains turn it
    into one line on stderr and exit code 2)."""
    _log_to_stderr(args)
    watchdog.start_from_env()
    memory.tune_malloc()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve(
        args.connect,
        handler,
        args.heartbeat,
        args.liveness,
        stop,
        slots=args.slots,
        max_message_bytes=args.max_message_bytes,
        curve_keys_dir=args.curve_keys,
        data_bind=args.data_bind,
        advertise_host=args.advertise,
        info=info,
        connect_timeout_s=args.connect_timeout,
    )
    return 0


def main(argv=None) -> int:
    """Generic worker: `python -m sparkgnn.messenger.worker --connect EP --handler mod:fn`.
    The product's worker is `sparkgnn-worker` (sparkgnn.worker.cli), which builds the GNN handler.
    User errors (bad arguments, an unloadable handler, no broker, a taken --data-bind): one line on
    stderr, exit code 2."""
    p = cli.ArgumentParser(prog="python -m sparkgnn.messenger.worker")
    add_common_args(p)
    p.add_argument("--handler", required=True, help="module:function implementing Handler")
    args = p.parse_args(argv)
    try:
        handler = import_handler(args.handler)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        p.error(f"--handler {args.handler!r}: {exc}")
    return cli.run(args.prog, lambda: _serve(args, handler))


def _serve(args: argparse.Namespace, handler: Handler) -> int:
    announce_connecting(args)
    return run_from_args(args, handler, info={"handler": args.handler})


if __name__ == "__main__":
    sys.exit(main())
