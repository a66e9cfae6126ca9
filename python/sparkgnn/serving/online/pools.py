"""Worker pools of the online service, chosen by kind (POOL_KINDS), and Quiver's router.

A pool runs batches (op "serve_batch", serving.online.batch_op) on `width` slots at once:
  inprocess  the front end's own process (one process with all shards: the small deployment,
             and what the tests use); slots share the GIL, so width 1 is the useful value
  sharded    S shard workers, each holding only its shard of the PE store; a batch runs as
             computation graph parallelism over them (serving.online.sharded)
  workers    `width` sparkgnn-worker processes behind a messenger broker (messenger.LocalCluster),
             each with its own copy of the deployment in memory and `threads` torch threads; one
             dealer per slot, so batches run in parallel. `transport` "ipc" (default) or "tcp"
             (loopback ports, every socket CURVE-keyed with the run's keys). A worker that dies
             mid-batch is noticed by the broker's heartbeats and the batch is re-sent to another
             worker (the dealer's retries); the pool then starts a replacement.

What a pool's workers serve is registered by the pool, never sent in a batch (serving.served):
`register(spec)` makes a deployment servable and returns its id, which batches name; `withdraw(id)`
takes it back (before the front end has workers drop it: op "serve_evict" drops only withdrawn
ids). The in-process pool registers in its own process; a worker pool rewrites the deployments
file its workers were started with (`--deployments`, in a folder only this user can enter),
which they re-read when a batch names an id they do not know yet.

`broadcast` sends one message to EVERY worker of a pool (a swap's warm-up, a retired version's
eviction), outside the dispatch slots: the broker gives a lease to any free worker, so it sends
rounds of calls on control dealers of its own until each live worker's pid has answered (a
worker that just answered goes to the back of the broker's LRU queue, so the next round reaches
the others), or a deadline passes; it returns the answers by pid and the pids not reached.

ROUTERS decide which pool serves a batch. "psgs" is Quiver's rule (section 4.2.2): a batch whose
summed PSGS is below the threshold goes to the first pool (on a GPU host: the CPU pool, which
answers small batches faster), the rest to the second (the GPU pool; on this CPU-only machine a
wider CPU pool exercises the same code). A batch whose pool has no free slot while another pool
has one goes there instead (counted as an overflow), so the router never idles a worker.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time

from sparkgnn.errors import SparkGNNError
from sparkgnn.registry import Registry


class ServeError(SparkGNNError, ValueError):
    """The service's configuration is wrong (unknown pool kind or router, bad widths)."""


POOL_KINDS: Registry = Registry("worker pool kind", ServeError)
ROUTERS: Registry = Registry("router", ServeError)


class FrontAnswered:
    """A pool whose batches are answered in the front end's own process (the in-process pool, and
    the sharded pool, whose front runs CGP over its shard owners): a warm-up is one call, and a
    broadcast reaches that one process."""

    def call(self, slot: int, header: dict, tables: dict) -> dict:
        raise NotImplementedError

    def warm_up(self, header: dict, tables: dict) -> None:
        self.call(0, header, tables)

    def broadcast(
        self, header: dict, tables: dict, timeout_s: float, reached: set | None = None, call_timeout_s=None
    ) -> tuple[dict[int, dict], list[int]]:
        """The front end's own process: ({pid: result}, [])."""
        if reached and os.getpid() in reached:
            return {}, []
        return {os.getpid(): self.call(0, header, tables)}, []


@POOL_KINDS.register("inprocess")
class InProcessPool(FrontAnswered):
    def __init__(self, name: str, width: int = 1, threads: int = 1, **_):
        import torch

        from sparkgnn.serving.online.batch_op import DeploymentCache

        self.name, self.width = name, int(width)
        self._registered: set[str] = set()
        # this pool's loaded deployments: the pool is their worker. Every slot (its `width` and the
        # express lanes', dispatch.py) answers on the same one: a deployment answers calls at once
        self.cache = DeploymentCache()
        torch.set_num_threads(int(threads))

    def register(self, spec: dict) -> str:
        """Serve `spec` in this process (serving.served.register; once per pool); returns its id."""
        from sparkgnn.serving import served

        key = served.deployment_id(spec)
        if key not in self._registered:
            served.register(spec)
            self._registered.add(key)
        return key

    def withdraw(self, key: str) -> None:
        """Stop serving the deployment `key` as far as this pool is concerned (another server in
        this process may still serve it: registrations are counted)."""
        from sparkgnn.serving import served

        if key in self._registered:
            self._registered.discard(key)
            served.withdraw(key)

    def call(self, slot: int, header: dict, tables: dict) -> dict:
        from sparkgnn.serving.online import batch_op

        run = batch_op.serve_evict if header.get("op") == batch_op.EVICT_OP else batch_op.serve_batch
        return run(header, tables, self.cache)

    def call_requests(self, slot: int, header: dict, requests: list, *, checked: bool = False) -> tuple:
        """A batch of the front's own Request objects, answered as (wire.BatchAnswers, meta dict)
        (dispatch's path for this pool: no Arrow tables are built or read back); `checked`:
        intake validated them against the graph of the version `header` names, so the deployment
        does not validate them again."""
        from sparkgnn.serving.online import batch_op

        return batch_op.answer_requests(header, requests, self.cache, checked=checked)

    def worker_pids(self) -> list[int]:
        return [os.getpid()]

    def close(self) -> None:
        for key in list(self._registered):
            self.withdraw(key)
        self.cache.clear()


@POOL_KINDS.register("workers")
class WorkerPool:
    def __init__(
        self,
        name: str,
        width: int = 1,
        threads: int = 1,
        device: str = "cpu",
        timeout_s: float = 60.0,
        transport: str = "ipc",
        **_,
    ):
        """`transport`: "ipc" (sockets in a 0700 folder of this user's: the file system keeps other
        users out) or "tcp" (loopback ports, which any local user can reach: every socket then
        authenticates both ends with the run's CURVE keys, messenger.LocalCluster)."""
        from sparkgnn.messenger.local import LocalCluster
        from sparkgnn.serving import served

        self.name, self.width = name, int(width)
        self._dir = tempfile.mkdtemp(prefix="sparkgnn-serve-")  # 0700: only this user writes in it
        self._models = os.path.join(self._dir, "models")  # the worker CLI wants a model store
        os.mkdir(self._models)
        self._deployments_file = os.path.join(self._dir, "deployments.json")
        self._specs: dict[str, dict] = {}  # what the workers serve, by id
        served.write_file(self._deployments_file, [])
        self.cluster = LocalCluster(
            self.width,
            model_store=self._models,
            deployments=self._deployments_file,
            device=device,
            threads=int(threads),
            slots=1,
            heartbeat_s=0.5,
            transport=transport,
        ).start()
        self._timeout_s = float(timeout_s)
        self._dealers = [self.cluster.client(timeout_s=self._timeout_s, retries=3, window=1) for _ in range(self.width)]
        self._lock = threading.Lock()
        self._control: dict[float, list] = {}  # broadcast's dealers by call timeout (not the slots')
        self._control_lock = threading.Lock()  # one broadcast at a time

    def register(self, spec: dict) -> str:
        """Add `spec` to the deployments file the workers serve from; returns its id."""
        from sparkgnn.serving import served

        key = served.deployment_id(spec)
        with self._lock:
            if key not in self._specs:
                self._specs[key] = spec
                served.write_file(self._deployments_file, list(self._specs.values()))
        return key

    def withdraw(self, key: str) -> None:
        """Take `key` out of the workers' deployments file (they drop it on "serve_evict")."""
        from sparkgnn.serving import served

        with self._lock:
            if self._specs.pop(key, None) is not None:
                served.write_file(self._deployments_file, list(self._specs.values()))

    def call(self, slot: int, header: dict, tables: dict) -> dict:
        self._replace_dead_workers()
        _, result = self._dealers[slot].call(dict(header), tables)
        return result

    def warm_up(self, header: dict, tables: dict) -> None:
        """Every worker loads the deployment before the service takes requests (a first batch
        would otherwise pay seconds of loading): one batch per slot at once."""
        threads = [threading.Thread(target=self.call, args=(i, header, tables)) for i in range(self.width)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def broadcast(
        self, header: dict, tables: dict, timeout_s: float, reached: set | None = None, call_timeout_s=None
    ) -> tuple[dict[int, dict], list[int]]:
        """Send (header, tables) to every live worker not in `reached` (pids): ({pid: result},
        [pids not reached before timeout_s]). A worker's error (the op raised) is raised here, as
        is a call that got no answer within `call_timeout_s` (default: the pool's timeout_s)."""
        from sparkgnn.serving.online import wire

        deadline = time.monotonic() + timeout_s
        results: dict[int, dict] = {}
        done = set(reached or ())
        with self._control_lock:
            while True:
                self._replace_dead_workers()
                missing = sorted(set(self.worker_pids()) - done - set(results))
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    return results, missing
                call_s = float(call_timeout_s or self._timeout_s)
                dealers = self._control.setdefault(call_s, [])
                while len(dealers) < len(missing):
                    dealers.append(self.cluster.client(timeout_s=call_s, retries=1 if call_timeout_s else 3, window=1))
                answers: list = [None] * len(missing)
                threads = [
                    threading.Thread(target=_control_call, args=(dealers[i], header, tables, answers, i), daemon=True)
                    for i in range(len(missing))
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                failures = [a for a in answers if isinstance(a, Exception)]
                if failures:
                    raise failures[0]
                before = len(results)
                for answer in answers:
                    results[int(wire.read_meta(answer)["pid"])] = answer
                if len(results) == before:
                    time.sleep(0.05)  # every call went to workers already reached: let the others free up

    def worker_pids(self) -> list[int]:
        return [proc.pid for proc in self.cluster.workers if proc.poll() is None]

    def _replace_dead_workers(self) -> None:
        with self._lock:
            for i, proc in enumerate(self.cluster.workers):
                if proc.poll() is not None:
                    replacement = self.cluster.add_worker()  # appended; it takes the dead one's place
                    self.cluster.workers.pop()
                    self.cluster.workers[i] = replacement

    def close(self) -> None:
        for dealer in self._dealers + [d for dealers in self._control.values() for d in dealers]:
            dealer.close()
        self.cluster.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


def _control_call(dealer, header: dict, tables: dict, answers: list, i: int) -> None:
    try:
        answers[i] = dealer.call(dict(header), tables)[1]
    except Exception as exc:  # noqa: BLE001 - raised by broadcast, in the caller's thread
        answers[i] = exc


def make_pool(spec: dict):
    spec = dict(spec)
    kind = spec.pop("kind", "inprocess")
    return POOL_KINDS.lookup(kind)(**spec)


@ROUTERS.register("first")
def route_first(psgs: float, threshold: float | None, pools: list) -> int:
    """Every batch to the first pool (one pool, or routing off)."""
    return 0


@ROUTERS.register("psgs")
def route_psgs(psgs: float, threshold: float | None, pools: list) -> int:
    """Quiver: below the PSGS threshold the first pool, else the last."""
    if threshold is None or len(pools) < 2:
        return 0
    return 0 if psgs < threshold else len(pools) - 1


# pool kind "sharded" registers itself (it imports POOL_KINDS from here)
from sparkgnn.serving.online import sharded as _sharded  # noqa: E402, F401
