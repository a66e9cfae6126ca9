"""sparkgnn-serve: run the online service, or tune its thresholds offline.

    sparkgnn-serve serve --config deploy.json            (or --graph G --model M --store S ...)
    sparkgnn-serve tune  --config deploy.json --requests DIR [--rate R] [--seconds S]
    sparkgnn-serve swap  --url http://HOST:PORT --graph G2 [--store S] [--token T]

`serve` prints one line with its endpoints, then a status line every --report-s seconds, and
runs until interrupted (SIGINT / SIGTERM: in-flight batches finish, the pools stop). With
--follow-store it swaps to each version a `sparkgnn-refresh follow` of its --store publishes,
checked every --follow-interval-s (serving.online.store_follow).

`tune` is GSM's parameter tuner (section IV-C): it replays the recorded requests (Parquet request
files, serving.request) open-loop at --rate against the deployment for each candidate pair, first
a 1-D search over T_s for each T_d, then the best pair; T_s candidates are the subgraph sizes at
which 10% and 25% of batches would be divided (tuner.candidate_ts) plus "no division". The chosen
thresholds are written into the deployment's config (--config) and every point into
<config>.tuning.json.

`swap` asks a running service to serve another version of its graph (after an incremental PE
refresh: the updated graph directory and, by default, the same store root) without a restart:
the service checks the new graph and store (under its `swap_roots`), loads them on every worker,
then switches (Server.swap). It goes through the HTTP front's admin path, which needs the
service's ADMIN token (--token-file, or SPARKGNN_SERVE_ADMIN_TOKEN); it prints the swap's report as
JSON, or the refusal.

Tokens come from a file (--token-file, --admin-token-file: the first line) or the environment
(SPARKGNN_SERVE_TOKEN, SPARKGNN_SERVE_ADMIN_TOKEN), where `ps` does not show them. `--token` on the
command line is still taken for a loopback service, with a warning, and refused for any other.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time

import numpy as np

from sparkgnn.cliargs import positive_float, positive_int, require_inputs, run_cli
from sparkgnn.logs import install_cli_handler
from sparkgnn.serving.online.config import ServeConfig
from sparkgnn.serving.online.pools import ServeError
from sparkgnn.serving.online.server import Server, open_service

log = logging.getLogger(__name__)
TOKEN_ENV = "SPARKGNN_SERVE_TOKEN"
ADMIN_TOKEN_ENV = "SPARKGNN_SERVE_ADMIN_TOKEN"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sparkgnn-serve", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the service")
    tune = sub.add_parser("tune", help="choose T_d and T_s for a recorded workload")
    for q in (serve, tune):
        q.add_argument("--config", help="deployment JSON (ServeConfig fields); flags below override it")
        q.add_argument("--graph")
        q.add_argument("--model")
        q.add_argument("--store")
        q.add_argument("--mode", help="the deployment's default mode (full, ns, he, srpe, exact)")
        q.add_argument("--scheduler", help="fifo or degree")
        q.add_argument("--workers", type=positive_int, help="one pool of N sparkgnn-worker processes")
    serve.add_argument("--bind", help="ZeroMQ endpoint (default tcp://127.0.0.1:0)")
    serve.add_argument("--http", help="HOST:PORT of the HTTP front (default 127.0.0.1:0)")
    serve.add_argument("--token-file", help=f"file holding the bearer token HTTP clients send (or ${TOKEN_ENV})")
    serve.add_argument("--token", help="the token on the command line (loopback only: `ps` shows it)")
    serve.add_argument(
        "--admin-token-file", help=f"file holding the admin token /v1/admin/* needs (or ${ADMIN_TOKEN_ENV})"
    )
    serve.add_argument("--tls-cert", help="PEM certificate chain: the HTTP front serves HTTPS (needed off loopback)")
    serve.add_argument("--tls-key", help="PEM private key of --tls-cert")
    serve.add_argument("--modes", help="comma-separated modes served (default: the config's, else he,srpe)")
    serve.add_argument(
        "--swap-root", action="append", dest="swap_roots", help="a folder swapped versions may come from (repeatable)"
    )
    serve.add_argument(
        "--curve-keys",
        help="CURVE keys folder (sparkgnn-keys: server.key_secret + authorized_clients/): only listed "
        "clients reach the ZeroMQ front; required for a non-loopback ZeroMQ bind",
    )
    serve.add_argument(
        "--follow-store",
        action="store_true",
        default=None,
        help="swap to each version `sparkgnn-refresh follow` publishes under --store's root",
    )
    serve.add_argument(
        "--follow-interval-s", type=positive_float, help="how often a followed store is checked (default 0.5)"
    )
    serve.add_argument(
        "--fronts",
        type=positive_int,
        help="HTTP front processes sharing --http's port (SO_REUSEPORT), one per core; default 1",
    )
    serve.add_argument("--report-s", type=positive_float, default=10.0)
    tune.add_argument("--requests", required=True, help="folder of request Parquet files to replay")
    tune.add_argument("--rate", type=positive_float, default=200.0, help="requests per second offered")
    tune.add_argument("--seconds", type=positive_float, default=5.0, help="replay length per point")
    tune.add_argument("--td", default="256,1024,4096,16384", help="T_d candidates")
    swap = sub.add_parser("swap", help="make a running service serve another graph version")
    swap.add_argument("--url", required=True, help="the service's HTTP front (http://HOST:PORT)")
    swap.add_argument("--graph", required=True, help="the new graph directory (as the service sees paths)")
    swap.add_argument("--store", help="the PE store (default: the root of the store it serves now)")
    swap.add_argument("--token-file", help=f"file holding the service's admin token (or ${ADMIN_TOKEN_ENV})")
    swap.add_argument("--token", help="the admin token on the command line (`ps` shows it)")
    swap.add_argument("--ca-file", help="PEM certificates an https:// service's certificate chains to")
    swap.add_argument("--timeout-s", type=positive_float, default=300.0, help="for every worker to load it")
    return p


def read_token(path: str, flag: str) -> str:
    """The token in the file `path` (its first line, stripped); ServeError naming `flag` when the
    file cannot be read or holds none."""
    try:
        with open(path, encoding="utf-8") as fh:
            token = fh.readline().strip()
    except OSError as exc:
        raise ServeError(f"{flag} {path}: cannot be read ({exc.strerror or exc})") from None
    if not token:
        raise ServeError(f"{flag} {path}: holds no token (its first line is empty)")
    return token


def token_from(args, file_flag: str, env: str, loopback: bool) -> str | None:
    """A token from `file_flag`'s file, else the environment variable `env`, else --token (taken
    only for a loopback service, with a warning: argv is visible to every local user); None
    when none is given."""
    path = getattr(args, file_flag.lstrip("-").replace("-", "_"), None)
    if path:
        return read_token(path, file_flag)
    if os.environ.get(env):
        return os.environ[env]
    if getattr(args, "token", None):
        if not loopback:
            raise ServeError(
                f"--token on the command line is taken for a loopback service only: use {file_flag} or ${env}"
            )
        log.warning(f"sparkgnn-serve: --token is visible to every local user (ps); prefer {file_flag} or ${env}")
        return args.token
    return None


def _loopback_http(http: str | None) -> bool:
    from sparkgnn.messenger.endpoints import is_loopback
    from sparkgnn.serving.online.config import split_http_bind

    if not http:
        return True
    host, _port = split_http_bind(http)
    return is_loopback(f"tcp://{f'[{host}]' if ':' in host else host}:1")


def config_from(args) -> ServeConfig:
    base = ServeConfig.load(args.config).__dict__ if args.config else {}
    for name in ("graph", "model", "store", "mode", "scheduler"):
        if getattr(args, name, None) is not None:
            base[name] = getattr(args, name)
    for name in (
        "bind",
        "http",
        "curve_keys",
        "tls_cert",
        "tls_key",
        "swap_roots",
        "follow_store",
        "follow_interval_s",
        "fronts",
    ):
        if getattr(args, name, None) is not None:
            base[name] = getattr(args, name)
    if getattr(args, "modes", None):
        base["modes"] = [m.strip() for m in args.modes.split(",") if m.strip()]
    if hasattr(args, "token_file"):  # serve: the tokens' sources (module doc)
        loopback = _loopback_http(base.get("http", ServeConfig.__dataclass_fields__["http"].default))
        token = token_from(args, "--token-file", TOKEN_ENV, loopback)
        if token is not None:
            base["token"] = token
        admin = read_token(args.admin_token_file, "--admin-token-file") if args.admin_token_file else None
        admin = admin or os.environ.get(ADMIN_TOKEN_ENV)
        if admin:
            base["admin_token"] = admin
    if args.workers:
        base["pools"] = [{"name": "workers", "kind": "workers", "width": args.workers, "threads": 1}]
    if not base.get("graph") or not base.get("model"):
        raise ServeError("give --config, or --graph and --model")
    return ServeConfig(**base).check("the deployment")


def serve(args) -> int:
    config = config_from(args)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with open_service(config) as server:
        if server.zmq_endpoint is None:  # a typed service: HTTP only (typed_service.py)
            print(f"sparkgnn-serve: serving typed {config.mode} on {server.http_url}", flush=True)
        else:
            print(f"sparkgnn-serve: serving {config.mode} on {server.zmq_endpoint} and {server.http_url}", flush=True)
        while not stop.wait(args.report_s):
            print(f"sparkgnn-serve: {server.metrics.status_line()}", flush=True)  # the numbers of /metrics
    return 0


def replay(server: Server, requests: list, rate: float, seconds: float, seed: int = 0) -> dict:
    """Open-loop replay through `server.submit`: Poisson send times fixed in advance (a slow
    service does not slow the sender). Mean / p99 latency in seconds over the answered ones."""
    rng = np.random.default_rng(seed)
    count = max(1, int(rate * seconds))
    times = np.cumsum(rng.exponential(1.0 / rate, count))
    futures = []
    start = time.monotonic()
    for i, at in enumerate(times):
        delay = start + at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        futures.append(server.submit(requests[i % len(requests)]))
    latencies, busy, errors = [], 0, 0
    for future in futures:
        outcome = future.result(timeout=max(60.0, seconds * 10))
        if outcome.kind == "ok":
            latencies.append(outcome.queue_s + outcome.service_s)
        elif outcome.kind == "busy":
            busy += 1
        else:
            errors += 1
    lat = np.asarray(latencies) if latencies else np.asarray([np.inf])
    return {"mean_s": float(lat.mean()), "p99_s": float(np.quantile(lat, 0.99)), "busy": busy, "errors": errors}


def tune(args) -> int:
    from sparkgnn.serving.online.tuner import candidate_ts, write_thresholds
    from sparkgnn.serving.online.tuner import tune as search
    from sparkgnn.serving.request import read_requests

    config = config_from(args)
    from sparkgnn.graph.typed_io import is_typed_graph_dir

    if is_typed_graph_dir(config.graph):
        raise ServeError(
            f"graph {config.graph} is typed: a typed service answers each request alone, with no scheduler "
            "thresholds (T_d, T_s) to tune"
        )
    requests = read_requests(args.requests)
    if not requests:
        raise ServeError(f"no requests in {args.requests}")
    td_values = [float(v) for v in args.td.split(",")]
    probe = Server(config, start_pools=False)
    sizes = [probe.facts.pending(r, None, "", 0.0)[0].hop_sizes for r in requests]

    def measure(t_d: float, t_s: int) -> float:
        config.t_d, config.t_s = t_d, t_s
        with Server(config) as server:
            result = replay(server, requests, args.rate, args.seconds)
        print(f"sparkgnn-serve tune: T_d={t_d:g} T_s={t_s}: mean {result['mean_s'] * 1e3:.2f} ms", flush=True)
        return result["mean_s"] if not result["errors"] and not result["busy"] else float("inf")

    result = search(measure, td_values, [0, *candidate_ts(sizes)])
    config.t_d, config.t_s = result.t_d, result.t_s
    if args.config:
        config.save(args.config)
        write_thresholds(f"{args.config}.tuning.json", result, {"rate": args.rate, "requests": args.requests})
    print(f"sparkgnn-serve tune: chose T_d={result.t_d:g} T_s={result.t_s} (mean {result.latency * 1e3:.2f} ms)")
    return 0


def swap(args) -> int:
    from sparkgnn.serving.online.client import Client

    token = read_token(args.token_file, "--token-file") if args.token_file else os.environ.get(ADMIN_TOKEN_ENV)
    if not token and args.token:
        log.warning(
            f"sparkgnn-serve: --token is visible to every local user (ps); prefer --token-file or ${ADMIN_TOKEN_ENV}"
        )
        token = args.token
    with Client(args.url, token=token, ca_file=args.ca_file) as client:
        report = client.swap(args.graph, args.store, timeout_s=args.timeout_s)
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    install_cli_handler()  # library progress lines (sparkgnn loggers) on stdout
    if args.command == "swap":  # the paths are the service's: it checks them and names what is wrong
        if not args.url.startswith(("http://", "https://")):
            parser.error(f"--url {args.url!r}: give the service's HTTP front (http://HOST:PORT)")
        return run_cli("sparkgnn-serve", lambda: swap(args))
    inputs = {"--config": args.config, "--graph": args.graph, "--model": args.model, "--store": args.store}
    if args.command == "tune":
        inputs["--requests"] = args.requests
    require_inputs(parser, inputs)
    return run_cli("sparkgnn-serve", lambda: {"serve": serve, "tune": tune}[args.command](args))


if __name__ == "__main__":
    raise SystemExit(main())
