"""Computation graph parallelism as Spark tasks (or messenger workers) over the cached PE store
(OMEGA section 6): the driver side. The worker side (shards cached per Python worker,
`partition_task`) is cgp_worker.py; both run the CGP kernel of cgp_kernel.py, which also defines
the exchanged bytes every executor reports.

Each of P Spark tasks owns one shard (the G vertices with id mod P == p). Per request and layer
the driver builds one job: the layer's edges with their owners, statistics and the values of
last layer's targets (all-gathered to every partition); each task returns its partial states,
and, for the targets it owns, their stored state and stored input value. The driver merges the
partials (the merge function makes the order irrelevant), applies update and keeps the new
target values for the next layer. Layers whose messages read the destination (GAT) first run a
fetch job for the targets' input values (OMEGA's optional all-gather of destination
embeddings). The answers equal the in-process executor's (tested). MessengerLayerExecutor runs
the same `partition_task` in `sparkgnn-worker` processes instead.

What is NOT distributed: the request's computation-graph STRUCTURE (plans.py) is built on the
driver from G's topology held there; OMEGA's builders derive it per machine. Partials go to the
driver instead of all-to-all between machines, since a Spark job returns its results there;
the bytes reported are still those that cross partitions (cgp_kernel.py), as in-process.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from sparkgnn.engine.spark_compat import run_tasks
from sparkgnn.serving.cgp_kernel import count_layer, merge_partials, owner_of
from sparkgnn.serving.cgp_wire import from_bytes, to_bytes
from sparkgnn.serving.cgp_worker import partition_task
from sparkgnn.serving.context import Meter
from sparkgnn.serving.delta import LayerExecutor


class PartitionedLayerExecutor(LayerExecutor):
    """LayerExecutor whose per-partition work (`partition_task`) runs elsewhere: the driver builds
    each layer's job, `_run(job)` returns one result per partition, the driver merges and updates
    (module doc). The driver never reads stored rows; every one is read by its owning partition."""

    def __init__(self, ctx, model, store, graph_dir: str, model_path: str, parts: int, states: bool = True):
        super().__init__(ctx, model, stored=None, parts=parts)
        self.cfg = {
            "store_base": store.base,
            "graph_dir": os.path.abspath(graph_dir),
            "model_path": os.path.abspath(model_path),
            "parts": int(parts),
            "states": bool(states),
        }
        # what a messenger worker must serve to run these partitions (serving.served): headers
        # name it by id, never by these paths
        self.spec = {
            "graph": self.cfg["graph_dir"],
            "model": self.cfg["model_path"],
            "store": store.base,
            "options": {},
            "cache": {},
        }
        self.jobs = 0

    def _run(self, job: dict) -> list:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def warm_up(self) -> None:
        """Load every shard where the partitions run (the 'cached PE store')."""
        job = {
            "kind": "fetch",
            "layer": 1,
            "target_owner": np.zeros(0, np.int64),
            "target_stored_input": np.zeros(0, bool),
            "target_ids": np.zeros(0, np.int64),
        }
        self._run(job)

    @torch.no_grad()
    def run_layer(self, work, prev_targets, prev_h, x_query, prep, meter: Meter, comm: dict):
        n = self.ctx.num_nodes
        conv = self.model.convs[work.layer - 1]
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
        job = {
            "layer": work.layer,
            "target_owner": owner_of(self.ctx, prep, work.targets, self.parts),
            "target_stored_input": t_key < 0,
            "target_ids": target_ids,
        }
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
        dst_payload = None
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
        stats_old = {
            k: v.numpy()[inv] for k, v in self._stats(conv, prep, np.where(uniq < n, uniq, 0), old=True).items()
        }
        job.update(
            kind="partials",
            edge_owner=owner_of(self.ctx, prep, work.src, self.parts),
            old=work.old,
            src_key=src_key,
            src_id=self.ctx.graph.ids[src_g],
            given=given.numpy(),
            width=int(given.shape[1]),
            stats_new=stats_new,
            stats_old=stats_old,
            weight=work.weight,
            tgt=work.tgt,
            dst_payload=dst_payload,
            from_state=work.from_state,
        )
        with meter.timer("compute_s"):
            results = self._run(job)
        if not conv.needs_dst_in_message:
            fill_inputs(results)
        meter.bytes_fetched += sum(int(r.get("fetched_bytes", 0)) for r in results)
        with meter.timer("merge_s"):
            merged = merge_partials(
                conv,
                [torch.from_numpy(s) for r in results for s in r["states"]],
                [i for r in results for i in r["index"]],
                t,
            )
        with meter.timer("compute_s"):
            h = self.model.post(
                work.layer - 1, conv.update(h_dst, conv.aggregator.finalize(merged), stats_new_t, False)
            )
        count_layer(comm, (int(r["partial_bytes"]) for r in results), h, self.parts)
        return h

    def _width(self, layer: int) -> int:
        return self.model.convs[layer].in_dim


class SparkLayerExecutor(PartitionedLayerExecutor):
    """The partitions as the P tasks of one Spark job per layer (spark_compat.run_tasks: a
    mapInArrow over spark.range, which a Spark Connect session runs too; results come back in
    cgp_wire's Arrow codec, never pickled)."""

    def __init__(self, ctx, model, spark, store, graph_dir: str, model_path: str, parts: int, states: bool = True):
        super().__init__(ctx, model, store, graph_dir, model_path, parts, states)
        self.spark = spark

    def __getstate__(self) -> dict:
        # A session does not travel: through Spark Connect the streaming job's handler (and this
        # executor with it) is pickled into the server's foreachBatch process, which has its own.
        return dict(self.__dict__, spark=None)

    def _session(self):
        if self.spark is None:
            from sparkgnn.engine.session import active_session

            self.spark = active_session()
            if self.spark is None:
                raise RuntimeError("SparkLayerExecutor: no active SparkSession in this process")
        return self.spark

    def _run(self, job: dict) -> list:
        cfg, parts = self.cfg, self.parts
        self.jobs += 1
        return run_tasks(self._session(), parts, lambda p: to_bytes(partition_task(p, cfg, job)), from_bytes)


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
    return _attach(
        engine,
        lambda ctx, model, store, parts, states: SparkLayerExecutor(
            ctx, model, spark, store, graph_dir, model_path, int(partitions or parts), states
        ),
    )


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
    frames are JSON + Arrow (cgp_wire.py) and name the deployment by id. Partitions are called
    one after another.

    `workers` is a workers spec (runners.workers_for). The workers must serve this executor's
    deployment (serving.served): "local[N]" workers are started with a deployments file naming
    it (in a private folder, removed by close()); "inprocess" registers it in this process; the
    workers of a running broker (tcp:// / ipc://) must have been started with it
    (`sparkgnn-worker --deployments FILE`), else each partition is refused as not served."""

    def __init__(
        self,
        ctx,
        model,
        workers: str,
        model_store: str,
        store,
        graph_dir: str,
        model_path: str,
        parts: int,
        states: bool = True,
    ):
        super().__init__(ctx, model, store, graph_dir, model_path, parts, states)
        from sparkgnn.runners import get_transport, workers_for
        from sparkgnn.serving import served

        self.deployment = served.deployment_id(self.spec)
        self._private: str | None = None
        self._registered = workers in (None, "inprocess")
        deployments = None
        if self._registered:
            served.register(self.spec)
        elif isinstance(workers, str) and workers.startswith("local"):
            import tempfile

            self._private = tempfile.mkdtemp(prefix="sparkgnn-cgp-")  # 0700: only this user writes in it
            deployments = os.path.join(self._private, "deployments.json")
            served.write_file(deployments, [self.spec])
        try:
            self.workers = workers_for(workers, model_store, deployments=deployments)
            self.transport = get_transport(self.workers.spec)
        except BaseException:
            self._release()
            raise

    def _run(self, job: dict) -> list:
        from sparkgnn.serving.cgp_wire import request_frames, result_from_tables

        self.jobs += 1
        results = []
        states = self.cfg["states"]
        for p in range(self.parts):
            header, tables = request_frames(p, self.deployment, self.parts, states, edges_of_partition(job, p))
            _, out = self.transport.call(header, tables)
            results.append(result_from_tables(out))
        return results

    def close(self) -> None:
        try:
            self.workers.close()
        finally:
            self._release()

    def _release(self) -> None:
        """Withdraw the in-process registration / remove the private deployments file."""
        from sparkgnn.serving import served

        if self._registered:
            self._registered = False
            served.withdraw(self.deployment)
        if self._private is not None:
            import shutil

            shutil.rmtree(self._private, ignore_errors=True)
            self._private = None


def use_messenger_cgp(
    engine, workers: str, graph_dir: str, model_path: str, model_store: str, partitions: int | None = None
):
    """Run a reuse-mode engine's partitions on messenger workers: "local[N]" (starts a broker and
    N workers serving this deployment, stopped by executor.close()), "inprocess", or
    "tcp://..." / "ipc://..." (a running broker whose workers were started with this deployment:
    MessengerLayerExecutor). Loads the shards now."""
    os.makedirs(model_store, exist_ok=True)  # workers need one; serving loads model_path
    return _attach(
        engine,
        lambda ctx, model, store, parts, states: MessengerLayerExecutor(
            ctx,
            model,
            workers,
            model_store,
            store,
            graph_dir,
            model_path,
            int(partitions or parts),
            states,
        ),
    )
