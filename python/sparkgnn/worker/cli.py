"""`sparkgnn-worker --connect tcp://127.0.0.1:5556 --device cpu|cuda[:i] --model-store DIR
[--deployments FILE] [--serve-cache-bytes N] [--threads N]`: a standalone PyTorch worker behind
the messenger broker.

WHY here and not in the messenger: the messenger must not import torch (it is what lets the
broker and dealers run anywhere); this module glues the messenger's generic worker loop
(`sparkgnn.messenger.worker.serve`) to the torch handler (`sparkgnn.dl.handler.build_handler`),
which loads models by fingerprint from the model store and refuses unknown ones. It is a
composition root: the handler serves dl's own op (layer_step) and the ops registered here
(serving's serving_partials, serve_batch and serve_evict, sparkgnn.serving.dl_ops); sparkgnn.dl
never imports serving. What those serving ops serve is fixed here, at start: the deployments
listed in --deployments (re-read when the file changes, so the process that started the worker
can add and withdraw versions; sparkgnn.serving.served), named in task headers by id; no task
header can name a path, a URI or an engine option. Their caches are bounded by
--serve-cache-bytes. Heartbeats,
reconnect with backoff, ERROR answers for bad tasks and the parent-death watchdog (when started
by LocalCluster) come from the messenger.

User errors end as one line on stderr with exit code 2, never a traceback: a bad argument, a
--connect with no broker answering within --connect-timeout (after printing at once where it is
connecting), a taken --data-bind port, a model store it cannot read (sparkgnn.cliargs.run_cli).
"""

from __future__ import annotations

import argparse
import os
import sys

from sparkgnn.cliargs import device_name, positive_int, run_cli
from sparkgnn.files import filesystem, is_local
from sparkgnn.heap import retain_freed_memory
from sparkgnn.messenger import cli as messenger_cli
from sparkgnn.messenger import worker as messenger_worker

PROG = "sparkgnn-worker"


def parse_args(argv=None) -> argparse.Namespace:
    p = messenger_cli.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    messenger_worker.add_common_args(p)
    p.add_argument("--device", type=device_name, default="cpu", help="cpu, cuda or cuda:i")
    p.add_argument("--model-store", required=True, help="folder of saved models, by fingerprint")
    p.add_argument(
        "--deployments",
        default=None,
        help='JSON file {"deployments": [spec, ...]}: what the serving ops serve (by id); '
        "owned by this user, writable by no one else; re-read when it changes",
    )
    p.add_argument(
        "--serve-cache-bytes",
        type=positive_int,
        default=None,
        help="bound of each serving cache (loaded deployments, CGP shards), least recently used out first",
    )
    p.add_argument("--threads", type=positive_int, default=None, help="torch intra-op threads")
    args = p.parse_args(argv)
    if not (
        args.device == "cpu" or args.device == "cuda" or (args.device.startswith("cuda:") and args.device[5:].isdigit())
    ):
        p.error(f"--device must be cpu, cuda or cuda:i, got {args.device!r}")
    if is_local(args.model_store) and not os.path.isdir(filesystem(args.model_store)[1]):
        p.error(f"--model-store {args.model_store!r} is not a folder")  # s3:// & co.: folders exist only as prefixes
    if args.deployments is not None and not os.path.isfile(args.deployments):
        p.error(f"--deployments {args.deployments!r} is not a file")
    return args


def build(args: argparse.Namespace):
    """The GNN handler for these arguments (imports torch). It serves dl's layer_step and the ops
    this composition root registers: serving's serving_partials (one CGP partition), serve_batch
    and serve_evict, for the deployments of --deployments only (read now: a malformed or
    foreign-writable file is one line, exit 2)."""
    from sparkgnn.dl.handler import build_handler
    from sparkgnn.serving import dl_ops, served

    served.serve_file(args.deployments)
    if args.serve_cache_bytes:
        served.set_cache_bytes(args.serve_cache_bytes)
    dl_ops.register()
    worker = dl_ops.WorkerOps()  # this worker's loaded deployments, held by its handler
    return build_handler(model_store=args.model_store, device=args.device, threads=args.threads, ops=worker.registry())


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_cli(PROG, lambda: _serve(args))


def _serve(args: argparse.Namespace) -> int:
    messenger_worker.announce_connecting(args)  # at once: building the handler imports torch
    retain_freed_memory()  # batch after batch reuses the same buffers (sparkgnn.heap)
    handler = build(args)
    return messenger_worker.run_from_args(args, handler, info={"device": args.device})


if __name__ == "__main__":
    sys.exit(main())
