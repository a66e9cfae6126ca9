"""Quick check of the online service's CPU per single-query HE request over HTTP or ZeroMQ (not part of
`make bench`): a seeded synthetic graph (2K nodes / 20K edges / 32-d by default), a 2-layer
SAGE-mean model (`--out-dim` outputs per answer row, 8 by default) and its store, a Server with
one in-process pool (the engine runs in the service's process, as in the tests) and its HTTP
front (or, `--front zmq`, its ZeroMQ front, requests packed as Client sends them); a client
process sends `--requests` single-query HE requests (each a new node with 1-8 edges both ways)
over `--clients` keep-alive connections. `--work DIR` keeps the graph, model and store for a
rerun (which then ignores --nodes, --edges, --dim and --out-dim).

Prints one JSON object: the service process's CPU milliseconds per answered request
(time.process_time over the run / requests), the same split by thread (the HTTP event loop or
the ZeroMQ intake thread, the parse pool, the batcher and dispatch threads (a dispatch thread runs the engine call),
other threads such as torch's), the wall time and the requests per second. The client's CPU is
in its own process and not counted. One short run: about 20 s on 2 cores.

    .venv/bin/python bench/online_fastpath_quick.py [--nodes N --edges E --dim F --out-dim D]
                                                    [--requests R --clients C --warmup W] [--work DIR]
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

import numpy as np

log = logging.getLogger("online_fastpath_quick")

THREAD_GROUPS = (  # thread name prefix -> group; the rest is "other" (torch's threads, aiohttp's executor)
    ("sparkgnn-serve-http", "http_loop"),
    ("sparkgnn-serve-intake", "zmq_intake"),
    ("sparkgnn-serve-parse", "parse"),
    ("sparkgnn-serve-dispatch", "dispatch"),  # the dispatch threads run the engine call themselves
    ("sparkgnn-serve-batcher", "dispatch"),
)


def build(work: str, nodes: int, edges: int, dim: int, out_dim: int, seed: int) -> dict:
    """Graph dir, model and PE store under `work` (reused when they are there already)."""
    paths = {
        "graph": os.path.join(work, "g"),
        "model": os.path.join(work, "model.pt"),
        "store": os.path.join(work, "store"),
    }
    if all(os.path.exists(p) for p in [*paths.values(), os.path.join(work, "deployment.json")]):
        return paths
    import torch
    import torch_geometric.nn as gnn

    from sparkgnn.datasets.synthetic import synthetic_graph
    from sparkgnn.graph import write_graph_dir
    from sparkgnn.models import Model
    from sparkgnn.pe.local import precompute_local

    os.makedirs(work, exist_ok=True)
    graph = synthetic_graph(nodes, edges, dim, seed=seed)
    torch.manual_seed(seed)
    model = Model.from_pyg(gnn.GraphSAGE(dim, 64, 2, out_channels=out_dim).eval())
    model.save(paths["model"])
    write_graph_dir(graph, paths["graph"])
    precompute_local(graph, model, paths["store"])
    with open(os.path.join(work, "deployment.json"), "w") as fh:
        json.dump({"nodes": nodes, "edges": edges, "dim": dim, "out_dim": out_dim, "seed": seed}, fh)
    return paths


def bodies(graph_dir: str, count: int, seed: int) -> list[bytes]:
    """`count` single-query HE request bodies: a new node with 1-8 edges both ways to random vertices."""
    from sparkgnn.graph import read_graph_dir

    graph = read_graph_dir(graph_dir)
    rng = np.random.default_rng(seed)
    base = int(graph.ids.max()) + 1
    out = []
    for i in range(count):
        neighbours = graph.ids[rng.choice(graph.num_nodes, size=int(rng.integers(1, 9)), replace=False)].tolist()
        x = graph.x[int(rng.integers(graph.num_nodes))].tolist()
        edges = [[n, base] for n in neighbours] + [[base, n] for n in neighbours]
        body = {"request_id": f"q{i}", "mode": "he", "nodes": [{"id": base, "x": x}], "edges": edges}
        out.append(json.dumps(body).encode())
    return out


def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's live threads, summed by THREAD_GROUPS."""
    import psutil

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for t in psutil.Process().threads():
        name = names.get(t.id, "")
        group = next((g for prefix, g in THREAD_GROUPS if name.startswith(prefix)), "other")
        out[group] = out.get(group, 0.0) + t.user_time + t.system_time
    return out


def client_main(url: str, path: str, clients: int) -> None:
    """The client process: POST every body of the file `path` (one JSON per line) over `clients`
    keep-alive connections; writes {"ok", "failed", "seconds"} on stdout (read by `send`)."""
    with open(path, "rb") as fh:
        lines = fh.read().splitlines()
    parts = urllib.parse.urlsplit(url)
    counts = {"ok": 0, "failed": 0}
    lock = threading.Lock()

    def run(mine: list[bytes]) -> None:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        for body in mine:
            conn.request("POST", "/v1/answer", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            with lock:
                counts["ok" if response.status == 200 else "failed"] += 1
        conn.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=run, args=(lines[i::clients],)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sys.stdout.write(json.dumps({**counts, "seconds": time.perf_counter() - started}) + "\n")


def zmq_client_main(endpoint: str, path: str, clients: int) -> None:
    """The client process over ZeroMQ: every body of the file `path` read into a Request and
    sent packed (Client, as the bench's load generator sends) over `clients` connections."""
    from sparkgnn.serving.online.bodies import decode_answer, request_of
    from sparkgnn.serving.online.client import Client

    with open(path, "rb") as fh:
        requests = [request_of(decode_answer(line)) for line in fh.read().splitlines()]
    counts = {"ok": 0, "failed": 0}
    lock = threading.Lock()

    def run(mine: list) -> None:
        with Client(endpoint, packed=True) as client:
            for request in mine:
                try:
                    client.answer(request, mode="he")
                    ok = True
                except Exception:  # noqa: BLE001 - counted as failed
                    ok = False
                with lock:
                    counts["ok" if ok else "failed"] += 1

    started = time.perf_counter()
    threads = [threading.Thread(target=run, args=(requests[i::clients],)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sys.stdout.write(json.dumps({**counts, "seconds": time.perf_counter() - started}) + "\n")


def send(url: str, payload: list[bytes], clients: int) -> dict:
    """Run the client process on `payload` (`url`: http://... or a ZeroMQ tcp:// endpoint); its summary."""
    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as fh:
        fh.write(b"\n".join(payload))
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--client", url, fh.name, "--clients", str(clients)],  # the scheme picks
            check=True,
            capture_output=True,
            text=True,
        )
    finally:
        os.unlink(fh.name)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> dict:
    from sparkgnn.serving.online.config import ServeConfig
    from sparkgnn.serving.online.server import Server

    work = args.work or tempfile.mkdtemp(prefix="fastpath_quick_")
    try:
        paths = build(work, args.nodes, args.edges, args.dim, args.out_dim, args.seed)
        with open(os.path.join(work, "deployment.json")) as fh:
            deployment = json.load(fh)  # what was built, maybe by an earlier run
        payload = bodies(paths["graph"], args.warmup + args.requests, args.seed)
        pools = [{"name": "main", "kind": "inprocess", "width": 1, "threads": 1}]
        lanes = {} if args.express_lanes is None else {"express_lanes": args.express_lanes}
        config = ServeConfig(**paths, mode="he", modes=["he"], pools=pools, **lanes)
        with Server(config) as server:
            url = server.http_url if args.front == "http" else server.zmq_endpoint
            warm = send(url, payload[: args.warmup], args.clients)
            if warm["failed"]:
                raise SystemExit(f"warm-up: {warm['failed']} requests failed")
            cpu0, threads0 = time.process_time(), thread_cpu()
            done = send(url, payload[args.warmup :], args.clients)
            cpu1, threads1 = time.process_time(), thread_cpu()
        if done["failed"]:
            raise SystemExit(f"{done['failed']} of {args.requests} requests failed")
        per = 1e3 / done["ok"]
        return {
            "requests": done["ok"],
            "front": args.front,
            "clients": args.clients,
            "deployment": deployment,
            "service_cpu_ms_per_request": round((cpu1 - cpu0) * per, 3),
            "thread_cpu_ms_per_request": {
                g: round((threads1.get(g, 0.0) - threads0.get(g, 0.0)) * per, 3) for g in sorted(threads1)
            },
            "wall_s": round(done["seconds"], 2),
            "requests_per_s": round(done["ok"] / done["seconds"], 1),
        }
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        parser = argparse.ArgumentParser()
        parser.add_argument("--client", nargs=2, metavar=("URL", "BODIES"))
        parser.add_argument("--clients", type=int, default=4)
        a = parser.parse_args()
        (client_main if a.client[0].startswith("http") else zmq_client_main)(a.client[0], a.client[1], a.clients)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2_000)
    parser.add_argument("--edges", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--out-dim", type=int, default=8, help="the width of each answer row (the model's output)")
    parser.add_argument("--requests", type=int, default=2_000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--express-lanes", type=int, default=None, help="ServeConfig.express_lanes (default: its own)")
    parser.add_argument(
        "--front", choices=["http", "zmq"], default="http", help="HTTP/JSON or ZeroMQ (packed) requests"
    )
    parser.add_argument("--work", default=None, help="keep the graph, model and store here (reused by a rerun)")
    args = parser.parse_args()
    for name in ("requests", "clients", "out_dim"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("sparkgnn").setLevel(logging.WARNING)
    log.info(json.dumps(run(args), indent=1))


if __name__ == "__main__":
    main()
