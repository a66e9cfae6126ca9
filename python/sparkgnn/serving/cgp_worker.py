"""The worker side of computation graph parallelism as Spark tasks or messenger workers: one
partition's cached shard of the PE store and `partition_task`, which runs the CGP kernel
(cgp_kernel.partition_partials) on it. The driver side (jobs, merge, update) is spark_cgp.py.

A partition p owns the G vertices with id mod P == p: their features (after the model's `pre`
ops), their stored h^(1..k-1) and states. A task loads its shard ONCE per Python worker
(module-level cache keyed by store, graph, P, p; Spark reuses Python workers, a messenger worker
keeps its process; the cache is bounded by serving.served.cache_bytes(), least recently used
shard out first, since a peer choosing P and p could otherwise make it hold many copies) and
then, per request and layer, aggregates the request's edges whose SOURCE it owns into partial
states, using only its own stored rows plus the values of last layer's targets that the driver
all-gathers to it (`given`). It also returns, for the targets it owns, their stored state and
stored input value.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

import numpy as np
import torch

from sparkgnn.pe import layout, versions
from sparkgnn.serving.cgp_kernel import owner_of_ids, partition_partials

_SHARDS: OrderedDict = OrderedDict()  # (store, graph, P, p, states) -> Shard, least recently used first
_MODELS: dict = {}  # model path -> Model: only paths of deployments this process serves
_SHARDS_LOCK = threading.Lock()


class Shard:
    """One partition's stored rows, keyed by original id (sorted)."""

    def __init__(self, store_base: str, graph_dir: str, model, parts: int, p: int, states: bool):
        import pyarrow.parquet as pq

        from sparkgnn.pe.lookup import SortedTable, vectors

        v = pq.read_table(os.path.join(graph_dir, "vertices"), columns=["id", "x"])
        ids = v.column("id").to_numpy()
        mine = owner_of_ids(ids, parts) == p
        x = vectors(v.column("x"), None, "graph features")[mine]
        with torch.no_grad():
            cols = {"h0": model.pre(torch.from_numpy(np.ascontiguousarray(x))).numpy()}
        table0 = SortedTable(ids[mine], cols, f"shard {p} features")
        self.tables = {0: table0}
        manifest = layout.read_manifest(store_base) or {}
        for l in range(1, model.num_rounds):
            t = versions.read_layer(store_base, l, manifest)
            lid = t.column("id").to_numpy()
            keep = owner_of_ids(lid, parts) == p
            c = {"h": vectors(t.column("h"), None, f"store layer {l} h")[keep]}
            if states:
                c["state"] = vectors(t.column("state"), None, f"store layer {l} state")[keep]
            self.tables[l] = SortedTable(lid[keep], c, f"shard {p} layer {l}")
        self.nbytes = sum(t.ids.nbytes + sum(v.nbytes for v in t.columns.values()) for t in self.tables.values())

    def value(self, layer: int, ids: np.ndarray) -> np.ndarray:
        t = self.tables[layer]
        return t.take(ids, "h0" if layer == 0 else "h")

    def state(self, layer: int, ids: np.ndarray) -> np.ndarray:
        return self.tables[layer].take(ids, "state")


def _model(path: str):
    if path not in _MODELS:
        from sparkgnn.models import Model

        _MODELS[path] = Model.load(path)
    return _MODELS[path]


def _shard(cfg: dict, p: int) -> Shard:
    """Partition p's shard, loaded once and kept while the byte-bounded cache has room."""
    from sparkgnn.serving.served import cache_bytes

    key = (cfg["store_base"], cfg["graph_dir"], cfg["parts"], p, cfg["states"])
    with _SHARDS_LOCK:
        found = _SHARDS.get(key)
        if found is not None:
            _SHARDS.move_to_end(key)
            return found
    shard = Shard(cfg["store_base"], cfg["graph_dir"], _model(cfg["model_path"]), cfg["parts"], p, cfg["states"])
    with _SHARDS_LOCK:
        _SHARDS[key] = shard
        total = sum(s.nbytes for s in _SHARDS.values())
        while total > cache_bytes() and len(_SHARDS) > 1:
            _, dropped = _SHARDS.popitem(last=False)  # the caller of a dropped shard still holds it
            total -= dropped.nbytes
    return shard


def idle_partition(job: dict, p: int) -> dict | None:
    """What `partition_task(p, cfg, job)` returns when partition p has nothing to do for `job`,
    or None when it has work: it owns no target whose stored input is read and, for a "partials"
    job, no edge's source and no target merged from its stored state. A caller skips sending such
    a job (a single query's layer touches few of the shards). A job with no targets is the warm-up
    (loading every shard) and is never idle."""
    owner = job["target_owner"]
    if not len(owner):
        return None
    own = owner == p
    if (own & job["target_stored_input"]).any():
        return None
    out: dict[str, object] = {"p": p, "input_rows": np.zeros(0, np.int64), "input": None}
    if job["kind"] == "fetch":
        return out
    if (job["edge_owner"] == p).any() or (own & job["from_state"]).any():
        return None
    out.update(states=[], index=[], partial_bytes=0)
    return out


@torch.no_grad()
def partition_task(p: int, cfg: dict, job: dict) -> dict:
    """Runs inside a Spark task or messenger worker. job["kind"] is "fetch" (stored input values
    of owned targets) or "partials" (the kernel's blocks: partial states of the edges whose
    source this partition owns, plus stored states of owned targets, with their partial_bytes;
    and the stored input values of owned targets)."""
    shard = _shard(cfg, p)
    out: dict[str, object] = {"p": p}
    l0 = job["layer"] - 1
    own_t = job["target_owner"] == p
    fetch_rows = np.flatnonzero(own_t & job["target_stored_input"])
    out["input_rows"] = fetch_rows
    out["input"] = shard.value(l0, job["target_ids"][fetch_rows]) if len(fetch_rows) else None
    if job["kind"] == "fetch":
        return out
    fetched = [0]

    def sources(sel: np.ndarray, old: bool):
        # NEW messages read last layer's targets from job["given"] (src_key >= 0) and everything
        # else from this shard; OLD messages always read the stored values. One row per edge.
        src_key = job["src_key"][sel] if not old else np.full(len(sel), -1)
        vals = np.empty((len(sel), job["width"]), np.float32)
        given = src_key >= 0
        if given.any():
            vals[given] = job["given"][src_key[given]]
        if (~given).any():
            ids, inv = np.unique(job["src_id"][sel][~given], return_inverse=True)
            rows = shard.value(l0, ids)  # each stored row read once
            vals[~given] = rows[inv]
            fetched[0] += int(rows.nbytes)
        stats = {k: torch.from_numpy(v[sel]) for k, v in (job["stats_old"] if old else job["stats_new"]).items()}
        return torch.from_numpy(vals), stats, None

    def stored_states(rows: np.ndarray):
        s = shard.state(job["layer"], job["target_ids"][rows])
        fetched[0] += int(s.nbytes)
        return torch.from_numpy(s)

    dst = None if job["dst_payload"] is None else torch.from_numpy(job["dst_payload"])
    partials = partition_partials(
        _model(cfg["model_path"]).convs[l0],
        p,
        edge_owner=job["edge_owner"],
        old=job["old"],
        tgt=job["tgt"],
        weight=job["weight"],
        target_owner=job["target_owner"],
        from_state=job["from_state"],
        sources=sources,
        stored_states=stored_states,
        dst=(dst, None),
    )
    if fetched[0]:
        out["fetched_bytes"] = fetched[0]
    out["states"] = [s.numpy() for s in partials.states]
    out["index"] = partials.index
    out["partial_bytes"] = partials.partial_bytes
    return out
