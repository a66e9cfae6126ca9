"""The dispatch side of the online service: the batcher thread takes batches from the scheduler
whenever a pool slot is free, the router picks their pool, and one dispatch thread per slot runs
each batch on its pool and answers its requests. With one pool there is nothing to route: each
dispatch thread takes its batches from the scheduler itself (no batcher, no hand-off per batch).

WHY this shape:
  - Work-conserving batches: a batch is formed when a slot frees up, so under load batches grow
    to T_d and under light load a request goes alone; a batch whose per-layer subgraph estimate
    exceeds T_s is divided (scheduler.divide), each part waiting for a slot of its own (one pool:
    the parts run one after the other on the slot that took the batch).
  - Express lanes (`config.express_lanes`, scheduler.py's module doc): batches are never
    preempted, so next to the first in-process pool's slots run that many lanes, each a thread
    that takes only requests within its ceiling (lane k: `max_wait_factor`**k x the predicted
    service of a cost-1 request, from the service model fitted to the batches served) and runs
    them in this process, and only while every slot of that pool runs a batch predicted to take
    longer than the lane's ceiling. A cheap request that arrives while an expensive batch holds
    the slot starts on a lane instead of waiting for it; behind cheap batches (an overload of
    single queries) the lanes stay idle and the slot fuses the requests. The general slots still
    serve everything, in the scheduler's order (promotion included). Lanes are extra threads of
    the front end's process, so they apply only to an "inprocess" pool; a worker pool's slots
    are its workers.
  - Routing (pools.ROUTERS, Quiver's PSGS threshold) with overflow: a batch whose pool has no free
    slot while another pool has one goes there instead (counted as "overflow").
  - Every wait has a timeout: a dispatch thread runs its batch's call itself, and a watchdog
    (batchwatch.py) answers "timeout" the requests of a call past `batch_timeout_s`; the slot
    stays taken until the call returns, so runaway calls never pile up; a request that waited
    past its deadline or `request_timeout_s` is answered "timeout" without work.
  - A batch is answered wholly by the Version it took when dispatched (versions.py).
  - Idle, no thread wakes (the watchdog once per `batch_timeout_s`): the batcher blocks on a free
    slot and on the scheduler (`take(None)`), the dispatch threads on their pool queue;
    `close_batcher` and `stop_dispatch` wake them (one sentinel per dispatch thread of every
    pool; the watchdog is closed).
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Callable

from sparkgnn.serving.online import wire
from sparkgnn.serving.online.admission import Admission
from sparkgnn.serving.online.batchwatch import BatchWatch
from sparkgnn.serving.online.config import ServeConfig
from sparkgnn.serving.online.deployments import batch_header
from sparkgnn.serving.online.intake import Outcome, Ticket
from sparkgnn.serving.online.pools import ROUTERS, InProcessPool, ServeError
from sparkgnn.serving.online.scheduler import ServiceModel, divide
from sparkgnn.serving.online.stats import Tally
from sparkgnn.serving.online.versions import VersionManager

BATCH_LOG_ENTRIES = 100_000  # batch_log keeps the first this many batches


class BatchDeadline(ServeError):
    """A batch's pool call did not return within the service's batch_timeout_s."""


class Dispatcher:
    """Batches from `scheduler` onto `pools` (module doc). `versions`: what each batch runs on;
    `service` and `admission`: fitted from every batch served; `dequeued`: called with the
    requests the batcher took out of the scheduler (intake's byte budget); `tally`: counts and
    delivers every Outcome; `lock`: the service's lock; `stop`: set when the service stops."""

    def __init__(
        self,
        config: ServeConfig,
        pools: list,
        scheduler,
        versions: VersionManager,
        *,
        service: ServiceModel,
        admission: Admission,
        dequeued: Callable[[list], None],
        tally: Tally,
        lock: threading.Lock,
        stop: threading.Event,
    ):
        self.config = config
        self.pools = pools
        self.scheduler = scheduler
        self.versions = versions
        self.service = service
        self.admission = admission
        self._dequeued = dequeued
        self._tally = tally
        self._lock = lock
        self._stop = stop
        self.route = ROUTERS.lookup(config.router)
        self.pool_queues: list[queue.Queue] = [queue.Queue() for _ in pools]
        self.busy = [0] * len(pools)  # slots running a batch, per pool (guarded by lock)
        self._free = threading.Semaphore(sum(p.width for p in pools) or 1)
        # express lanes: on the first in-process pool, as slots numbered after its own
        self.lane_pool = next((p for p, pool in enumerate(pools) if isinstance(pool, InProcessPool)), None)
        lanes = int(config.express_lanes) if self.lane_pool is not None else 0
        self.lanes = lanes
        # per slot of the lane pool: the predicted seconds of the batch it runs (0.0: idle); the
        # lanes' take condition reads it (a list of floats: each write is one atomic store)
        self.running_s = [0.0] * (pools[self.lane_pool].width if self.lane_pool is not None else 0)
        # the lanes wait here while their condition is false (no wake-up per request or batch); a
        # slot starting a batch above the lowest ceiling opens it, the close wakes it for good
        self._gate = threading.Condition()
        self._gate_closed = False
        # the batch deadline: the dispatch threads run each call themselves, one watchdog times them
        self.watch = BatchWatch(config.batch_timeout_s, self._late_batch)
        self._watch_thread: threading.Thread | None = None
        self._batcher: threading.Thread | None = None
        self.batch_log: list[dict] = []  # per batch: size, cost, psgs, pool, seconds (bounded)
        self.cache_stats: dict | None = None  # the hot cache, as the last batch reported it

    def start(self, spawn: Callable[..., threading.Thread]) -> None:
        """Start one dispatch thread per pool slot, the express lanes and, with several pools,
        the batcher, with `spawn(name, target, *args)`."""
        direct = len(self.pools) == 1
        for p, pool in enumerate(self.pools):
            for slot in range(pool.width):
                spawn(f"dispatch-{pool.name}-{slot}", self.take_loop if direct else self.dispatch_loop, p, slot)
        for lane in range(self.lanes):
            spawn(f"lane-{lane + 1}", self.lane_loop, lane + 1)
        self.start_watch()
        if not direct:
            self._batcher = spawn("batcher", self.batch_loop)

    def start_watch(self) -> None:
        """Start the batch deadline's watchdog (once): a thread of the dispatcher's own, ended by
        `stop_dispatch` after the dispatch threads, so it times the batches still running while
        the service stops."""
        if self._watch_thread is None:
            self._watch_thread = threading.Thread(target=self.watch.run, name="sparkgnn-serve-batch-watch", daemon=True)
            self._watch_thread.start()

    def lane_ceiling_s(self, lane: int) -> float:
        """Express lane `lane`'s ceiling (1-based): the predicted service seconds of the costliest
        request it takes, `max_wait_factor`**lane x that of a cost-1 request."""
        return float(self.config.max_wait_factor) ** lane * self.service.predict(1.0)

    def slots_held_above(self, seconds: float) -> bool:
        """Whether every slot of the lane pool runs a batch predicted to take more than `seconds`
        (an express lane's take condition: otherwise the request waits within its bound anyway)."""
        return bool(self.running_s) and min(self.running_s) > seconds

    def _lane_may_look(self, ceiling: float) -> bool:
        """A lane's gate (under `_gate`): the slots are held above its ceiling, or stopping."""
        return self._gate_closed or self.slots_held_above(ceiling)

    def lane_loop(self, lane: int) -> None:
        """Express lane `lane` (1-based): take the cheapest requests within its ceiling and run
        them on the lane's own slot of the in-process pool, until the service stops. Blocks on the
        gate while the slots are not held above its ceiling (a slot starting such a batch wakes
        it), then in the scheduler while no request fits (a push wakes it) until they free."""
        assert self.lane_pool is not None
        p = self.lane_pool
        pool = self.pools[p]
        slot = pool.width + lane - 1
        while True:
            ceiling = self.lane_ceiling_s(lane)
            held = functools.partial(self.slots_held_above, ceiling)
            with self._gate:
                self._gate.wait_for(functools.partial(self._lane_may_look, ceiling))
            if self._gate_closed or self.scheduler.closed:
                return
            batch = self.scheduler.take(None, within_s=ceiling, when=held)
            if not batch:  # the slots freed (back to the gate) or the scheduler closed
                continue
            self._dequeued(batch)
            with self._lock:
                self._tally.stats["lane_batches"] += 1
            for sub in divide(batch, self.config.t_s):
                tickets: list[Ticket] = [q.key for q in sub]  # type: ignore[misc]  # keys are Tickets
                if self._stop.is_set():
                    self.fail_tickets(tickets, "stopping", "the service is stopping")
                else:
                    self.run_batch(pool, slot, tickets)

    def close_batcher(self, left: list) -> None:
        """Stopping (the scheduler closed, `left` its requests never taken): answer those
        "stopping", end the batcher, then hand every dispatch thread of every pool its own
        sentinel, so no batch reaches a pool queue after it."""
        self.fail_stopped(left)
        with self._gate:  # the express lanes end
            self._gate_closed = True
            self._gate.notify_all()
        self._free.release()  # wakes the batcher if it waits for a slot
        if self._batcher is not None:
            self._batcher.join(timeout=5.0)
        for p, q in enumerate(self.pool_queues):
            for _ in range(self.pools[p].width):
                q.put(None)

    def stop_dispatch(self) -> None:
        """After the dispatch threads ended: answer "stopping" the batches still queued (left by
        a thread stuck in its call) and end the batch watchdog."""
        for q in self.pool_queues:
            while True:
                try:
                    tickets = q.get_nowait()
                except queue.Empty:
                    break
                if tickets is not None:
                    self.fail_tickets(tickets, "stopping", "the service is stopping")
        self.watch.close()
        if self._watch_thread is not None:
            self._watch_thread.join(timeout=5.0)

    def batch_loop(self) -> None:
        """Take a batch whenever a pool slot is free. Blocks while idle (no timeout polling):
        a dispatch thread's freed slot, a request, or stop wakes it."""
        while True:
            self._free.acquire()
            if self._stop.is_set():
                return
            batch = self.scheduler.take(None)
            if not batch:  # the scheduler was closed: stopping
                return
            self._dequeued(batch)
            subs = divide(batch, self.config.t_s)
            for i, sub in enumerate(subs):
                # every sub-batch beyond the first waits for a slot of its own, AFTER the ones
                # before it are queued (with one slot, the first must run to free it)
                if i:
                    self._free.acquire()
                    if self._stop.is_set():
                        for rest in subs[i:]:
                            self.fail_stopped(rest)
                        return
                tickets: list[Ticket] = [p.key for p in sub]  # type: ignore[misc]  # keys are Tickets
                psgs = sum(t.psgs for t in tickets)
                self.pool_queues[self.choose_pool(psgs)].put(tickets)

    def fail_tickets(self, tickets: list[Ticket], kind: str, error: str) -> None:
        """Answer every ticket of `tickets` with `kind` and `error`."""
        for t in tickets:
            self._tally.finish(t.deliver, Outcome(t.request.request_id, kind, error=error), t.mode)

    def fail_stopped(self, sub: list) -> None:
        """Answer the scheduler's requests `sub` (Pending, keyed by their Ticket) "stopping"."""
        self.fail_tickets([pending.key for pending in sub], "stopping", "the service is stopping")

    def choose_pool(self, psgs: float) -> int:
        """The pool (index) a batch of summed PSGS `psgs` goes to: the router's choice, or an
        idle pool when the chosen one has no free slot (an overflow)."""
        chosen = self.route(psgs, self.config.route_psgs, self.pools)
        with self._lock:
            if self.busy[chosen] + self.pool_queues[chosen].qsize() >= self.pools[chosen].width:
                idle = [i for i, p in enumerate(self.pools) if self.busy[i] + self.pool_queues[i].qsize() < p.width]
                if idle:
                    self._tally.stats["overflow"] += 1
                    chosen = idle[0]
        return chosen

    def take_loop(self, p: int, slot: int) -> None:
        """One pool (nothing to route): `slot` takes its batches from the scheduler itself and runs
        them, until the scheduler closes. A batch costs no hand-off to a batcher thread and back
        (two thread wake-ups); a batch divided by T_s runs its parts one after the other."""
        while True:
            batch = self.scheduler.take(None)
            if not batch:  # the scheduler was closed: stopping
                return
            self._dequeued(batch)
            for sub in divide(batch, self.config.t_s):
                self._serve(p, slot, [q.key for q in sub])  # type: ignore[misc]  # keys are Tickets

    def dispatch_loop(self, p: int, slot: int) -> None:
        """Run the batches of pool `p`'s queue on `slot` until its sentinel (None) comes; a batch
        still queued once the service is stopping is answered "stopping"."""
        while True:
            tickets = self.pool_queues[p].get()
            if tickets is None:
                return
            try:
                self._serve(p, slot, tickets)
            finally:
                self._free.release()

    def _serve(self, p: int, slot: int, tickets: list[Ticket]) -> None:
        """Run `tickets` as one batch on pool `p`'s `slot`, counted busy meanwhile; answered
        "stopping" instead once the service is stopping."""
        with self._lock:
            self.busy[p] += 1
        try:
            if self._stop.is_set():
                self.fail_tickets(tickets, "stopping", "the service is stopping")
            else:
                self.run_batch(self.pools[p], slot, tickets)
        finally:
            with self._lock:
                self.busy[p] -= 1

    def _late_batch(self, live: list[Ticket]) -> None:
        """A batch past its deadline (the watchdog's call): its requests are answered "timeout"
        now; the slot (and the batch's version) stays taken until the call returns, so a call that
        never ends holds one slot, never a growing number of threads."""
        self._tally.add("batch_timeouts")
        error = f"its batch ran past the service's batch deadline of {self.config.batch_timeout_s:g} s"
        self.fail_tickets(live, "timeout", error)

    def _live(self, tickets: list[Ticket], started: float) -> list[Ticket]:
        """The tickets still worth running at `started`; the others are answered "timeout"."""
        live = []
        for t in tickets:
            waited = started - t.arrived
            if started > t.deadline and waited <= self.config.request_timeout_s:
                self._tally.finish(  # no use starting it: its client stopped waiting
                    t.deliver,
                    Outcome(
                        t.request.request_id,
                        "timeout",
                        error=f"request waited {waited * 1e3:.0f} ms in the queue, past its "
                        f"deadline of {(t.deadline - t.arrived) * 1e3:.0f} ms",
                    ),
                )
            elif waited > self.config.request_timeout_s:
                self._tally.finish(
                    t.deliver,
                    Outcome(
                        t.request.request_id,
                        "timeout",
                        error=f"request waited {waited:.1f} s in the queue, over the "
                        f"service's request timeout of {self.config.request_timeout_s} s",
                    ),
                    t.mode,
                )
            else:
                live.append(t)
        return live

    def run_batch(self, pool, slot: int, tickets: list[Ticket]) -> None:
        """Run `tickets` as one batch on `pool`'s `slot` and answer each of them."""
        started = time.monotonic()
        live = self._live(tickets, started)
        if not live:
            return
        requests = [t.request for t in live]
        held = self.pools.index(pool) == self.lane_pool and slot < len(self.running_s)
        if held:
            self.running_s[slot] = self.service.predict(sum(t.cost for t in live))
            if self.lanes and self.slots_held_above(self.lane_ceiling_s(1)):  # opens the gate
                with self._gate:
                    self._gate.notify_all()
        version = self.versions.take()  # the whole batch is answered by this version (versions.py)
        watched = None
        try:
            header = batch_header(version, live[0].mode, requests)
            watched = self.watch.begin(live)
            if hasattr(pool, "call_requests"):  # answered in this process: no Arrow round trip
                checked = all(t.facts is version.facts for t in live)  # intake checked them against this version
                answers, meta = pool.call_requests(slot, header, requests, checked=checked)
                if not self.watch.end(watched):  # past the batch deadline: answered "timeout" already
                    return
            else:
                tables = pool.call(slot, header, wire.batch_tables(requests))
                if not self.watch.end(watched):
                    return
                meta = wire.read_meta(tables)
                answers = wire.BatchAnswers(tables["answer"], len(live))
        except Exception as exc:  # noqa: BLE001 - a failed batch fails its requests, never the service
            if watched is None or self.watch.end(watched):
                self.fail_tickets(live, "failed", f"the batch failed: {type(exc).__name__}: {exc}")
            return
        finally:
            self.versions.release(version)
            if held:
                opened = self.lanes and self.slots_held_above(self.lane_ceiling_s(1))
                self.running_s[slot] = 0.0
                if opened:  # lanes inside a take leave it for the gate
                    self.scheduler.poke()
        service = time.monotonic() - started
        cost = sum(t.cost for t in live)
        self.service.observe(cost, service)
        self.admission.observe(live[0].mode, cost, service)
        if meta.get("cache") is not None:
            self.cache_stats = meta["cache"]
        self._tally.metrics.batch(len(live))
        with self._lock:
            self._tally.stats["batches"] += 1
            if len(self.batch_log) < BATCH_LOG_ENTRIES:
                self.batch_log.append(
                    {
                        "requests": len(live),
                        "cost": cost,
                        "psgs": sum(t.psgs for t in live),
                        "pool": pool.name,
                        "lane": max(0, slot - pool.width + 1),  # 0: a pool slot, k: express lane k
                        "seconds": service,
                    }
                )
        errors = meta.get("errors", {})
        for i, t in enumerate(live):
            error = errors.get(str(i))
            outcome = Outcome(
                t.request.request_id,
                "error" if error else "ok",
                answer=None if error else answers.rows(i),
                error=error,
                queue_s=started - t.arrived,
                service_s=service,
                batch_requests=len(live),
                pool=pool.name,
                version=version.number,
            )
            self._tally.finish(t.deliver, outcome, t.mode)
