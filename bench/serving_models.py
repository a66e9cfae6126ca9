"""The serving benchmark's graphs and trained models (bench/bench_serving.py).

Graphs (both UNDIRECTED, i.e. every edge in both directions, as the OMEGA datasets are):
    cora       Cora from the bundled files, symmetrised; split 20 train/class, 500 val, the other
               2068 vertices test (so the 25% query pool holds 517 vertices and B = 512 fits).
    synthetic  sparkgnn.datasets.synthetic_graph (power-law in-degrees, class-informative
               features, homophily 0.7), 100K vertices, 600K generated edges, symmetrised
               (~1.19M directed edges), 128-d, 8 classes.
WHY undirected: with a directed generator an edge u -> q from G into a query rarely comes with
q -> u, so the stored embedding of u misses nothing and HE would look exact by construction; in
an undirected graph every neighbour of a query misses the query's message, which is the
approximation error OMEGA's SRPE exists to recover.

Models: 2-layer GraphSAGE (mean) and 2-layer GCN trained full-batch in PyTorch Geometric on G
(the graph without the query pool), Adam lr 0.01, weight decay 5e-4, dropout 0.5, seeded, then
put in eval mode. Trained weights are cached under data/bench/serving/models keyed by the
graph fingerprint and every hyper-parameter (delete the folder or pass --retrain to redo).
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import torch
from bench_common import DATA

SERVING_DATA = os.path.join(DATA, "serving")
# kind -> (PyG class, layers); "sage3" is OMEGA's 3-layer setting (fanouts (15, 10, 5))
MODELS = {"sage": ("sage", 2), "gcn": ("gcn", 2), "sage3": ("sage", 3)}
MODEL_KINDS = tuple(MODELS)

GRAPHS = {
    "cora": {"hidden": 64, "epochs": 200, "batch_sizes": (64, 256, 512), "requests": 30},
    "synthetic": {
        "nodes": 100_000,
        "edges": 600_000,
        "dim": 128,
        "classes": 8,
        "hidden": 64,
        "epochs": 60,
        "batch_sizes": (64, 256, 1024),
        "requests": 30,
    },
}


def load_graph(name: str, spec: dict):
    """The full graph (before the workload holds out its query pool) and a description."""
    from sparkgnn.datasets.edges import symmetrise
    from sparkgnn.graph import GraphData

    if name == "cora":
        from sparkgnn.datasets import load_cora

        g = load_cora(seed=0, num_val=500, num_test=2068, undirected=True)
        return g, "Cora (undirected), 2708 vertices, 1433-d, 7 classes"
    from sparkgnn.datasets import synthetic_graph

    d = synthetic_graph(spec["nodes"], spec["edges"], spec["dim"], num_classes=spec["classes"], seed=0)
    src, dst = symmetrise(d.edge_src, d.edge_dst)
    g = GraphData(d.ids, d.x, src, dst, y=d.y, split=d.split, name="synthetic-undirected")
    return g, (
        f"synthetic power-law (zipf 0.8, homophily 0.7), {spec['nodes'] // 1000}K vertices, "
        f"{spec['edges'] // 1000}K generated edges symmetrised to {g.num_edges} directed, "
        f"{spec['dim']}-d, {spec['classes']} classes"
    )


def _pyg_module(kind: str, in_dim: int, hidden: int, out_dim: int):
    from torch_geometric.nn import GCN, GraphSAGE

    cls, layers = MODELS[kind]
    return {"sage": GraphSAGE, "gcn": GCN}[cls](in_dim, hidden, num_layers=layers, out_channels=out_dim, dropout=0.5)


def _accuracy(module, G) -> dict:
    with torch.no_grad():
        pred = module(torch.from_numpy(G.x), G.edge_index_torch()).argmax(dim=1).numpy()
    return {split: float((pred[G.mask(split)] == G.y[G.mask(split)]).mean()) for split in ("train", "val", "test")}


def train_model(
    G,
    kind: str,
    hidden: int,
    epochs: int,
    seed: int = 0,
    lr: float = 0.01,
    retrain: bool = False,
    threads: int = 2,
    log=print,
):
    """A trained PyG module (eval mode) and its report (accuracy on G's splits, seconds, cached)."""
    num_classes = int(G.y.max()) + 1
    key_doc = {
        "graph": G.fingerprint,
        "kind": kind,
        "hidden": hidden,
        "epochs": epochs,
        "seed": seed,
        "lr": lr,
        "weight_decay": 5e-4,
        "dropout": 0.5,
        "torch": torch.__version__,
    }
    key = hashlib.sha1(json.dumps(key_doc, sort_keys=True).encode()).hexdigest()[:16]
    path = os.path.join(SERVING_DATA, "models", f"{G.name}-{kind}-{key}")
    module = _pyg_module(kind, G.feature_dim, hidden, num_classes)
    if not retrain and os.path.exists(os.path.join(path, "report.json")):
        module.load_state_dict(torch.load(os.path.join(path, "state.pt")))
        with open(os.path.join(path, "report.json")) as fh:
            report = json.load(fh)
        report["cached"] = True
        log(f"  {kind}: trained weights from cache {path} (G test accuracy {report['accuracy_G']['test']:.4f})")
        return module.eval(), report
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(seed)
        module = _pyg_module(kind, G.feature_dim, hidden, num_classes)
        x, edge_index = torch.from_numpy(G.x), G.edge_index_torch()
        y, train = torch.from_numpy(G.y), torch.from_numpy(G.mask("train"))
        optimizer = torch.optim.Adam(module.parameters(), lr=lr, weight_decay=5e-4)
        started = time.perf_counter()
        for _ in range(epochs):
            module.train()
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(module(x, edge_index)[train], y[train])
            loss.backward()
            optimizer.step()
        seconds = time.perf_counter() - started
        module.eval()
        report = {
            **key_doc,
            "train_seconds": seconds,
            "final_loss": loss.item(),
            "accuracy_G": _accuracy(module, G),
            "cached": False,
        }
    finally:
        torch.set_num_threads(previous)
    os.makedirs(path, exist_ok=True)
    torch.save(module.state_dict(), os.path.join(path, "state.pt"))
    with open(os.path.join(path, "report.json"), "w") as fh:
        json.dump(report, fh, indent=2)
    log(f"  {kind}: trained {epochs} epochs in {seconds:.1f} s, G test accuracy {report['accuracy_G']['test']:.4f}")
    return module, report


def mlp_baseline_accuracy(G, seed: int = 0, epochs: int = 100) -> float:
    """Test accuracy of a features-only MLP on G: how much the graph adds to the labels."""
    torch.manual_seed(seed)
    x, y = torch.from_numpy(G.x), torch.from_numpy(G.y)
    train = torch.from_numpy(G.mask("train"))
    mlp = torch.nn.Sequential(
        torch.nn.Linear(G.feature_dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, int(G.y.max()) + 1)
    )
    optimizer = torch.optim.Adam(mlp.parameters(), lr=0.01, weight_decay=5e-4)
    for _ in range(epochs):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(mlp(x)[train], y[train]).backward()
        optimizer.step()
    with torch.no_grad():
        pred = mlp(x).argmax(dim=1).numpy()
    test = G.mask("test")
    return float((pred[test] == G.y[test]).mean())


def pe_store(G, model, graph_name: str, kind: str, log=print):
    """The PE store (with states) of `model` over G, written by precompute_local (seconds)."""
    from sparkgnn.pe.local import precompute_local

    root = os.path.join(SERVING_DATA, "pe", f"{graph_name}-{kind}")
    started = time.perf_counter()
    store = precompute_local(G, model, root, states=True, force=True)
    seconds = time.perf_counter() - started
    log(f"  {kind}: PE store with states in {seconds:.1f} s -> {root}")
    return store, seconds


def load_average() -> list:
    try:
        with open("/proc/loadavg") as fh:
            return [float(v) for v in fh.read().split()[:3]]
    except OSError:
        return []


__all__ = ["GRAPHS", "MODEL_KINDS", "load_average", "load_graph", "mlp_baseline_accuracy", "pe_store", "train_model"]
