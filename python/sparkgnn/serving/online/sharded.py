"""Pool kind "sharded": a deployment whose PE store is split over S worker processes, each holding
only its shard, answered by computation graph parallelism (OMEGA's CGP, serving/cgp_kernel.py).

    {"name": "shards", "kind": "sharded", "shards": 4, "memory_budget_bytes": 2000000000,
     "transport": "ipc", "width": 2, "replicas": [2, 1, 1, 1], "threads": 1, "timeout_s": 60}

Shard p of S holds the G vertices whose original id mod S == p: their features after the model's
`pre` ops, their stored h^(1..k-1) and, for a store with states, their states (cgp_worker.Shard).
Each shard has its own messenger broker and its own sparkgnn-workers (messenger.LocalCluster), so a
shard's rows never land in another shard's worker (one broker over S workers would hand a partition
to whichever worker is free). The front process holds G and the model; per batch it runs the
reuse-mode engine whose executor (sharded_engine.ShardedLayerExecutor) sends each layer's job to
the S owners at once (only the edges whose source each owns) and merges their partial states
exactly (cgp_kernel.merge_partials): answers equal a replicated pool's up to float summation order.

Modes: HE, SRPE and EXACT (the modes CGP serves: their layers read the PE store). FULL and NS
recompute from G's raw features in one process and auto picks a mode per request, so a
deployment with a sharded pool may serve none of them; nor SRPE's "ae" policy (its oracle reads
every stored layer in the front), a `partitions` mode option (the pool sets it), a hot cache
(its rows would be the whole store in one process) or `follow_store` (see Swaps). `sharded_problem`
refuses each at config time, naming why.

Memory budget: `memory_budget_bytes` bounds the rows each shard worker holds for the deployment
(ids, features after `pre`, stored values and states: `shard_bytes`, computed from G's ids and the
store's manifest before any worker starts, equal to what the worker then loads); a shard over it
refuses the start, naming each shard's bytes, the budget and the smallest shard count that fits.
The budget does not cover the interpreter and torch (a few hundred MB per worker).

Hot shards replicated: `replicas` (an int for every shard, or a list of S ints, default 1) starts
that many workers on a shard's broker, each holding the shard; the broker leases each job to a
free one, so a shard that most requests touch (a hub's owner) answers up to `replicas` batches at
once instead of queueing them -- the pool runs `width` batches at once, so give it width >= the
largest replica count -- and a killed replica leaves the others answering while it is replaced.
Replicated pools ("workers", "inprocess") and sharded ones mix in one deployment.

A killed worker: its call waits in its shard's broker (which requeues the lease when the worker's
heartbeats stop); the pool, which watches its workers while a fan-out is in flight and before
each batch, starts a replacement, which reloads the shard from the store and answers the
re-sent job, so no answer is lost or changed.

What the workers serve is registered by the pool (a deployments file in a 0700 folder, naming the
graph, model and store base), never sent: a job names the shard deployment by id (serving.served).
`transport` "inprocess" keeps the S shards in the front's own process (cgp_worker's shard cache;
the same frames through cgp_wire): for tests and small deployments.

Swaps: a sharded pool serves the version it started with; a swap is refused (SwapRefused) naming
the pool, since its workers would hold the old and the new shards at once, past the budget.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from sparkgnn.serving.online.pools import POOL_KINDS, FrontAnswered, ServeError

log = logging.getLogger(__name__)

SHARDED_MODES = ("he", "srpe", "exact")
MAX_REPLICAS = 64
SHARD_TRANSPORTS = ("ipc", "tcp", "inprocess")
MAX_SHARDS = 4096
_WATCH_S = 0.25  # how often a fan-out in flight checks its shard workers


def graph_ids(graph_dir: str) -> np.ndarray:
    """The original ids of G's vertices (the vertices' `id` column only)."""
    import pyarrow.parquet as pq

    return pq.read_table(os.path.join(graph_dir, "vertices"), columns=["id"]).column("id").to_numpy()


def shard_bytes(ids: np.ndarray, model, store, shards: int, states: bool) -> list[int]:
    """Bytes of the rows shard p of `shards` holds (cgp_worker.Shard.nbytes): per owned vertex an
    8-byte id and the model's layer-1 input for layer 0, and per stored layer 1..k-1 an id, h and
    (with `states`) the state, float32."""
    rows = np.bincount(np.mod(np.asarray(ids, np.int64), shards), minlength=shards)
    per_row = 8 + 4 * int(model.convs[0].in_dim)
    for layer in range(1, model.num_rounds):
        per_row += 8 + 4 * int(store.width(layer))
        if states:
            per_row += 4 * int(store.state_width(layer) or 0)
    return [int(r) * per_row for r in rows]


def replicas_of(replicas: Any, shards: Any, name: str) -> list[int]:
    """Workers per shard for pool `name`'s `replicas` setting (module doc): an int for every shard
    or a list of `shards` ints, each in 1..MAX_REPLICAS; ServeError naming what is wrong otherwise."""
    count = shards if isinstance(shards, int) and not isinstance(shards, bool) else 0
    if replicas is None:
        return [1] * count
    per_shard = [replicas] * count if isinstance(replicas, int) and not isinstance(replicas, bool) else replicas
    if (
        not isinstance(per_shard, list)
        or len(per_shard) != count
        or not all(isinstance(r, int) and not isinstance(r, bool) and 1 <= r <= MAX_REPLICAS for r in per_shard)
    ):
        raise ServeError(
            f"pool {name!r}: replicas must be an integer in 1..{MAX_REPLICAS} or a list of one such per shard "
            f"({count} shards), got {replicas!r}"
        )
    return list(per_shard)


def budget_problem(name: str, ids: np.ndarray, model, store, shards: int, budget: int | None) -> str | None:
    """Why pool `name`'s shards do not fit `budget` bytes per worker (one line with the numbers
    and the smallest shard count that fits), or None."""
    sizes = shard_bytes(ids, model, store, shards, store.with_states)
    if budget is None or max(sizes) <= budget:
        return None
    first = max(shards + 1, -(-sum(sizes) // budget))  # fewer shards cannot fit: their rows sum to this
    fits = next(
        (
            s
            for s in range(first, min(MAX_SHARDS, 2 * first + 8) + 1)
            if max(shard_bytes(ids, model, store, s, store.with_states)) <= budget
        ),
        None,
    )
    hint = f"{fits} shards fit" if fits else f"no shard count up to {min(MAX_SHARDS, 2 * first + 8)} fits"
    return (
        f"pool {name!r}: its {shards} shards need {', '.join(str(b) for b in sizes)} bytes per worker, over "
        f"memory_budget_bytes {budget} ({hint}; or raise the budget)"
    )


def check_budgets(config, model, store) -> None:
    """Refuse (ServeError) a deployment whose sharded pools' shards exceed their memory budget,
    before any worker of any pool starts."""
    pools = [p for p in config.pools if p.get("kind") == "sharded" and p.get("memory_budget_bytes") is not None]
    if not pools or store is None:
        return
    ids = graph_ids(config.graph)
    for spec in pools:
        problem = budget_problem(spec["name"], ids, model, store, int(spec["shards"]), int(spec["memory_budget_bytes"]))
        if problem:
            raise ServeError(f"deployment of graph {config.graph}: {problem}")


def sharded_problem(config) -> str | None:
    """Why `config` (a ServeConfig) cannot run its sharded pools (module doc), or None."""
    pools = [p for p in config.pools if isinstance(p, dict) and p.get("kind") == "sharded"]
    if not pools:
        return None
    names = ", ".join(repr(p.get("name")) for p in pools)
    unserved = sorted({m for m in [config.mode, *config.modes] if m not in SHARDED_MODES})
    if unserved:
        return (
            f"sharded pool {names} cannot serve mode(s) {', '.join(unserved)}: computation graph parallelism "
            f"runs only {', '.join(SHARDED_MODES)} over shards of the PE store (full and ns recompute from "
            "G's raw features in one process, auto picks a mode per request); every pool serves every mode"
        )
    if not config.store:
        return f"sharded pool {names} needs a PE store (store): its workers hold shards of it"
    options = config.mode_options or {}
    if str((options.get("srpe") or {}).get("policy", "qer")) == "ae":
        return f"sharded pool {names} cannot run srpe's 'ae' policy: its oracle reads every stored layer in one process"
    if any("partitions" in (o or {}) for o in options.values()):
        return f"sharded pool {names}: mode_options may not set partitions (the pool runs its shards as the partitions)"
    if str((config.cache or {}).get("policy", "off")) != "off":
        return (
            f"sharded pool {names}: the hot cache must be off (it would copy rows of the whole store into one process)"
        )
    if config.follow_store:
        return f"sharded pool {names} serves the version it started with: follow_store (swaps) is not supported"
    for p in pools:
        if isinstance(p.get("shards"), int) and p["shards"] > MAX_SHARDS:
            return f"sharded pool {p.get('name')!r}: shards must be at most {MAX_SHARDS}, got {p['shards']}"
        if p.get("device", "cpu") != "cpu":
            return f"sharded pool {p.get('name')!r}: device must be 'cpu' (the CGP kernels run on the CPU)"
    return None


@POOL_KINDS.register("sharded")
class ShardedPool(FrontAnswered):
    """S shard workers and the front-side deployment answering batches over them (module doc); a
    warm-up loads every shard (the engine's executor warms them) and answers the probe."""

    def __init__(
        self,
        name: str,
        shards: int | None = None,
        width: int = 1,
        threads: int = 1,
        timeout_s: float = 60.0,
        transport: str = "ipc",
        memory_budget_bytes: int | None = None,
        replicas: int | list[int] | None = None,
        **_,
    ):
        """Starts nothing: `register` (the deployment's first spec) checks the budget, then starts
        the shard workers."""
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
            raise ServeError(f"pool {name!r}: shards must be an integer in 1..{MAX_SHARDS}, got {shards!r}")
        if transport not in SHARD_TRANSPORTS:
            raise ServeError(
                f"pool {name!r}: transport must be one of {', '.join(SHARD_TRANSPORTS)}, got {transport!r}"
            )
        self.name, self.width, self.shards = name, int(width), int(shards)
        self.replicas = replicas_of(replicas, self.shards, name)
        self.transport = transport
        self.memory_budget_bytes = memory_budget_bytes
        self.shard_bytes: list[int] = []  # per shard, once registered
        self.replaced = 0  # shard workers replaced after they died
        self._threads, self._timeout_s = int(threads), float(timeout_s)
        self._key: str | None = None  # the deployment served (the service's spec)
        self._shard_key: str | None = None  # what the shard workers serve (graph, model, store base)
        self._states = False
        self.cache: Any = None  # sharded_engine.ShardedDeploymentCache, once registered
        self.clusters: list = []  # one messenger.LocalCluster (broker + `replicas` workers) per shard
        self._dealers: list[queue.Queue] = []  # per shard: `width` dealers
        self._calls: ThreadPoolExecutor | None = None
        self._dir: str | None = None
        self._lock = threading.Lock()

    # -- deployments -----------------------------------------------------------------------
    def register(self, spec: dict) -> str:
        """Serve `spec`: its shards' bytes checked against the budget, then the shard workers
        started (the first spec); a second spec is refused (module doc, Swaps)."""
        from sparkgnn.serving import served
        from sparkgnn.serving.online.deployments import SwapRefused

        key = served.deployment_id(spec)
        with self._lock:
            if self._key == key:
                return key
            if self._key is not None:
                raise SwapRefused(
                    f"swap refused: pool {self.name!r} is sharded and serves the version it started with "
                    "(its workers would hold two versions' shards); restart the service to serve another one"
                )
            try:
                self._start(spec)
            except BaseException:
                self._stop_workers()
                raise
            self._key = key
        return key

    def _start(self, spec: dict) -> None:
        from sparkgnn.models import Model
        from sparkgnn.pe.store import PEStore
        from sparkgnn.serving import served
        from sparkgnn.serving.online.sharded_engine import ShardedDeploymentCache

        if not spec.get("store"):
            raise ServeError(f"pool {self.name!r}: a sharded pool needs a PE store: its workers hold shards of it")
        model = Model.load(spec["model"])
        store = PEStore.open(spec["store"], model=model, graph=spec["graph"], verify="sizes")
        ids = graph_ids(spec["graph"])
        problem = budget_problem(self.name, ids, model, store, self.shards, self.memory_budget_bytes)
        if problem:
            raise ServeError(problem)
        self._states = store.with_states
        self.shard_bytes = shard_bytes(ids, model, store, self.shards, self._states)
        shard_spec = {
            "graph": os.path.abspath(spec["graph"]),
            "model": os.path.abspath(spec["model"]),
            "store": store.base,
            "options": {},
            "cache": {},
        }
        self._shard_key = served.deployment_id(shard_spec)
        if self.transport == "inprocess":
            served.register(shard_spec)
        else:
            self._start_workers(shard_spec)
        served.register(spec)  # the front's deployment cache answers batches naming it
        self.cache = ShardedDeploymentCache(shards=self.shards, states=self._states, fan_out=self.fan_out)
        log.info(
            "pool %r: %d shards of PE store %s over %s, bytes per shard %s (budget %s), workers per shard %s",
            self.name,
            self.shards,
            store.base,
            self.transport,
            self.shard_bytes,
            self.memory_budget_bytes,
            self.replicas,
        )

    def _start_workers(self, shard_spec: dict) -> None:
        """One broker and `replicas` workers per shard, started at once, all serving `shard_spec`
        from a deployments file in this pool's 0700 folder."""
        from sparkgnn.messenger.local import LocalCluster
        from sparkgnn.serving import served

        self._dir = tempfile.mkdtemp(prefix="sparkgnn-shards-")  # 0700: only this user writes in it
        models = os.path.join(self._dir, "models")  # the worker CLI wants a model store
        os.mkdir(models)
        deployments = os.path.join(self._dir, "deployments.json")
        served.write_file(deployments, [shard_spec])
        self.clusters = [
            LocalCluster(
                replicas,
                model_store=models,
                deployments=deployments,
                threads=self._threads,
                slots=1,
                heartbeat_s=0.5,
                transport=self.transport,
            )
            for replicas in self.replicas
        ]
        errors: list[BaseException] = []

        def start(cluster) -> None:
            try:
                cluster.start()
            except BaseException as exc:  # noqa: BLE001 - raised below, in the caller's thread
                errors.append(exc)

        starters = [threading.Thread(target=start, args=(c,), daemon=True) for c in self.clusters]
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        if errors:
            raise errors[0]
        for cluster in self.clusters:
            dealers: queue.Queue = queue.Queue()
            for _ in range(self.width):
                dealers.put(cluster.client(timeout_s=self._timeout_s, retries=3, window=1))
            self._dealers.append(dealers)
        self._calls = ThreadPoolExecutor(self.shards * self.width, thread_name_prefix=f"sparkgnn-shards-{self.name}")

    def withdraw(self, key: str) -> None:
        """Stop serving `key` (only the version it started with is ever registered)."""
        from sparkgnn.serving import served

        with self._lock:
            if key == self._key:
                self._key = None
                served.withdraw(key)

    # -- batches ---------------------------------------------------------------------------
    def call(self, slot: int, header: dict, tables: dict) -> dict:
        from sparkgnn.serving.online import batch_op

        if self.cache is None:
            raise ServeError(f"pool {self.name!r} has no deployment registered")
        self._replace_dead_workers()
        run = batch_op.serve_evict if header.get("op") == batch_op.EVICT_OP else batch_op.serve_batch
        return run(header, tables, self.cache)

    def fan_out(self, job: dict) -> list[dict]:
        """One CGP job to every shard owner with work in it at once (each gets only the edges
        whose source it owns: spark_cgp.edges_of_partition); their results in partition order.
        A shard with nothing to do for the job (cgp_worker.idle_partition: no owned edge source
        or target read) is not sent it: its empty result is built here, sparing a round trip."""
        from sparkgnn.serving.cgp_wire import handle, request_frames, result_from_tables
        from sparkgnn.serving.cgp_worker import idle_partition
        from sparkgnn.serving.spark_cgp import edges_of_partition

        if self._shard_key is None:
            raise ServeError(f"pool {self.name!r} has no deployment registered")
        results: list[Any] = [idle_partition(job, p) for p in range(self.shards)]
        busy = [p for p, r in enumerate(results) if r is None]
        frames = {
            p: request_frames(p, self._shard_key, self.shards, self._states, edges_of_partition(job, p)) for p in busy
        }
        if self._calls is None:  # transport "inprocess"
            for p, (header, tables) in frames.items():
                results[p] = result_from_tables(handle(header, tables))
            return results
        futures = {p: self._calls.submit(self._call_shard, p, h, t) for p, (h, t) in frames.items()}
        pending = set(futures.values())
        while pending:
            _, pending = wait(pending, timeout=_WATCH_S)
            if pending:  # a shard slow to answer may have lost its worker: replace it
                self._replace_dead_workers()
        for p, future in futures.items():
            results[p] = result_from_tables(future.result())
        return results

    def _call_shard(self, p: int, header: dict, tables: dict) -> dict:
        dealers = self._dealers[p]
        dealer = dealers.get()
        try:
            _, out = dealer.call(dict(header), tables)
            return out
        finally:
            dealers.put(dealer)

    def _replace_dead_workers(self) -> None:
        with self._lock:
            for p, cluster in enumerate(self.clusters):
                for i, worker in enumerate(cluster.workers):
                    if worker.poll() is None:
                        continue
                    log.warning("pool %r: worker %d of shard %d died; starting a replacement", self.name, i, p)
                    replacement = cluster.add_worker()  # appended; it takes the dead one's place
                    cluster.workers.pop()
                    cluster.workers[i] = replacement
                    self.replaced += 1

    def worker_pids(self) -> list[int]:
        """The live shard workers, shard by shard (the front's own pid for transport "inprocess")."""
        if self.transport == "inprocess":
            return [os.getpid()]
        return [w.pid for c in self.clusters for w in c.workers if w.poll() is None]

    def close(self) -> None:
        from sparkgnn.serving import served

        with self._lock:
            if self._key is not None:
                served.withdraw(self._key)
                self._key = None
            self._stop_workers()
        if self.cache is not None:
            self.cache.clear()

    def _stop_workers(self) -> None:
        from sparkgnn.serving import served

        if self._calls is not None:
            self._calls.shutdown(wait=False, cancel_futures=True)
            self._calls = None
        for dealers in self._dealers:
            while not dealers.empty():
                dealers.get_nowait().close()
        self._dealers = []
        for cluster in self.clusters:
            cluster.stop()
        self.clusters = []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        if self.transport == "inprocess" and self._shard_key is not None:
            served.withdraw(self._shard_key)
        self._shard_key = None
