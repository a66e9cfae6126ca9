"""The online serving benchmark's deployment and request pools (bench/bench_online.py runs it).

Deployment (built once, cached under data/bench/online/ keyed by its parameters): a seeded
power-law synthetic graph (sparkgnn.datasets.synthetic_graph, zipf 1.0, symmetrised), a 2-layer
GraphSAGE (mean) and a 2-layer GCN with seeded random weights (PyG modules through
Model.from_pyg), and each one's PE store with states and Quiver's workload metrics
(sparkgnn.pe.local.precompute_local, metrics=True: the "fap" cache policy and the PSGS router read
them). Request pools: new query nodes attached to G by edges in both directions (make_requests),
written as .npz files for the load generator (write_pool, read by online_load.py), with the front
end's predicted cost per request (pool_facts).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time

import numpy as np
from bench_common import DATA

ONLINE_DATA = os.path.join(DATA, "online")
KINDS = ("sage", "gcn")
MIX_SIZES = (1, 4, 16, 64)
MIX_PROBS = (0.55, 0.25, 0.15, 0.05)
BIG_B = 1024
HUB_FRACTION = 1 / 3
MAX_NEIGHBOURS = 32


def log(line: str) -> None:
    """One progress line of the bench on stdout, flushed (the bench runs for many minutes)."""
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
        precompute_local(G, model, store_dir, states=True, metrics=True)
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
    facts = GraphFacts.load(dep["graph"], store, Model.load(m["model"]).num_rounds)
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


# -- server configuration --------------------------------------------------------------------------
def server_config(dep: dict, kind: str, mode: str, **options):
    """The ServeConfig of `kind`'s model and store in `mode` (no HTTP front and one inprocess pool
    of width 1 unless `options` name them)."""
    from sparkgnn.serving.online.config import ServeConfig

    m = dep["models"][kind]
    options.setdefault("pools", [{"name": "main", "kind": "inprocess", "width": 1, "threads": 1}])
    options.setdefault("http", None)
    return ServeConfig(
        graph=dep["graph"],
        model=m["model"],
        store=m["store"],
        mode=mode,
        modes=["he", "exact", "full"],
        **options,
    )


def store_bytes(cfg) -> int:
    """Bytes of the arrays the HE engine gathers from (what the hot cache budgets against)."""
    from sparkgnn.serving import served
    from sparkgnn.serving.online import batch_op

    key = served.register(cfg.deployment())  # this process serves it (served.py): batches name it by id
    try:
        dep = batch_op.DeploymentCache().get(key)  # a copy of its own, freed on return
        engine = dep.engine("he")
        stored = engine.mode.stored(engine.context)
        return int(sum(a.nbytes for a in stored.arrays().values()))
    finally:
        served.withdraw(key)
