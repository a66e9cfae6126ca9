"""Online serving benchmark (make bench-online): the long-running service of
sparkgnn.serving.online (Server, its GSM schedulers, worker pools, hot cache and Quiver's PSGS
router) under open-loop load from a separate load-generator process (bench/online_load.py).

Deployment (built once, cached under data/bench/online/ keyed by its parameters): a seeded
power-law synthetic graph (sparkgnn.datasets.synthetic_graph, zipf 1.0, symmetrised: 100K vertices
and 1.09M directed edges by default, 10K / 100K with --quick), a 2-layer GraphSAGE (mean) and a 2-layer GCN with
seeded random weights (PyG modules through Model.from_pyg), and each one's PE store with states and
Quiver's workload metrics (sparkgnn.pe.local.precompute_local, metrics=True: the "fap" cache policy
and the PSGS router read them).

Requests: new query nodes (ids above G's) with features copied from random G vertices, attached to
G by edges in BOTH directions to a few G vertices each (1 + Zipf(2) of them, at most 32); a third of
the queries pick their neighbours in proportion to in-degree + 1 (hubs), the rest uniformly, so the
in-degree sum a request brings (the scheduler's cost) varies by orders of magnitude between
requests. Pools: "single" (one query per request), "mixed" (1, 4, 16 or 64 queries per request),
"big" (one request of 1024 queries).

Measurements (each point a short open-loop run; module doc of online_load.py for how latency is
taken: from the scheduled send time, so the generator's lateness is included):
  1 capacity  single-query HE: offered rate stepped up until a run is not held (`held`), then
              bisected; mixed requests in --sched-mode likewise under FIFO; then FIFO vs degree
              vs degree + divider (T_s > 0) at --sched-load x that capacity, Poisson and bursty.
              --sched-mode defaults to FULL: GSM's exact inference recomputes each request's
              neighbourhood, which is what FULL does here, and its service time follows the
              in-degree sum the scheduler sorts by; sparkgnn's EXACT merges into stored states, so
              its cost hardly depends on in-degree (capacity.cost_model has the correlations)
  2           max over requests of queue time / service time under the degree scheduler
  3           single-query HE p99 vs offered load; the highest load held with p99 <= 20 ms
  4           EXACT vs HE latency for one request of 1024 queries, SAGE and GCN; the highest
              single-query EXACT load held with p99 <= 50 ms
  5           "workers" pool of width 1 vs 2 (1 torch thread each): capacity ratio
  6           hot cache off / degree / fap at --cache-fraction of the store's bytes: hit rates
  7           PSGS router over an inprocess pool (width 1) and a workers pool (width 2) vs each
              alone; and a probe of a "workers" pool after idle gaps, which stalls (see WHAT)
Writes bench/results/online.json (every key described under "what"), online_latency.png and
online_schedulers.png. No Spark is started. Timings on a shared 2-core box are noisy: the load
average at start and end is recorded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import DATA, RESULTS, ROOT, machine, write_result  # noqa: E402
from serving_models import load_average  # noqa: E402

ONLINE_DATA = os.path.join(DATA, "online")
LOAD_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "online_load.py")
KINDS = ("sage", "gcn")
MIX_SIZES = (1, 4, 16, 64)
MIX_PROBS = (0.55, 0.25, 0.15, 0.05)
BIG_B = 1024
HE_SLO_MS = 20.0
EXACT_SLO_MS = 50.0
HUB_FRACTION = 1 / 3
MAX_NEIGHBOURS = 32
# dealer timeout of the bench's "workers" pools (ServeConfig pool spec timeout_s; the default is 60 s):
# a dealer idle longer than the messenger's liveness pays two timeouts on its next call
# (worker_pool_idle_probe), so a short timeout keeps such a stall visible but short
WORKER_TIMEOUT_S = 5.0

FULL = {
    "nodes": 100_000,
    "edges": 600_000,  # generated; symmetrised to 1.09M directed edges
    "dim": 128,
    "duration": 6.0,
    "max_points": 8,
    "refine": 2,
    "pool_requests": 2000,
    "calibrate": 40,
    "big_repeats": 5,
    "sched_repeats": 2,
}
QUICK = {
    "nodes": 10_000,
    "edges": 57_000,  # symmetrised to 100K directed edges
    "dim": 128,
    "duration": 2.0,
    "max_points": 6,
    "refine": 1,
    "pool_requests": 500,
    "calibrate": 15,
    "big_repeats": 3,
    "sched_repeats": 1,
}


def log(line: str) -> None:
    print(line, flush=True)


# -- deployment ------------------------------------------------------------------------------------
def _pyg_model(kind: str, dim: int, hidden: int, classes: int, seed: int):
    import torch
    from torch_geometric.nn import GCN, GraphSAGE

    torch.manual_seed(seed)
    cls = {"sage": GraphSAGE, "gcn": GCN}[kind]
    return cls(dim, hidden, num_layers=2, out_channels=classes).eval()


def build_deployment(s: dict) -> dict:
    """Graph dir + models + PE stores (states, workload metrics), cached by their parameters."""
    from sparkgnn.datasets import synthetic_graph
    from sparkgnn.datasets.edges import symmetrise
    from sparkgnn.graph import GraphData, write_graph_dir
    from sparkgnn.models import Model
    from sparkgnn.pe.local import precompute_local

    key_doc = {
        "nodes": s["nodes"],
        "edges": s["edges"],
        "dim": s["dim"],
        "classes": 8,
        "hidden": 64,
        "zipf_alpha": s["zipf"],
        "seed": s["seed"],
        "symmetrised": True,
        "kinds": list(KINDS),
        "metrics": True,
        "version": 1,
    }
    key = hashlib.sha1(json.dumps(key_doc, sort_keys=True).encode()).hexdigest()[:12]
    root = os.path.join(ONLINE_DATA, f"dep-{s['nodes']}-{s['edges']}-{key}")
    marker = os.path.join(root, "deployment.json")
    if os.path.exists(marker):
        with open(marker) as fh:
            doc = json.load(fh)
        doc["cached"] = True
        log(f"deployment from cache {root} (built in {doc['build_seconds']:.0f} s)")
        return doc
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    started = time.perf_counter()
    d = synthetic_graph(s["nodes"], s["edges"], s["dim"], num_classes=8, seed=s["seed"], zipf_alpha=s["zipf"])
    src, dst = symmetrise(d.edge_src, d.edge_dst)
    G = GraphData(d.ids, d.x, src, dst, y=d.y, split=d.split, name="online-synthetic")
    write_graph_dir(G, os.path.join(root, "graph"))
    graph_seconds = time.perf_counter() - started
    log(f"graph: {G.num_nodes} vertices, {G.num_edges} directed edges in {graph_seconds:.1f} s")
    doc = {
        "root": root,
        "key": key_doc,
        "graph": os.path.join(root, "graph"),
        "num_vertices": G.num_nodes,
        "num_edges": G.num_edges,
        "max_in_degree": int(G.in_degree().max()),
        "mean_in_degree": float(G.in_degree().mean()),
        "graph_seconds": graph_seconds,
        "models": {},
    }
    for i, kind in enumerate(KINDS):
        model = Model.from_pyg(_pyg_model(kind, s["dim"], 64, 8, s["seed"] + i))
        path = os.path.join(root, f"{kind}.pt")
        model.save(path)
        t0 = time.perf_counter()
        store_dir = os.path.join(root, f"store_{kind}")
        precompute_local(G, model, store_dir, states=True, metrics=True, log=None)
        seconds = time.perf_counter() - t0
        log(f"{kind}: PE store with states + metrics in {seconds:.1f} s")
        doc["models"][kind] = {"model": path, "store": store_dir, "precompute_seconds": seconds}
    doc["build_seconds"] = time.perf_counter() - started
    doc["cached"] = False
    with open(marker, "w") as fh:
        json.dump(doc, fh, indent=2)
    return doc


# -- request pools ---------------------------------------------------------------------------------
def make_requests(G, n: int, sizes, probs, seed: int) -> list:
    """`n` requests (module doc): B from `sizes` with `probs`, each query with 1 + Zipf(2) (<= 32)
    G neighbours, edges both ways; a HUB_FRACTION of the queries choose by in-degree + 1."""
    from sparkgnn.serving.request import Request

    rng = np.random.default_rng([seed, 11])
    N = G.num_nodes
    w = G.in_degree().astype(np.float64) + 1.0
    cdf = np.cumsum(w) / w.sum()
    base = int(G.ids.max()) + 1
    out = []
    for r in range(n):
        b = int(rng.choice(sizes, p=probs))
        q = np.arange(base, base + b, dtype=np.int64)
        x = G.x[rng.integers(N, size=b)]
        k = np.minimum(rng.zipf(2.0, size=b), MAX_NEIGHBOURS)
        owner = np.repeat(np.arange(b), k)
        hub = (rng.random(b) < HUB_FRACTION)[owner]
        nb = np.where(
            hub, np.minimum(np.searchsorted(cdf, rng.random(len(owner))), N - 1), rng.integers(N, size=len(owner))
        )
        pair = np.unique(owner.astype(np.int64) * N + nb)
        owner, nb = pair // N, pair % N
        src = np.concatenate([G.ids[nb], q[owner]])
        dst = np.concatenate([q[owner], G.ids[nb]])
        out.append(Request(f"r{r}", q, x, src, dst))
    return out


def write_pool(path: str, requests: list) -> str:
    q_off = np.cumsum([0] + [r.batch_size for r in requests])
    e_off = np.cumsum([0] + [len(r.src) for r in requests])
    np.savez(
        path,
        qid=np.concatenate([r.qid for r in requests]),
        x=np.concatenate([r.x for r in requests]).astype(np.float32),
        src=np.concatenate([r.src for r in requests]),
        dst=np.concatenate([r.dst for r in requests]),
        q_off=q_off,
        e_off=e_off,
    )
    return path


def pool_facts(dep: dict, kind: str, requests: list) -> dict:
    """What the front end predicts for each request (GraphFacts): cost (in-degree sum), largest
    layer-subgraph estimate, PSGS."""
    from sparkgnn.models import Model
    from sparkgnn.pe.layout import read_manifest
    from sparkgnn.pe.store import PEStore
    from sparkgnn.serving.online.costs import GraphFacts

    m = dep["models"][kind]
    store = PEStore(m["store"], read_manifest(m["store"]) or {})
    facts = GraphFacts.load(dep["graph"], store, Model.load(m["model"]).num_layers)
    cost, hop, psgs = [], [], []
    for r in requests:
        p, ps = facts.pending(r, None, "x", 0.0)
        cost.append(p.cost)
        hop.append(max(p.hop_sizes))
        psgs.append(ps)
    return {"cost": np.array(cost), "hop": np.array(hop), "psgs": np.array(psgs)}


def describe(values: np.ndarray) -> dict:
    return {
        "mean": float(values.mean()),
        "p50": float(np.percentile(values, 50)),
        "p90": float(np.percentile(values, 90)),
        "p99": float(np.percentile(values, 99)),
        "max": float(values.max()),
        "cv": float(values.std() / values.mean()) if values.mean() else 0.0,
    }


# -- load generator and server plumbing ------------------------------------------------------------
class LoadGen:
    """One online_load.py --serve process for the whole bench (module doc there)."""

    def __init__(self, work: str):
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.work = work
        self.count = 0
        self.proc = subprocess.Popen(
            [sys.executable, LOAD_SCRIPT, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        line = self.proc.stdout.readline().strip()  # type: ignore[union-attr]
        if line != "ready":
            raise RuntimeError(f"load generator did not start: {line!r}")

    def run(self, job: dict) -> dict:
        self.count += 1
        job = dict(job, out=os.path.join(self.work, f"run{self.count:04d}.json"))
        self.proc.stdin.write(json.dumps(job) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        line = self.proc.stdout.readline().strip()  # type: ignore[union-attr]
        if not line.startswith("done "):
            raise RuntimeError(f"load generator: {line or 'exited'}")
        with open(line[5:]) as fh:
            return json.load(fh)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def server_config(dep: dict, kind: str, mode: str, **options):
    from sparkgnn.serving.online.server import ServeConfig

    m = dep["models"][kind]
    options.setdefault("pools", [{"name": "main", "kind": "inprocess", "width": 1, "threads": 1}])
    return ServeConfig(
        graph=dep["graph"],
        model=m["model"],
        store=m["store"],
        mode=mode,
        modes=["he", "exact", "full"],
        http=None,
        **options,
    )


def wait_idle(srv, timeout_s: float = 120.0) -> bool:
    """Until every request the server took was answered (a backlog must not leak into the next
    point)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = srv.stats
        if s["answered"] + s["errors"] + s["busy"] >= s["requests"] and len(srv.scheduler) == 0:
            return True
        time.sleep(0.05)
    return False


def summarise(res: dict, srv=None, log_start: int = 0) -> dict:
    """A run's numbers: latency from the scheduled send time over the answered requests."""
    n = res["n"]
    status = np.array(res["status"])
    ok = status == "ok"

    def arr(key):
        return np.array([np.nan if v is None else v for v in res[key]], np.float64)

    sched, recv = arr("scheduled"), arr("received")
    lat = (recv - sched)[ok] * 1e3
    qms, sms = arr("queue_ms")[ok], arr("service_ms")[ok]
    duration = float(res["job"].get("duration", 0.0)) or (float(np.nanmax(recv)) if n else 0.0)
    n_ok = int(ok.sum())
    span = max(float(np.nanmax(recv[ok])) if n_ok else 0.0, duration)
    out = {
        "offered_rps": n / duration if duration else 0.0,
        "rate": float(res["job"].get("rate", 0.0)),
        "requests": n,
        "ok": n_ok,
        "busy": int((status == "busy").sum()),
        "errors": int((status == "error").sum()),
        "lost": int((status == "lost").sum()),
        "achieved_rps": n_ok / span if span else 0.0,
        "queries_per_request": float(np.mean(res["queries"])) if n else 0.0,
    }
    out["keep_up"] = out["achieved_rps"] / out["offered_rps"] if out["offered_rps"] else 0.0
    if n_ok:
        out.update(
            latency_mean_ms=float(lat.mean()),
            latency_p50_ms=float(np.percentile(lat, 50)),
            latency_p90_ms=float(np.percentile(lat, 90)),
            latency_p99_ms=float(np.percentile(lat, 99)),
            latency_max_ms=float(lat.max()),
            queue_mean_ms=float(qms.mean()),
            queue_p99_ms=float(np.percentile(qms, 99)),
            service_mean_ms=float(sms.mean()),
            batch_requests_mean=float(np.mean(np.array(res["batch_requests"])[ok])),
            batch_requests_max=int(np.max(np.array(res["batch_requests"])[ok])),
        )
    for key in ("send_lateness_ms_p50", "send_lateness_ms_p99", "send_lateness_ms_max"):
        if key in res:
            out[key] = res[key]
    if res.get("errors"):
        out["error_messages"] = dict(list(res["errors"].items())[:3])
    if srv is not None:
        batches = srv.batch_log[log_start:]
        out["batches"] = len(batches)
        out["batch_seconds_max"] = max((b["seconds"] for b in batches), default=0.0)
        pools: dict = {}
        for b in batches:
            pools[b["pool"]] = pools.get(b["pool"], 0) + 1
        out["batches_per_pool"] = pools
    return out


def _cpu_seconds(pid: int) -> float | None:
    """utime + stime of a live process (/proc), None when it is gone or /proc is not there."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def process_groups(srv, lg) -> dict:
    """pid lists by role: the bench process (front end + inprocess pools), the load generator,
    the workers and brokers of "workers" pools."""
    groups: dict = {"front_end": [os.getpid()], "generator": [lg.proc.pid], "workers": [], "brokers": []}
    for pool in srv.pools:
        cluster = getattr(pool, "cluster", None)
        if cluster is not None:
            groups["workers"] += [w.pid for w in cluster.workers]
            groups["brokers"] += [cluster.broker.pid] if cluster.broker is not None else []
    return groups


def cpu_snapshot(groups: dict) -> tuple:
    return time.perf_counter(), {k: [_cpu_seconds(pid) for pid in pids] for k, pids in groups.items()}


def cpu_utilisation(before: tuple, after: tuple) -> dict:
    """Cores used per role between two snapshots (CPU seconds / wall seconds)."""
    wall = after[0] - before[0]
    out = {}
    for key, values in after[1].items():
        pairs = [(a, b) for a, b in zip(before[1][key], values, strict=True) if a is not None and b is not None]
        if pairs:
            out[key] = sum(b - a for a, b in pairs) / wall if wall > 0 else 0.0
    return out


def merge_results(results: list) -> dict:
    """Several generator runs as one (columns concatenated, durations added): statistics over
    all their requests."""
    if len(results) == 1:
        return results[0]
    out = dict(results[0])
    out["job"] = dict(results[0]["job"], duration=sum(float(r["job"]["duration"]) for r in results))
    out["n"] = sum(r["n"] for r in results)
    for key in ("pick", "queries", "scheduled", "sent", "received", "status", "queue_ms", "service_ms"):
        out[key] = [v for r in results for v in r[key]]
    for key in ("batch_requests", "pool"):
        out[key] = [v for r in results for v in r[key]]
    for key in ("send_lateness_ms_p50", "send_lateness_ms_p99", "send_lateness_ms_max"):
        out[key] = max(r.get(key, 0.0) for r in results)
    errors: dict = {}
    for r in results:
        for k, v in (r.get("errors") or {}).items():
            errors[k] = errors.get(k, 0) + v
    out["errors"] = errors
    return out


def held(point: dict, p99_bound_ms: float) -> bool:
    """A load is held when every request was answered ok, the answers kept up with the offer
    (achieved >= 0.9 x offered) and p99 stayed under the bound."""
    return (
        point["ok"] == point["requests"]
        and point["requests"] > 0
        and point["keep_up"] >= 0.9
        and point.get("latency_p99_ms", float("inf")) <= p99_bound_ms
    )


class Bench:
    def __init__(self, s: dict, lg: LoadGen, pools: dict):
        self.s, self.lg, self.pools = s, lg, pools
        self.seed = 0
        self.cost_model: dict = {}
        self.calibrated: dict = {}

    def point(self, srv, pool: str, mode: str, rate: float, process: str = "poisson", seed: int | None = None):
        """One open-loop run against `srv`: (summary, the generator's raw records)."""
        if not wait_idle(srv):
            log("  warning: the service still had requests in flight after 120 s; this point starts with a backlog")
        start = len(srv.batch_log)
        self.seed += 1
        job = {
            "endpoint": srv.zmq_endpoint,
            "pool": self.pools[pool],
            "rate": float(rate),
            "duration": self.s["duration"],
            "process": process,
            "seed": self.seed if seed is None else seed,
            "mode": mode,
            "drain_s": max(3.0, self.s["duration"]),
        }
        groups = process_groups(srv, self.lg)
        before = cpu_snapshot(groups)
        res = self.lg.run(job)
        after = cpu_snapshot(groups)
        wait_idle(srv)
        point = summarise(res, srv, start)
        point["process"] = process
        point["cpu_cores"] = cpu_utilisation(before, after)
        return point, res

    def closed(self, srv, pool: str, mode: str, n: int, index: int | None = None) -> dict:
        wait_idle(srv)
        job = {"endpoint": srv.zmq_endpoint, "pool": self.pools[pool], "mode": mode, "closed": True, "n": n}
        if index is not None:
            job["index"] = index
        res = self.lg.run(job)
        ok = np.array(res["status"]) == "ok"
        lat = (np.array(res["received"], dtype=np.float64) - np.array(res["scheduled"], np.float64))[ok] * 1e3
        sms = np.array(res["service_ms"], np.float64)[ok]
        return {
            "requests": n,
            "ok": int(ok.sum()),
            "pick": [int(k) for k in np.array(res["pick"])[ok]],
            "service_ms": [float(v) for v in sms],
            "latency_ms": [float(v) for v in lat],
            "latency_median_ms": float(np.median(lat)) if ok.any() else None,
            "service_median_ms": float(np.median(sms)) if ok.any() else None,
            "service_mean_ms": float(np.mean(sms)) if ok.any() else None,
        }

    def calibrate(self, srv, pool: str, mode: str, cost: np.ndarray | None = None) -> float:
        """Requests/s one slot would serve back to back (1000 / mean service ms, closed loop);
        with `cost` (the pool's predicted costs) also records how well cost predicts service time."""
        self.closed(srv, pool, mode, 2)  # warm-up
        c = self.closed(srv, pool, mode, self.s["calibrate"])
        rps = 1000.0 / max(c["service_mean_ms"] or 1.0, 0.05)
        self.calibrated[f"{pool}/{mode}"] = rps
        if cost is not None and c["ok"] > 2:
            x, y = cost[np.array(c["pick"])], np.array(c["service_ms"])
            self.cost_model[f"{pool}/{mode}"] = {
                "requests": c["ok"],
                "service_mean_ms": c["service_mean_ms"],
                "service_median_ms": c["service_median_ms"],
                "service_max_ms": float(y.max()),
                "corr_cost_service": float(np.corrcoef(x, y)[0, 1]) if x.std() > 0 and y.std() > 0 else None,
                "corr_log_cost_service": float(np.corrcoef(np.log1p(x), y)[0, 1])
                if x.std() > 0 and y.std() > 0
                else None,
            }
        return rps

    def sweep(
        self,
        srv,
        pool: str,
        mode: str,
        start: float,
        label: str,
        factor: float = 1.5,
        slo_ms: float | None = None,
    ) -> dict:
        """Step the rate by `factor` from `start` until a point is not held (`held`, p99 bound 5 x
        the first point's p99, at least 50 ms), then bisect (geometric mean) `refine` times between
        the last held and the first failed rate. With `slo_ms`, also bisect `refine` times at the
        boundary of p99 <= slo_ms (stepping below the first point when even that one missed it)."""
        points: list = []
        bound: float | None = None

        def run(rate: float, tag: str = "") -> bool:
            nonlocal bound
            p, _ = self.point(srv, pool, mode, rate)
            if bound is None:
                bound = max(50.0, 5.0 * p.get("latency_p99_ms", 10.0))
            points.append(p)
            ok = held(p, bound)
            log(
                f"  {label}{tag}: {rate:8.1f} req/s -> p50 {p.get('latency_p50_ms', float('nan')):7.1f} ms, p99 "
                f"{p.get('latency_p99_ms', float('nan')):7.1f} ms, keep-up {p['keep_up']:.2f}, busy {p['busy']}, "
                f"lost {p['lost']}, batch {p.get('batch_requests_mean', 0):.1f}, late p99 "
                f"{p.get('send_lateness_ms_p99', 0):.1f} ms, cores "
                + " ".join(f"{k[:3]} {v:.2f}" for k, v in p["cpu_cores"].items())
                + f" {'held' if ok else 'NOT held'}"
            )
            return ok

        def boundary(ok_of) -> tuple:
            good = [p["rate"] for p in points if ok_of(p)]
            lo = max(good) if good else None
            hi = min([p["rate"] for p in points if not ok_of(p) and (lo is None or p["rate"] > lo)], default=None)
            return lo, hi

        rate = start
        while len(points) < self.s["max_points"]:
            if run(rate):
                rate *= factor
                continue
            if len(points) == 1 and rate > 1.0:  # started above capacity: step down, new bound
                bound = None
                points.clear()
                rate /= factor * factor
                continue
            break
        for _ in range(self.s["refine"]):
            lo, hi = boundary(lambda p: held(p, bound))
            if lo is None or hi is None:
                break
            run((lo * hi) ** 0.5, " (refine)")
        if slo_ms is not None:
            if not any(held(p, slo_ms) for p in points):
                for _ in range(2):
                    run(min(p["rate"] for p in points) / (factor * factor), f" (below, for {slo_ms:g} ms)")
                    if any(held(p, slo_ms) for p in points):
                        break
            for _ in range(self.s["refine"]):
                lo, hi = boundary(lambda p: held(p, slo_ms))
                if lo is None or hi is None:
                    break
                run((lo * hi) ** 0.5, f" (refine {slo_ms:g} ms)")
        points.sort(key=lambda p: p["rate"])
        for p in points:
            p["held"] = held(p, bound)
        lo, hi = boundary(lambda p: held(p, bound))
        return {
            "points": points,
            "p99_bound_ms": bound,
            "capacity_rps": lo,
            "first_failed_rps": hi,
            "saturation_achieved_rps": max(p["achieved_rps"] for p in points),
        }


def slo_rate(curve: dict, slo_ms: float):
    """Highest offered rate of a sweep that was held with p99 <= slo_ms (and its p99)."""
    good = [p for p in curve["points"] if held(p, slo_ms)]
    if not good:
        return None, None
    best = max(good, key=lambda p: p["rate"])
    return best["rate"], best["latency_p99_ms"]


# -- experiments -----------------------------------------------------------------------------------
def experiment_capacity_and_schedulers(b: Bench, dep, s, facts_mixed) -> dict:
    from sparkgnn.serving.online.server import Server

    out: dict = {}
    log("[1] single-query HE capacity and p99 curve (inprocess pool, degree scheduler)")
    with Server(server_config(dep, "sage", "he")) as srv:
        est = b.calibrate(srv, "single", "he")
        curve = b.sweep(srv, "single", "he", max(5.0, 0.2 * est), "HE single", factor=1.6, slo_ms=HE_SLO_MS)
        curve["calibrated_rps_one_at_a_time"] = est
        out["he_single"] = curve
        mode = s["sched_mode"]
        log(f"[1] mixed-size {mode.upper()} capacity under FIFO, then schedulers at {s['sched_load']:.0%} of it")
    with Server(server_config(dep, "sage", mode, scheduler="fifo")) as srv:
        for other in ("he", "exact", "full"):  # which mode's service time follows the predicted cost?
            if other != mode:
                b.calibrate(srv, "mixed", other, facts_mixed["cost"])
        est = b.calibrate(srv, "mixed", mode, facts_mixed["cost"])
        mixed = b.sweep(srv, "mixed", mode, max(2.0, 0.4 * est), f"{mode} mixed fifo", factor=1.4)
        mixed["calibrated_rps_one_at_a_time"] = est
        out["mixed_fifo"] = mixed
    cap = mixed["capacity_rps"] or mixed["points"][0]["rate"] / 2
    rate = s["sched_load"] * cap
    t_s = int(2 * np.median(facts_mixed["hop"]))
    configs = {
        "fifo": {"scheduler": "fifo"},
        "degree": {"scheduler": "degree"},
        "degree_divider": {"scheduler": "degree", "t_s": t_s},
    }
    repeats = s["sched_repeats"]
    sched: dict = {"rate_rps": rate, "mode": mode, "t_s": t_s, "repeats": repeats, "runs": {}, "per_repeat": {}}
    raw: dict = {}
    nan = float("nan")
    for process in ("poisson", "bursty"):
        sched["per_repeat"][process] = {name: [] for name in configs}
        for rep in range(repeats):  # alternate the order so drift on the box hits every scheduler alike
            order = list(configs) if rep % 2 == 0 else list(reversed(configs))
            for name in order:
                with Server(server_config(dep, "sage", mode, **configs[name])) as srv:
                    seed = 1000 + 10 * rep + (process == "bursty")
                    p, res = b.point(srv, "mixed", mode, rate, process=process, seed=seed)
                sched["per_repeat"][process][name].append(p)
                raw.setdefault((process, name), []).append(res)
                log(
                    f"  {process:7s} {name:15s} {rate:7.1f} req/s: mean {p.get('latency_mean_ms', nan):7.1f}"
                    f" p50 {p.get('latency_p50_ms', nan):7.1f} p99 {p.get('latency_p99_ms', nan):7.1f}"
                    f" ms, batches {p.get('batches')}, busy {p['busy']} lost {p['lost']}"
                )
        sched["runs"][process] = {}
        for name in configs:
            merged = merge_results(raw[(process, name)])
            raw[(process, name)] = merged
            p = summarise(merged)
            reps = sched["per_repeat"][process][name]
            p["batches"] = sum(r.get("batches", 0) for r in reps)
            p["batch_seconds_max"] = max(r.get("batch_seconds_max", 0.0) for r in reps)
            p["repeat_mean_latency_ms"] = [r.get("latency_mean_ms") for r in reps]
            sched["runs"][process][name] = p
    out["schedulers"] = sched
    # wait / own service, per request, under the degree scheduler (and FIFO for comparison)
    ratios = {}
    for process in ("poisson", "bursty"):
        for name in configs:
            res = raw[(process, name)]
            ok = np.array(res["status"]) == "ok"
            q = np.array(res["queue_ms"], np.float64)[ok]
            sv = np.array(res["service_ms"], np.float64)[ok]
            r = q / np.maximum(sv, 1e-3)
            ratios[f"{process}/{name}"] = {
                "max": float(r.max()) if len(r) else None,
                "p99": float(np.percentile(r, 99)) if len(r) else None,
                "mean": float(r.mean()) if len(r) else None,
            }
            # does the wait follow the request's cost? (degree favours cheap requests)
            if len(r):
                cost = facts_mixed["cost"][np.array(res["pick"])[ok]]
                cheap = cost <= np.median(cost)
                ratios[f"{process}/{name}"]["queue_mean_ms_cheap_half"] = float(q[cheap].mean())
                ratios[f"{process}/{name}"]["queue_mean_ms_costly_half"] = (
                    float(q[~cheap].mean()) if (~cheap).any() else None
                )
    out["wait_over_service"] = ratios
    out["cost_model"] = b.cost_model
    return out


def experiment_big_and_exact(b: Bench, dep, s) -> dict:
    from sparkgnn.serving.online.server import Server

    out: dict = {"B": BIG_B, "repeats": s["big_repeats"]}
    for kind in KINDS:
        log(f"[4] one request of {BIG_B} queries, HE vs EXACT, {kind}")
        with Server(server_config(dep, kind, "he")) as srv:
            r = {}
            for mode in ("he", "exact"):
                b.closed(srv, "big", mode, 1, index=0)  # warm-up (lazy indexes of the mode)
                r[mode] = b.closed(srv, "big", mode, s["big_repeats"], index=0)
            r["exact_over_he_latency"] = r["exact"]["latency_median_ms"] / r["he"]["latency_median_ms"]
            r["exact_over_he_service"] = r["exact"]["service_median_ms"] / r["he"]["service_median_ms"]
            log(
                f"  {kind}: HE {r['he']['latency_median_ms']:.1f} ms, EXACT {r['exact']['latency_median_ms']:.1f} ms"
                f" -> {r['exact_over_he_latency']:.2f}x"
            )
            out[kind] = r
    log("[4] single-query EXACT p99 vs load (sage)")
    with Server(server_config(dep, "sage", "exact")) as srv:
        est = b.calibrate(srv, "single", "exact")
        curve = b.sweep(srv, "single", "exact", max(5.0, 0.2 * est), "EXACT single", factor=1.6, slo_ms=EXACT_SLO_MS)
        curve["calibrated_rps_one_at_a_time"] = est
    out["exact_single"] = curve
    return out


def experiment_workers(b: Bench, dep, s, he_capacity: float | None) -> dict:
    from sparkgnn.serving.online.server import Server

    out = {}
    for width in (1, 2):
        log(f"[5] 'workers' pool of width {width} (1 torch thread each), single-query HE")
        pools = [{"name": f"w{width}", "kind": "workers", "width": width, "threads": 1, "timeout_s": WORKER_TIMEOUT_S}]
        t0 = time.perf_counter()
        with Server(server_config(dep, "sage", "he", pools=pools)) as srv:
            started = time.perf_counter() - t0
            start = 0.5 * (out["1"]["capacity_rps"] if width == 2 and out["1"]["capacity_rps"] else (he_capacity or 50))
            curve = b.sweep(srv, "single", "he", max(5.0, start), f"HE workers x{width}")
        curve["start_seconds"] = started
        out[str(width)] = curve
    return out


def store_bytes(cfg) -> int:
    """Bytes of the arrays the HE engine gathers from (what the hot cache budgets against)."""
    from sparkgnn.serving.online import batch_op

    dep = batch_op.deployment(cfg.deployment())
    engine = dep.engine("he")
    stored = engine.mode.stored(engine.context)
    return int(sum(a.nbytes for a in stored.arrays().values()))


def experiment_cache(b: Bench, dep, s) -> dict:
    from sparkgnn.serving.online import batch_op
    from sparkgnn.serving.online.server import Server

    try:
        from sparkgnn.serving.online.hotcache import attach_hot_cache  # noqa: F401
    except ImportError as exc:
        return {"skipped": f"hot cache not available: {exc}"}
    base = server_config(dep, "sage", "he")
    total = store_bytes(base)
    budget = int(s["cache_fraction"] * total)
    out: dict = {"store_bytes": total, "budget_bytes": budget, "fraction": s["cache_fraction"], "mode": "he"}
    rate = None
    for policy in ("off", "degree", "fap"):
        cfg = server_config(dep, "sage", "he", cache={"policy": policy, "bytes": budget})
        with Server(cfg) as srv:
            if rate is None:
                rate = 0.5 * (b.calibrated.get("mixed/he") or b.calibrate(srv, "mixed", "he"))
                out["rate_rps"] = rate
            p, _ = b.point(srv, "mixed", "he", rate, seed=2000)
            stats = srv.cache_stats
        p["cache_stats"] = stats
        p["hit_rate"] = float(stats["hit_rate"]) if stats else 0.0
        out[policy] = p
        log(
            f"[6] cache {policy:6s}: hit rate {p['hit_rate']:.3f}, mean "
            f"{p.get('latency_mean_ms', float('nan')):.1f} ms, p99 {p.get('latency_p99_ms', float('nan')):.1f} ms"
        )
        if policy != "off":  # each policy loaded its own copy of the deployment: free it
            batch_op._DEPLOYMENTS.pop(json.dumps(cfg.deployment(), sort_keys=True), None)
    return out


def experiment_router(b: Bench, dep, s, facts_mixed, rate: float) -> dict:
    """Quiver's PSGS router: batches below the threshold to the first pool ("small": the front
    end's own process, width 1), the rest to the second ("big": 2 sparkgnn-worker processes).
    WHY not two "workers" pools: a pool's dealer that idles longer than the messenger's liveness
    stalls on its next call (worker_pool_idle_probe), and a second workers pool idles while the
    first starts and whenever the router sends it nothing for a while."""
    from sparkgnn.serving.online.server import Server

    threshold = float(np.median(facts_mixed["psgs"]))
    small = {"name": "small", "kind": "inprocess", "width": 1, "threads": 1}
    big = {"name": "big", "kind": "workers", "width": 2, "threads": 1, "timeout_s": WORKER_TIMEOUT_S}
    configs = {
        "psgs_router": {"pools": [small, big], "router": "psgs", "route_psgs": threshold},
        "single_pool_workers_w2": {"pools": [big]},
        "single_pool_inprocess_w1": {"pools": [small]},
    }
    out: dict = {"route_psgs": threshold, "rate_rps": rate, "mode": "he", "runs": {}}
    for name, opts in configs.items():
        with Server(server_config(dep, "sage", "he", **opts)) as srv:
            p, _ = b.point(srv, "mixed", "he", rate, seed=3000)
            p["overflow"] = srv.stats["overflow"]
            per_pool: dict = {}
            for row in srv.batch_log:
                d = per_pool.setdefault(row["pool"], {"batches": 0, "requests": 0, "seconds": 0.0, "psgs": 0.0})
                d["batches"] += 1
                d["requests"] += row["requests"]
                d["seconds"] += row["seconds"]
                d["psgs"] += row["psgs"]
            for d in per_pool.values():
                d["mean_batch_ms"] = d.pop("seconds") / d["batches"] * 1e3
                d["mean_batch_psgs"] = d.pop("psgs") / d["batches"]
            p["per_pool"] = per_pool
        out["runs"][name] = p
        log(
            f"[7] {name:24s} {rate:.1f} req/s: mean {p.get('latency_mean_ms', float('nan')):.1f} p99 "
            f"{p.get('latency_p99_ms', float('nan')):.1f} ms, batches {p.get('batches_per_pool')}, overflow "
            f"{p['overflow']}"
        )
    return out


def probe_worker_idle(b: Bench, dep, s) -> dict:
    """A regression check of the dealer's idle-gap fix: single-query requests one after the other
    to a "workers" pool of width 1 (dealer timeout_s 2), after idle gaps of 0 to 3 s. A dealer that
    heard nothing from its broker for longer than liveness x heartbeat (3 x 0.5 s in WorkerPool)
    used to reopen its broker socket right after sending a LEASE, losing it and paying two
    timeouts; latencies must now be flat and broker_reconnects 0."""
    from sparkgnn.serving.online.server import Server

    gaps = [0.0, 0.0, 0.5, 1.0, 2.0, 0.0, 3.0, 0.0]
    pools = [{"name": "w", "kind": "workers", "width": 1, "threads": 1, "timeout_s": 2.0}]
    with Server(server_config(dep, "sage", "he", pools=pools)) as srv:
        wait_idle(srv)
        job = {
            "endpoint": srv.zmq_endpoint,
            "pool": b.pools["single"],
            "mode": "he",
            "closed": True,
            "n": len(gaps),
            "gaps": gaps,
        }
        res = b.lg.run(job)
        counts = dict(srv.pools[0]._dealers[0].counts)
    lat = [(r - t) * 1e3 if r is not None else None for r, t in zip(res["received"], res["scheduled"], strict=True)]
    out = {
        "timeout_s": 2.0,
        "idle_gap_s": gaps,
        "latency_ms": lat,
        "service_ms": res["service_ms"],
        "dealer_counts": counts,
    }
    log(f"[7] worker pool idle probe: gaps {gaps} s -> latencies {[round(v) if v else v for v in lat]} ms")
    return out


# -- report ----------------------------------------------------------------------------------------
WHAT = {
    "what": "this: what every key of the result means (nested keys as parent.key; 'point' is one run)",
    "machine": "platform, CPU count, torch version/threads of the bench process (bench_common.machine)",
    "gpu": "null: no GPU on this machine; every pool and the hot cache ran on the CPU",
    "load_average_start": "/proc/loadavg (1, 5, 15 min) when the bench started: the box is shared",
    "load_average_end": "/proc/loadavg when the bench ended",
    "settings": "run parameters (graph size, seconds per point, sweeps, scheduler mode and load, ...)",
    "deployment": "the cached deployment: graph size and degrees, PE store build seconds per model",
    "pools": "request pools: queries per request and the front end's predicted cost (in-degree sum, "
    "GSM), largest layer-subgraph estimate and PSGS per request (mean/p50/p90/p99/max/cv)",
    "capacity": "sweeps: he_single (single-query HE, inprocess pool, degree scheduler) and mixed_fifo "
    "(mixed-size requests in settings.sched_mode under FIFO); each has points (one run per offered "
    "rate), capacity_rps (highest held rate), p99_bound_ms (the held criterion: 5 x the first "
    "point's p99, >= 50 ms), first_failed_rps, saturation_achieved_rps (highest answered rate seen), "
    "calibrated_rps_one_at_a_time (1000 / mean service ms, closed loop)",
    "capacity.schedulers": "FIFO vs degree vs degree + divider (T_s = t_s) on the mixed pool at "
    "rate_rps = settings.sched_load x mixed capacity, Poisson and bursty (on/off MMPP, 3x rate 25% of "
    "the time) arrivals; identical send times and requests across schedulers; `repeats` runs each "
    "(orders alternated), runs = statistics over all their requests, per_repeat = each run",
    "capacity.wait_over_service": "per run: max / p99 / mean over answered requests of queue_ms / "
    "service_ms (the service time of the batch the request ran in), and mean queue ms of the cheaper "
    "and costlier half of the requests by predicted cost",
    "point": "one run: rate (target), offered_rps (sent / duration), requests, ok/busy/errors/lost, "
    "achieved_rps (ok / max(last answer, duration)), keep_up (achieved / offered), latency_*_ms "
    "(received - scheduled send time, answered requests), queue_*_ms and service_mean_ms (the "
    "service's own header fields), batch_requests_mean/max, send_lateness_ms_* (generator: sent - "
    "scheduled), batches, batches_per_pool and batch_seconds_max (server batch log), held (see capacity), "
    "cpu_cores (CPU seconds / wall seconds of the run per role: front_end = the bench process with the "
    "service and its inprocess pools, generator, workers, brokers; the box has 2 cores)",
    "degree_vs_fifo_mean_latency": "mean latency under the degree scheduler / under FIFO (Poisson run "
    "of capacity.schedulers); < 1 means degree-first ordering helped",
    "degree_divider_vs_fifo_mean_latency": "mean latency degree + divider / FIFO (Poisson)",
    "degree_vs_fifo_mean_latency_bursty": "as degree_vs_fifo_mean_latency under bursty arrivals",
    "degree_vs_fifo_p99_latency": "p99 latency degree / FIFO (Poisson)",
    "max_wait_over_service": "max over answered requests of queue time / service time under the "
    "degree scheduler (Poisson run): the promotion rule bounds a request's wait by max_wait_factor "
    "(4) x its predicted service, plus the batch it waits behind",
    "single_query_rps": "highest offered single-query HE rate (inprocess pool) held with p99 <= 20 ms "
    "(the target is 2000 req/s); null if none was",
    "single_query_p99_ms": "p99 latency (ms) at single_query_rps",
    "single_query_capacity_rps": "highest single-query HE rate held under the capacity criterion",
    "exact_over_he_latency_sage": "EXACT / HE median client latency of one request of 1024 queries, SAGE",
    "exact_over_he_latency_gcn": "the same for the GCN",
    "exact_single_query_rps": "highest single-query EXACT rate held with p99 <= 50 ms (SAGE, inprocess)",
    "exact_single_query_p99_ms": "p99 latency at exact_single_query_rps",
    "big_request": "the B=1024 runs: per model, he/exact closed-loop latencies (ms) and service times, "
    "ratios; exact_single is the single-query EXACT sweep",
    "two_workers_over_one": "capacity_rps of a 'workers' pool of width 2 / width 1 (single-query HE, "
    "1 torch thread per worker); the front end and the generator share the same 2 cores",
    "two_workers_over_one_saturation": "the same ratio of saturation_achieved_rps",
    "workers": "the two sweeps behind two_workers_over_one (start_seconds: pool start + warm-up)",
    "cache": "hot cache off / degree / fap at budget_bytes (fraction x store_bytes of the HE engine's "
    "stored arrays): one mixed HE run each at rate_rps; hit_rate and the server's cache_stats",
    "cache_hit_rate": "hit rate per policy (off = 0: nothing cached)",
    "router": "Quiver's PSGS router (route_psgs = median request PSGS) over an inprocess pool of width 1 "
    "('small', batches below the threshold) and a workers pool of width 2 ('big'), vs each pool alone, "
    "same mixed HE load (rate_rps = 0.5 x the closed-loop mixed HE rate); per run batches_per_pool, "
    "per_pool (batches, requests, mean_batch_ms, mean_batch_psgs), overflow (batches sent to the other "
    "pool because theirs was full)",
    "router_vs_single_pool_mean_latency": "mean latency with the router / with the workers pool of width 2 alone",
    "worker_pool_idle_probe": "sequential single-query requests to a 'workers' pool of width 1 (dealer "
    "timeout_s 2) after idle gaps (idle_gap_s): latency_ms per request and the dealer's counters. Before "
    "the dealer fix (commit 'Messenger dealer: a call after an idle gap...') a request after more than "
    "~1.5 s of idling took two timeouts (resent, broker_reconnects > 0); now every latency should be flat",
    "capacity.cost_model": "closed-loop service times of the mixed pool in he / exact / full, and the "
    "correlation of service ms with the predicted cost (in-degree sum) and its log: the scheduler "
    "comparison runs in the mode whose service time follows the cost (settings.sched_mode)",
    "seconds_total": "wall time of the bench",
}


def plot(result: dict, name: str = "online") -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(8, 5))
    curves = [
        ("HE single, inprocess", result["capacity"].get("he_single")),
        ("EXACT single, inprocess", result.get("big_request", {}).get("exact_single")),
        ("HE single, workers x1", result.get("workers", {}).get("1")),
        ("HE single, workers x2", result.get("workers", {}).get("2")),
        (f"{result['settings']['sched_mode'].upper()} mixed, FIFO", result["capacity"].get("mixed_fifo")),
    ]
    for label, curve in curves:
        if not curve:
            continue
        pts = [p for p in curve["points"] if "latency_p99_ms" in p]
        ax.plot([p["offered_rps"] for p in pts], [p["latency_p99_ms"] for p in pts], "o-", label=f"{label} p99")
    ax.axhline(HE_SLO_MS, ls="--", c="gray", lw=0.8)
    ax.axhline(EXACT_SLO_MS, ls=":", c="gray", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("p99 latency (ms, from scheduled send)")
    ax.set_title("online serving: p99 latency vs offered load (20 / 50 ms lines)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(RESULTS, f"{name}_latency.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    paths.append(path)

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.5))
    runs = result["capacity"]["schedulers"]["runs"]
    names = ["fifo", "degree", "degree_divider"]
    width = 0.13
    for j, process in enumerate(runs):
        for k, stat in enumerate(("latency_mean_ms", "latency_p50_ms", "latency_p99_ms")):
            vals = [runs[process][n].get(stat, np.nan) for n in names]
            axes[0].bar(np.arange(3) + (j * 3 + k - 2.5) * width, vals, width, label=f"{process} {stat[8:-3]}")
    axes[0].set_xticks(np.arange(3), names)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("ms")
    axes[0].set_title(f"schedulers at {result['capacity']['schedulers']['rate_rps']:.0f} req/s")
    axes[0].legend(fontsize=7)
    cache = result.get("cache", {})
    if "off" in cache:
        pol = ["off", "degree", "fap"]
        axes[1].bar(pol, [cache[p]["hit_rate"] for p in pol])
        axes[1].set_ylim(0, 1)
        axes[1].set_title(f"hot cache hit rate at {cache['fraction']:.0%} of store bytes")
    router = result.get("router", {}).get("runs", {})
    if router:
        labels = list(router)
        x = np.arange(len(labels))
        axes[2].bar(x - 0.2, [router[r].get("latency_mean_ms", np.nan) for r in labels], 0.4, label="mean")
        axes[2].bar(x + 0.2, [router[r].get("latency_p99_ms", np.nan) for r in labels], 0.4, label="p99")
        axes[2].set_xticks(range(len(labels)), [lab.replace("_", "\n") for lab in labels], fontsize=7)
        axes[2].set_ylabel("ms")
        axes[2].set_title("PSGS router vs single pool")
        axes[2].legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(RESULTS, f"{name}_schedulers.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    paths.append(path)
    return paths


def _relative_paths(doc):
    """The deployment document with paths under the repository made relative to it."""
    if isinstance(doc, dict):
        return {k: _relative_paths(v) for k, v in doc.items()}
    if isinstance(doc, str) and doc.startswith(ROOT + os.sep):
        return os.path.relpath(doc, ROOT)
    return doc


def _ratio(a, b):
    return a / b if a is not None and b else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100K-edge graph, 2 s per point, shorter sweeps")
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--edges", type=int, help="generated edges (symmetrised: about twice as many directed)")
    parser.add_argument("--duration", type=float, help="seconds per point")
    parser.add_argument("--max-points", type=int)
    parser.add_argument("--refine", type=int, help="bisection steps after a sweep")
    parser.add_argument(
        "--sched-mode", default="full", choices=["he", "exact", "full"], help="mode of the scheduler runs (module doc)"
    )
    parser.add_argument("--sched-load", type=float, default=0.85, help="fraction of the mixed capacity")
    parser.add_argument("--sched-repeats", type=int, help="runs per scheduler and arrival process")
    parser.add_argument("--cache-fraction", type=float, default=0.1)
    parser.add_argument("--skip", default="", help="comma list of: exact, workers, cache, router")
    parser.add_argument("--build-only", action="store_true", help="build (or find) the deployment and stop")
    parser.add_argument("--name", default=None, help="result stem (default online, online_quick with --quick)")
    args = parser.parse_args()
    s = dict(QUICK if args.quick else FULL)
    for key in ("nodes", "edges", "duration", "max_points", "refine", "sched_repeats"):
        if getattr(args, key) is not None:
            s[key] = getattr(args, key)
    s.update(
        zipf=1.0,
        seed=0,
        sched_mode=args.sched_mode,
        sched_load=args.sched_load,
        cache_fraction=args.cache_fraction,
        quick=args.quick,
    )
    skip = {x for x in args.skip.split(",") if x}
    name = args.name or ("online_quick" if args.quick else "online")
    started = time.perf_counter()
    import torch

    torch.set_num_threads(1)
    load_start = load_average()
    dep = build_deployment(s)
    if args.build_only:
        return 0
    from sparkgnn.graph.reader import read_graph_dir

    G = read_graph_dir(dep["graph"])
    reqs = {
        "single": make_requests(G, s["pool_requests"], (1,), (1.0,), seed=1),
        "mixed": make_requests(G, s["pool_requests"], MIX_SIZES, MIX_PROBS, seed=2),
        "big": make_requests(G, 1, (BIG_B,), (1.0,), seed=3),
    }
    work = tempfile.mkdtemp(prefix="bench-online-", dir=ONLINE_DATA)
    pools = {k: write_pool(os.path.join(work, f"pool_{k}.npz"), v) for k, v in reqs.items()}
    facts = {k: pool_facts(dep, "sage", v) for k, v in reqs.items()}
    pool_doc = {
        k: {
            "requests": len(v),
            "queries_per_request": describe(np.array([r.batch_size for r in v], np.float64)),
            "edges_per_request": describe(np.array([len(r.src) for r in v], np.float64)),
            "cost": describe(facts[k]["cost"]),
            "largest_hop_estimate": describe(facts[k]["hop"].astype(np.float64)),
            "psgs": describe(facts[k]["psgs"]),
        }
        for k, v in reqs.items()
    }
    del G
    log(
        f"pools: single cost cv {pool_doc['single']['cost']['cv']:.2f} (p50 {pool_doc['single']['cost']['p50']:.0f}, "
        f"max {pool_doc['single']['cost']['max']:.0f}); mixed cost cv {pool_doc['mixed']['cost']['cv']:.2f}"
    )
    result: dict = {
        "what": WHAT,
        "machine": machine(),
        "gpu": None,
        "load_average_start": load_start,
        "settings": {
            **s,
            "mix_sizes": list(MIX_SIZES),
            "mix_probs": list(MIX_PROBS),
            "hub_fraction": HUB_FRACTION,
            "max_neighbours_per_query": MAX_NEIGHBOURS,
            "he_slo_ms": HE_SLO_MS,
            "exact_slo_ms": EXACT_SLO_MS,
            "held": "all answered ok, achieved >= 0.9 x offered, p99 <= bound",
            "server": "ServeConfig defaults (T_d 4096, capacity 4096, max_batch 1024, max_wait_factor 4) unless noted; "
            "the service runs in the bench process, the load generator in its own",
        },
        "deployment": _relative_paths({k: v for k, v in dep.items() if k != "root"}),
        "pools": pool_doc,
    }
    lg = LoadGen(work)
    b = Bench(s, lg, pools)
    try:
        result["capacity"] = experiment_capacity_and_schedulers(b, dep, s, facts["mixed"])
        he = result["capacity"]["he_single"]
        rate, p99 = slo_rate(he, HE_SLO_MS)
        result["single_query_rps"], result["single_query_p99_ms"] = rate, p99
        result["single_query_capacity_rps"] = he["capacity_rps"]
        runs = result["capacity"]["schedulers"]["runs"]
        mean = lambda process, n: runs[process][n].get("latency_mean_ms")  # noqa: E731
        result["degree_vs_fifo_mean_latency"] = _ratio(mean("poisson", "degree"), mean("poisson", "fifo"))
        result["degree_divider_vs_fifo_mean_latency"] = _ratio(
            mean("poisson", "degree_divider"), mean("poisson", "fifo")
        )
        result["degree_vs_fifo_mean_latency_bursty"] = _ratio(mean("bursty", "degree"), mean("bursty", "fifo"))
        result["degree_vs_fifo_p99_latency"] = _ratio(
            runs["poisson"]["degree"].get("latency_p99_ms"), runs["poisson"]["fifo"].get("latency_p99_ms")
        )
        result["max_wait_over_service"] = result["capacity"]["wait_over_service"]["poisson/degree"]["max"]
        if "exact" not in skip:
            big = experiment_big_and_exact(b, dep, s)
            result["big_request"] = big
            result["exact_over_he_latency_sage"] = big["sage"]["exact_over_he_latency"]
            result["exact_over_he_latency_gcn"] = big["gcn"]["exact_over_he_latency"]
            rate, p99 = slo_rate(big["exact_single"], EXACT_SLO_MS)
            result["exact_single_query_rps"], result["exact_single_query_p99_ms"] = rate, p99
        if "cache" not in skip:
            result["cache"] = experiment_cache(b, dep, s)
            if "off" in result["cache"]:
                result["cache_hit_rate"] = {p: result["cache"][p]["hit_rate"] for p in ("off", "degree", "fap")}
        if "workers" not in skip:
            w = experiment_workers(b, dep, s, he["capacity_rps"])
            result["workers"] = w
            result["two_workers_over_one"] = _ratio(w["2"]["capacity_rps"], w["1"]["capacity_rps"])
            result["two_workers_over_one_saturation"] = _ratio(
                w["2"]["saturation_achieved_rps"], w["1"]["saturation_achieved_rps"]
            )
        if "router" not in skip:
            mixed_he = b.calibrated.get("mixed/he")
            if mixed_he is None:
                from sparkgnn.serving.online.server import Server

                with Server(server_config(dep, "sage", "he")) as srv:
                    mixed_he = b.calibrate(srv, "mixed", "he")
            router = experiment_router(b, dep, s, facts["mixed"], 0.5 * mixed_he)
            result["router"] = router
            result["router_vs_single_pool_mean_latency"] = _ratio(
                router["runs"]["psgs_router"].get("latency_mean_ms"),
                router["runs"]["single_pool_workers_w2"].get("latency_mean_ms"),
            )
            result["worker_pool_idle_probe"] = probe_worker_idle(b, dep, s)
    finally:
        lg.close()
    result["load_average_end"] = load_average()
    result["seconds_total"] = time.perf_counter() - started
    path = write_result(name, result)
    paths = plot(result, name)
    shutil.rmtree(work, ignore_errors=True)
    log("\nheadline:")
    for key in (
        "single_query_rps",
        "single_query_p99_ms",
        "single_query_capacity_rps",
        "degree_vs_fifo_mean_latency",
        "degree_divider_vs_fifo_mean_latency",
        "degree_vs_fifo_mean_latency_bursty",
        "max_wait_over_service",
        "exact_over_he_latency_sage",
        "exact_over_he_latency_gcn",
        "exact_single_query_rps",
        "two_workers_over_one",
        "cache_hit_rate",
        "router_vs_single_pool_mean_latency",
    ):
        v = result.get(key)
        log(f"  {key:<40} {round(v, 3) if isinstance(v, float) else v}")
    log(f"\nwrote {path} {' '.join(paths)} in {result['seconds_total']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
