"""Freshness of a following service (not part of `make bench`): a seeded synthetic graph (20K
nodes / 200K edges / 32-d by default) and a 2-layer SAGE-mean store with states; a
`sparkgnn-refresh follow` process publishing every committed version, and in this process a
service with `follow_store` answering a one-vertex EXACT request in a loop. Update files of
--batch random edge inserts arrive every --period seconds; an update's freshness is the time from
its file's arrival to the first answer computed on a version that holds it (answers name their
version; a version's graph fingerprint gives the batches it holds, from the follower's checkpoint).
The follower coalesces what arrived into a batch and commits every --commit-every-s (0.5 s); the
service checks every --interval-s (0.1 s); `make bench-follow` runs it at 0.05 s / 0.02 s. Prints
freshness p50 / p99, the median of each phase of an update's way (`phases_p50_ms`: its batch
applied -- with the commit when one is due --, the wait to its publication, the service's check,
the swap, the first answer after it), the answers' latency, the follower's batch latency and
commit time, the swaps' time, how many loaded as deltas and why the others loaded whole, and the
cost of publishing one version at this size as a whole graph directory and as a delta
(pe/published.py). Runs in under a minute on 2 cores.

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
from collections import Counter

import numpy as np

from sparkgnn.pe.follow_checkpoint import read_checkpoint

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


def _published_times(root: str) -> dict[str, float]:
    """{graph fingerprint: when its publication was written} for the deltas still under `root`
    (the delta.json's modification time: written just before the folder is renamed in place)."""
    from sparkgnn.pe import published

    folder = os.path.join(published.published_dir(root), published.DELTAS_DIR)
    out = {}
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        meta = os.path.join(folder, name, published.DELTA_FILE)
        if not name.startswith(".") and os.path.exists(meta):
            out[json.load(open(meta))["graph_fingerprint"]] = os.path.getmtime(meta)
    return out


def _phases(checkpoint, arrivals, latency, published_at, swapped, holds, batch_of_fp) -> dict:
    """Median milliseconds of each phase of an update's way from its file's arrival to the first
    answer on a version holding it: its batch applied in memory (pick-up and refresh), its
    version committed and published (the wait for the commit interval and the commit), the
    service's check finding it (the check interval), the swap (front end and workers), the
    first answer after the switch; "slowest": the phases of the three slowest updates."""
    batches = checkpoint["batches"]
    done = {}  # batch number -> when it was applied (its oldest file's arrival + its latency)
    for k, (b, lat) in enumerate(zip(batches, latency, strict=False), start=1):
        times = [arrivals[n] for n in b["files"] if n in arrivals]
        if times:
            done[k] = min(times) + lat
    spans: dict[str, list[float]] = {k: [] for k in ("batch", "commit_publish", "check", "swap", "answer")}
    for k, b in enumerate(batches, start=1):
        swap = next(((s, e, fp) for s, e, fp in swapped if batch_of_fp.get(fp, 0) >= k), None)
        if k not in done or swap is None or swap[2] not in published_at:
            continue
        first = next((t for t, held in holds if t >= swap[1] and held >= k), None)
        version_fp = next(
            (v["graph_fingerprint"] for v in batches[k - 1 :] if v["graph_fingerprint"] in published_at), None
        )
        if first is None or version_fp is None:
            continue
        for name in b["files"]:
            if name in arrivals:
                spans["batch"].append(done[k] - arrivals[name])
                spans["commit_publish"].append(published_at[version_fp] - done[k])
                spans["check"].append(swap[0] - published_at[version_fp])
                spans["swap"].append(swap[1] - swap[0])
                spans["answer"].append(first - swap[1])
    out: dict = {k: round(1000 * float(np.median(v)), 1) if v else None for k, v in spans.items()}
    totals = [sum(values) for values in zip(*spans.values(), strict=True)]
    slowest = sorted(range(len(totals)), key=totals.__getitem__)[-3:]  # the tail, phase by phase
    out["slowest"] = [{k: round(1000 * v[i], 1) for k, v in spans.items()} for i in reversed(slowest)]
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
        answer_s: list[float] = []
        stop = threading.Event()
        arrivals: dict[str, float] = {}
        with Server(config) as server:

            def ask() -> None:
                with Client(server.zmq_endpoint) as client:
                    while not stop.is_set():
                        asked = time.time()
                        version = client.answer(probe, mode="exact").version
                        answers.append((time.time(), version))
                        answer_s.append(answers[-1][0] - asked)
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
                checkpoint = read_checkpoint(state)
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
            swap_entries = [e for e in server.swap_log if e.get("changed")]
            why_whole = Counter(  # why a worker loaded a version whole instead of patching it
                str(w.get("why_not_delta", "no held version"))[:80]
                for e in swap_entries
                for pool in (e.get("loaded") or {}).values()
                for w in pool.values()
                if w.get("how") != "delta"
            )
        follower.terminate()
        follower.wait(timeout=60)
        checkpoint = read_checkpoint(state)
        log_lines = open(os.path.join(work, "follower.log")).read().splitlines()
        latency = [
            float(x.split("latency ")[1].split("s")[0]) for x in log_lines if ": batch " in x and "latency " in x
        ]
        commit_s = [float(x.split(" in ")[-1].rstrip("s")) for x in log_lines if ": committed version " in x]
        published_at = _published_times(root)
        swapped = [(e["at"] - e["seconds"], e["at"], e["graph_fingerprint"]) for e in swap_entries]
        batch_of_fp = {b["graph_fingerprint"]: k for k, b in enumerate(checkpoint["batches"], start=1)}
        batch_of_file = {n: k for k, b in enumerate(checkpoint["batches"], start=1) for n in b["applied"]}
        holds = [(t, batch_of_fp.get(versions[v], 0)) for t, v in answers]  # (answer time, batches it holds)
        fresh = []
        for name, arrived in arrivals.items():
            first = next((t for t, k in holds if t >= arrived and k >= batch_of_file.get(name, 1 << 30)), None)
            if first is not None:
                fresh.append(first - arrived)
        phases = _phases(checkpoint, arrivals, latency, published_at, swapped, holds, batch_of_fp)
        out = {
            "edges": graph.num_edges,
            "batch_edges": args.batch,
            "updates": args.updates,
            "answered": len(fresh),
            "freshness_p50_ms": round(1000 * float(np.percentile(fresh, 50)), 1) if fresh else None,
            "freshness_p99_ms": round(1000 * float(np.percentile(fresh, 99)), 1) if fresh else None,
            "swaps": len(loads),
            "delta_swaps": loads.count("delta"),
            "whole_loads_why": dict(why_whole),
            "swap_p50_s": round(float(np.percentile(swap_s, 50)), 3) if swap_s else None,
            "follower_batch_latency_p50_s": round(float(np.percentile(latency, 50)), 3) if latency else None,
            "follower_commit_p50_s": round(float(np.percentile(commit_s, 50)), 3) if commit_s else None,
            "phases_p50_ms": phases,
            "answer_ms": [round(1000 * float(np.percentile(answer_s, q)), 1) for q in (50, 99, 100)],
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
