"""Freshness of a following service (not part of `make bench`): a seeded synthetic graph (20K
nodes / 200K edges / 32-d by default) and a 2-layer SAGE-mean store with states; a
`sparkgnn-refresh follow` process publishing every committed version, and in this process a
service with `follow_store` answering a one-vertex EXACT request in a loop. Update files of
--batch random edge inserts arrive every --period seconds; an update's freshness is the time from
its file's arrival to the first answer computed on a version that holds it (answers name their
version; a version's graph fingerprint gives the batches it holds, from the follower's checkpoint).
The follower coalesces what arrived into a batch and commits every --commit-every-s (0.5 s); the
service checks every --interval-s (0.1 s). Prints freshness p50 / p99, the follower's batch
latency, the swaps' time and how many loaded as deltas, and the cost of publishing one version at
this size as a whole graph directory and as a delta (pe/published.py). Runs in under a minute on 2 cores.

    .venv/bin/python bench/bench_follow_fresh.py [--nodes N --edges E --dim F --batch B --period S
                                                  --updates U --commit-every-s S --interval-s S]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

log = logging.getLogger("bench_follow_fresh")


def _model(dim: int):
    import torch
    import torch_geometric.nn as gnn

    from sparkgnn import Model

    torch.manual_seed(0)
    return Model.from_pyg(gnn.GraphSAGE(dim, 64, 2, out_channels=16))


def publish_cost(graph, work: str, versions: int = 3) -> tuple[list[float], list[float]]:
    """Seconds to publish each of `versions` successive graphs (one edge more each) of this size:
    as full graph directories, and as deltas over the one before (pe/published.py)."""
    from sparkgnn.graph.updates import GraphUpdate, apply
    from sparkgnn.pe import published
    from sparkgnn.pe.follow_state import RunningFingerprint

    out: tuple[list[float], list[float]] = ([], [])
    for kind, seconds in zip(("full", "delta"), out, strict=True):
        root, running = os.path.join(work, f"publish_{kind}"), RunningFingerprint.of(graph)
        published.publish(root, graph, store_base="-")
        for i in range(versions):
            update = GraphUpdate(edge_insert_src=graph.ids[[i]], edge_insert_dst=graph.ids[[i + 1]])
            path = update.write(os.path.join(work, f"publish_{kind}_{i}.parquet"))
            before, base = (running.vertex_sum, running.edge_sum), running.graph.fingerprint
            running = running.advance(apply(update, running.graph))
            delta = published.Delta(base, before, (running.vertex_sum, running.edge_sum), (path,))
            started = time.perf_counter()
            published.publish(root, running.graph, store_base="-", delta=delta if kind == "delta" else None)
            seconds.append(time.perf_counter() - started)
        shutil.rmtree(root, ignore_errors=True)
    return out


def run(args) -> dict:
    from sparkgnn.datasets.synthetic import synthetic_graph
    from sparkgnn.graph import write_graph_dir
    from sparkgnn.graph.updates import GraphUpdate
    from sparkgnn.pe import published
    from sparkgnn.pe.local import precompute_local
    from sparkgnn.serving.online.client import Client
    from sparkgnn.serving.online.config import ServeConfig
    from sparkgnn.serving.online.server import Server
    from sparkgnn.serving.request import Request

    graph = synthetic_graph(args.nodes, args.edges, args.dim, seed=0)
    model = _model(args.dim)
    work = tempfile.mkdtemp(prefix="follow_fresh_")
    try:
        cost, delta_cost = publish_cost(graph, work)
        log.info(
            f"publishing one version's graph ({graph.num_edges} edges): whole {[round(s, 3) for s in cost]} s, "
            f"as a delta {[round(s, 4) for s in delta_cost]} s"
        )
        g0, root, inbox, state = (os.path.join(work, n) for n in ("g0", "store", "in", "state"))
        model_path = os.path.join(work, "model.pt")
        os.makedirs(inbox)
        write_graph_dir(graph, g0)
        model.save(model_path)
        precompute_local(graph, model, root)
        follower = subprocess.Popen(
            [sys.executable, "-m", "sparkgnn.pe.refresh_cli", "follow", "--graph", g0, "--model", model_path,
             "--store", root, "--updates", inbox, "--state", state, "--max-latency-s", "0.01",
             "--poll-s", "0.01", "--commit-every-s", str(args.commit_every_s)],
            stdout=open(os.path.join(work, "follower.log"), "w"),  # noqa: SIM115 - closed with the process
        )  # fmt: skip
        config = ServeConfig(
            graph=g0,
            model=model_path,
            store=root,
            mode="exact",
            modes=["exact"],
            http=None,
            follow_store=True,
            follow_interval_s=args.interval_s,
        )
        rng = np.random.default_rng(1)
        qid = int(graph.ids.max()) + 1
        probe = Request(
            "probe", np.array([qid]), rng.standard_normal((1, graph.feature_dim)).astype(np.float32),
            graph.ids[:4], np.full(4, qid),
        )  # fmt: skip
        answers: list[tuple[float, int]] = []
        stop = threading.Event()
        arrivals: dict[str, float] = {}
        with Server(config) as server:

            def ask() -> None:
                with Client(server.zmq_endpoint) as client:
                    while not stop.is_set():
                        answers.append((time.time(), client.answer(probe, mode="exact").version))
                        time.sleep(0.005)

            asking = threading.Thread(target=ask, daemon=True)
            asking.start()
            started = time.monotonic()
            while published.latest(root) is None:  # the follower publishes the version it starts from
                if follower.poll() is not None or time.monotonic() - started > 120:
                    raise RuntimeError("the follower did not start")
                time.sleep(0.05)
            for i in range(args.updates):
                update = GraphUpdate(
                    edge_insert_src=rng.choice(graph.ids, args.batch), edge_insert_dst=rng.choice(graph.ids, args.batch)
                )
                name = f"u{i:05d}.parquet"
                staged = os.path.join(work, name)
                update.write(staged)
                arrivals[name] = time.time()
                os.replace(staged, os.path.join(inbox, name))  # arrives whole
                time.sleep(args.period)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # until the last update is answered
                time.sleep(0.2)
                checkpoint = json.load(open(os.path.join(state, "checkpoint.json")))
                done = {n for b in checkpoint["batches"][: checkpoint["committed"]] for n in b["applied"]}
                fp = server.versions.current.graph_fingerprint
                if len(done) == args.updates and fp == checkpoint["batches"][-1]["graph_fingerprint"]:
                    time.sleep(0.1)
                    break
            stop.set()
            asking.join(timeout=10)
            versions = {1: graph.fingerprint}
            versions.update({e["version"]: e["graph_fingerprint"] for e in server.swap_log if e.get("changed")})
            loads = [e.get("load") for e in server.swap_log if e.get("changed")]
            swap_s = [e["seconds"] for e in server.swap_log if e.get("changed")]
        follower.terminate()
        follower.wait(timeout=60)
        checkpoint = json.load(open(os.path.join(state, "checkpoint.json")))
        log_lines = open(os.path.join(work, "follower.log")).read().splitlines()
        latency = [
            float(x.split("latency ")[1].split("s")[0]) for x in log_lines if ": batch " in x and "latency " in x
        ]
        batch_of_fp = {b["graph_fingerprint"]: k for k, b in enumerate(checkpoint["batches"], start=1)}
        batch_of_file = {n: k for k, b in enumerate(checkpoint["batches"], start=1) for n in b["applied"]}
        holds = [(t, batch_of_fp.get(versions[v], 0)) for t, v in answers]  # (answer time, batches it holds)
        fresh = []
        for name, arrived in arrivals.items():
            first = next((t for t, k in holds if t >= arrived and k >= batch_of_file.get(name, 1 << 30)), None)
            if first is not None:
                fresh.append(first - arrived)
        out = {
            "edges": graph.num_edges,
            "batch_edges": args.batch,
            "updates": args.updates,
            "answered": len(fresh),
            "freshness_p50_ms": round(1000 * float(np.percentile(fresh, 50)), 1) if fresh else None,
            "freshness_p99_ms": round(1000 * float(np.percentile(fresh, 99)), 1) if fresh else None,
            "swaps": len(loads),
            "delta_swaps": loads.count("delta"),
            "swap_p50_s": round(float(np.percentile(swap_s, 50)), 3) if swap_s else None,
            "follower_batch_latency_p50_s": round(float(np.percentile(latency, 50)), 3) if latency else None,
            "publish_s": [round(s, 3) for s in cost],
            "publish_delta_s": [round(s, 4) for s in delta_cost],
            "commit_every_s": args.commit_every_s,
            "interval_s": args.interval_s,
        }
        for line in log_lines[:: max(1, len(log_lines) // 8)]:
            log.debug(line)
        print(json.dumps(out))
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=20_000)
    parser.add_argument("--edges", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--batch", type=int, default=100, help="edge inserts per update file")
    parser.add_argument("--period", type=float, default=0.25, help="seconds between update files")
    parser.add_argument("--updates", type=int, default=40, help="update files sent")
    parser.add_argument("--commit-every-s", type=float, default=0.5, help="the follower's version interval")
    parser.add_argument("--interval-s", type=float, default=0.1, help="the service's follow_interval_s")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if os.environ.get("BENCH_DEBUG") else logging.INFO, format="%(message)s")
    logging.getLogger("sparkgnn").setLevel(logging.WARNING)
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
