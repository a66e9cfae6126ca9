"""Computation graph parallelism as Spark tasks (or messenger workers) over the cached PE store
(OMEGA section 6).

Each of P Spark tasks owns one shard: the G vertices with id mod P == p, their features (after
the model's `pre` ops), their stored h^(1..k-1) and states. A task loads its shard ONCE per
Python worker (module-level cache keyed by store, graph, P, p; Spark reuses Python workers) and
then, per request and layer, aggregates the request's edges whose SOURCE it owns into partial
states, using only its own stored rows plus the values of last layer's targets that the driver
all-gathers to it. It also returns, for the targets it owns, their stored state and stored input
value. The driver merges the partials (the merge function makes the order irrelevant), applies
update and keeps the new target values for the next layer. Layers whose messages read the
destination (GAT) first run a fetch job for the targets' input values (OMEGA's optional
all-gather of destination embeddings). The answers equal the in-process executor's (tested).
MessengerLayerExecutor runs the same `partition_task` in `sparkgnn-worker` processes instead.

What is NOT distributed: the request's computation-graph STRUCTURE (plans.py) is built on the
driver from G's topology held there; OMEGA's builders derive it per machine. Partials go to the
driver instead of all-to-all between machines, since a Spark job returns its results there.
"""
from __future__ import annotations

import os

import numpy as np
import torch

from sparkgnn.serving.context import Meter
from sparkgnn.serving.delta import LayerExecutor, owner_of

_SHARDS: dict = {}
_MODELS: dict = {}


class Shard:
    """One partition's stored rows, keyed by original id (sorted)."""

    def __init__(self, store_base: str, graph_dir: str, model, parts: int, p: int, states: bool):
        import pyarrow.parquet as pq

        from sparkgnn.pe.lookup import SortedTable, vectors

        v = pq.read_table(os.path.join(graph_dir, "vertices"), columns=["id", "x"])
        ids = v.column("id").to_numpy()
        mine = np.mod(ids, parts) == p
        x = vectors(v.column("x"), None, "graph features")[mine]
        with torch.no_grad():
            cols = {"h0": model.pre(torch.from_numpy(np.ascontiguousarray(x))).numpy()}
        self.layers = {0: None}
        table0 = SortedTable(ids[mine], cols, f"shard {p} features")
        self.tables = {0: table0}
        for l in range(1, model.num_layers):
            t = pq.read_table(os.path.join(store_base, f"layer={l}"))
            lid = t.column("id").to_numpy()
            keep = np.mod(lid, parts) == p
            c = {"h": vectors(t.column("h"), None, f"store layer {l} h")[keep]}
            if states:
                c["state"] = vectors(t.column("state"), None, f"store layer {l} state")[keep]
            self.tables[l] = SortedTable(lid[keep], c, f"shard {p} layer {l}")

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
    key = (cfg["store_base"], cfg["graph_dir"], cfg["parts"], p, cfg["states"])
    if key not in _SHARDS:
        _SHARDS[key] = Shard(cfg["store_base"], cfg["graph_dir"], _model(cfg["model_path"]),
                             cfg["parts"], p, cfg["states"])
    return _SHARDS[key]


@torch.no_grad()
def partition_task(p: int, cfg: dict, job: dict) -> dict:
    """Runs inside a Spark task. job["kind"] is "fetch" (stored input values of owned targets)
    or "partials" (partial states of the edges whose source this partition owns, plus stored
    states and input values of owned targets)."""
    shard = _shard(cfg, p)
    out = {"p": p}
    l0 = job["layer"] - 1
    own_t = job["target_owner"] == p
    fetch_rows = np.flatnonzero(own_t & job["target_stored_input"])
    out["input_rows"] = fetch_rows
    out["input"] = shard.value(l0, job["target_ids"][fetch_rows]) if len(fetch_rows) else None
    if job["kind"] == "fetch":
        return out
    conv = _model(cfg["model_path"]).convs[l0]
    agg = conv.aggregator
    parts_out, index_out = [], []
    for old in (False, True):
        sel = np.flatnonzero((job["edge_owner"] == p) & (job["old"] == old))
        if not len(sel):
            continue
        # NEW messages read last layer's targets from job["given"] (src_key >= 0) and everything
        # else from this shard; OLD messages always read the stored values
        src_key = job["src_key"][sel] if not old else np.full(len(sel), -1)
        vals = np.empty((len(sel), job["width"]), np.float32)
        given = src_key >= 0
        if given.any():
            vals[given] = job["given"][src_key[given]]
        if (~given).any():
            ids, inv = np.unique(job["src_id"][sel][~given], return_inverse=True)
            rows = shard.value(l0, ids)                 # each stored row read once
            vals[~given] = rows[inv]
            out["fetched_bytes"] = out.get("fetched_bytes", 0) + int(rows.nbytes)
        stats = {k: torch.from_numpy(v[sel]) for k, v in (job["stats_old"] if old else job["stats_new"]).items()}
        payload = conv.prepare_src(torch.from_numpy(vals), stats, False)
        w = None if job["weight"] is None else torch.from_numpy(job["weight"][sel])
        dst = None if job["dst_payload"] is None else torch.from_numpy(
            (job["dst_payload_old"] if old else job["dst_payload"])[job["tgt"][sel]])
        m = conv.message(payload, dst, w, False)
        uniq, local = np.unique(job["tgt"][sel], return_inverse=True)
        part = agg.partial(m, torch.from_numpy(local), len(uniq))
        parts_out.append((agg.negate(part) if old else part).numpy())
        index_out.append(uniq)
    st_rows = np.flatnonzero(own_t & job["from_state"])
    if len(st_rows):
        parts_out.append(shard.state(job["layer"], job["target_ids"][st_rows]))
        index_out.append(st_rows)
        out["fetched_bytes"] = out.get("fetched_bytes", 0) + int(parts_out[-1].nbytes)
    out["states"] = parts_out
    out["index"] = index_out
    return out


class PartitionedLayerExecutor(LayerExecutor):
    """LayerExecutor whose per-partition work (`partition_task`) runs elsewhere: the driver builds
    each layer's job, `_run(job)` returns one result per partition, the driver merges and updates
    (module doc). The driver never reads stored rows; every one is read by its owning partition."""

    def __init__(self, ctx, model, store, graph_dir: str, model_path: str, parts: int, states: bool = True):
        super().__init__(ctx, model, stored=None, parts=parts)
        self.cfg = {"store_base": store.base, "graph_dir": os.path.abspath(graph_dir),
                    "model_path": os.path.abspath(model_path), "parts": int(parts), "states": bool(states)}
        self.jobs = 0

    def _run(self, job: dict) -> list:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def warm_up(self) -> None:
        """Load every shard where the partitions run (the 'cached PE store')."""
        job = {"kind": "fetch", "layer": 1, "target_owner": np.zeros(0, np.int64),
               "target_stored_input": np.zeros(0, bool), "target_ids": np.zeros(0, np.int64)}
        self._run(job)

    @torch.no_grad()
    def run_layer(self, work, prev_targets, prev_h, x_query, prep, meter: Meter, comm: dict):
        n = self.ctx.num_nodes
        conv = self.model.convs[work.layer - 1]
        agg = conv.aggregator
        t = len(work.targets)
        # which inputs come from last layer's targets (all-gathered by the driver: row in
        # `given`) and which from the stores (-1: read by the owning partition)
        given = x_query if prev_h is None else prev_h

        def key_of(nodes):
            if prev_h is None:
                return np.where(nodes >= n, nodes - n, -1)
            return self.ctx.sets.positions(prev_targets, nodes)

        t_key = key_of(work.targets)
        target_ids = np.where(work.targets < n, self.ctx.graph.ids[np.minimum(work.targets, n - 1)], -1)
        job = {"layer": work.layer, "target_owner": owner_of(self.ctx, prep, work.targets, self.parts),
               "target_stored_input": t_key < 0, "target_ids": target_ids}
        h_dst = torch.empty(t, given.shape[1] if t_key.max(initial=-1) >= 0 else self._width(work.layer - 1))

        def fill_inputs(results):
            nonlocal h_dst
            rows = [r for r in results if r["input"] is not None]
            if rows and h_dst.shape[1] != rows[0]["input"].shape[1]:
                h_dst = torch.empty(t, rows[0]["input"].shape[1])
            for r in rows:
                h_dst[torch.from_numpy(r["input_rows"])] = torch.from_numpy(r["input"])
                meter.bytes_fetched += int(r["input"].nbytes)
            if (t_key >= 0).any():
                h_dst[torch.from_numpy(t_key >= 0)] = given[torch.from_numpy(t_key[t_key >= 0])]

        stats_new_t = self._stats(conv, prep, work.targets, old=False)
        dst_payload = dst_payload_old = None
        if conv.needs_dst_in_message:
            with meter.timer("fetch_s"):
                fill_inputs(self._run({**job, "kind": "fetch"}))
            dst_payload = conv.prepare_dst(h_dst, stats_new_t).numpy()
            if work.old.any():
                raise NotImplementedError("destination-reading layers never subtract messages")
            job["target_stored_input"] = np.zeros(t, bool)
        src_key = key_of(work.src)
        src_g = np.minimum(work.src, n - 1)
        uniq, inv = np.unique(work.src, return_inverse=True)
        stats_new = {k: v.numpy()[inv] for k, v in self._stats(conv, prep, uniq, old=False).items()}
        stats_old = {k: v.numpy()[inv] for k, v in
                     self._stats(conv, prep, np.where(uniq < n, uniq, 0), old=True).items()}
        job.update(kind="partials", edge_owner=owner_of(self.ctx, prep, work.src, self.parts), old=work.old,
                   src_key=src_key, src_id=self.ctx.graph.ids[src_g], given=given.numpy(),
                   width=int(given.shape[1]), stats_new=stats_new, stats_old=stats_old,
                   weight=work.weight, tgt=work.tgt, dst_payload=dst_payload, dst_payload_old=dst_payload_old,
                   from_state=work.from_state)
        with meter.timer("compute_s"):
            results = self._run(job)
        if not conv.needs_dst_in_message:
            fill_inputs(results)
        states, index = [], []
        meter.bytes_fetched += sum(int(r.get("fetched_bytes", 0)) for r in results)
        for r in results:
            for s, i in zip(r["states"], r["index"]):
                states.append(torch.from_numpy(s))
                index.append(i)
                comm["partial_bytes"] += int(s.nbytes)
        with meter.timer("merge_s"):
            merged = (agg.merge(torch.cat(states), torch.from_numpy(np.concatenate(index)), t) if states
                      else agg.identity(t, conv.msg_width(False)))
        with meter.timer("compute_s"):
            h = self.model.post(work.layer - 1, conv.update(h_dst, agg.finalize(merged), stats_new_t, False))
        comm["allgather_bytes"] += int(h.numel() * 4 * self.parts)
        return h

    def _width(self, layer: int) -> int:
        return self.model.convs[layer].in_dim


class SparkLayerExecutor(PartitionedLayerExecutor):
    """The partitions as the P tasks of one Spark job per layer."""

    def __init__(self, ctx, model, spark, store, graph_dir: str, model_path: str, parts: int,
                 states: bool = True):
        super().__init__(ctx, model, store, graph_dir, model_path, parts, states)
        self.spark = spark

    def _run(self, job: dict) -> list:
        cfg, parts = self.cfg, self.parts
        self.jobs += 1
        rdd = self.spark.sparkContext.parallelize(range(parts), parts)
        return rdd.map(lambda p: partition_task(p, cfg, job)).collect()


def _attach(engine, build):
    """Give a reuse-mode engine the executor `build(ctx, model, store, parts, states)` makes, with
    its shards loaded now (closed again if loading fails)."""
    mode = engine.mode
    store = getattr(mode, "store", None) or engine.context.store
    executor = build(engine.context, mode.model, store, mode.partitions, mode.needs_states)
    try:
        executor.warm_up()
    except BaseException:
        executor.close()
        raise
    mode.executor = executor
    return executor


def use_spark_cgp(engine, spark, graph_dir: str, model_path: str, partitions: int | None = None):
    """Make a reuse-mode QueryEngine run its layers as Spark tasks over P shards (P defaults to
    the mode's `partitions`); loads the shards into the Python workers now."""
    return _attach(engine, lambda ctx, model, store, parts, states: SparkLayerExecutor(
        ctx, model, spark, store, graph_dir, model_path, int(partitions or parts), states))


EDGE_KEYS = ("edge_owner", "old", "src_key", "src_id", "tgt", "weight")


def edges_of_partition(job: dict, p: int) -> dict:
    """The job as partition p needs it: only the edges whose source it owns (a Spark broadcast
    ships one job to every task; a messenger frame should not carry the others' edges)."""
    if "edge_owner" not in job:
        return job
    mine = job["edge_owner"] == p
    out = dict(job)
    for key in EDGE_KEYS:
        if out.get(key) is not None:
            out[key] = job[key][mine]
    for key in ("stats_new", "stats_old"):
        out[key] = {name: v[mine] for name, v in job[key].items()}
    return out


class MessengerLayerExecutor(PartitionedLayerExecutor):
    """The same partitions served by DL workers through the messenger (`sparkgnn-worker`, op
    "serving_partials"): each worker caches the shards it was sent (affinity by partition), the
    frames are JSON + Arrow (cgp_wire.py). Partitions are called one after another."""

    def __init__(self, ctx, model, workers, store, graph_dir: str, model_path: str, parts: int,
                 states: bool = True):
        super().__init__(ctx, model, store, graph_dir, model_path, parts, states)
        from sparkgnn.engine.transports import get_transport

        self.workers = workers
        self.transport = get_transport(workers.spec)

    def _run(self, job: dict) -> list:
        from sparkgnn.serving.cgp_wire import request_frames, result_from_tables

        self.jobs += 1
        results = []
        for p in range(self.parts):
            header, tables = request_frames(p, self.cfg, edges_of_partition(job, p))
            _, out = self.transport.call(header, tables)
            results.append(result_from_tables(out))
        return results

    def close(self) -> None:
        self.workers.close()


def use_messenger_cgp(engine, workers: str, graph_dir: str, model_path: str, model_store: str,
                      partitions: int | None = None):
    """Run a reuse-mode engine's partitions on messenger workers: "local[N]" (starts a broker and
    N workers, stopped by executor.close()), "tcp://..." / "ipc://..." (a running broker whose
    workers can read graph_dir, model_path and the store). Loads the shards now."""
    from sparkgnn.engine.transports import workers_for

    os.makedirs(model_store, exist_ok=True)          # workers need one; serving loads model_path
    return _attach(engine, lambda ctx, model, store, parts, states: MessengerLayerExecutor(
        ctx, model, workers_for(workers, model_store), store, graph_dir, model_path,
        int(partitions or parts), states))
