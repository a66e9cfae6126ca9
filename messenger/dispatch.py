"""The broker's bookkeeping, free of sockets so it can be unit-tested: an LRU queue of workers
with free slots, a bounded queue of lease requests, active leases, expiry and requeue.

Vocabulary: a *lease* is the right to send one batch's TASK to one worker's data endpoint. A
worker advertises `slots` (how many tasks may be assigned to it at once: one running, the next
one streaming into its socket meanwhile). Leases end with DONE from the worker, RELEASE from the
dealer, or a TTL (the dealer never used it). When a worker expires, each of its leases is
requeued at the *front* of the queue, keeping the dealer's token, so the dealer re-sends that
batch to the next worker.
"""

from __future__ import annotations

import itertools
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field


@dataclass
class Request:
    client: bytes
    token: str
    batch: object = None
    op: object = None
    ttl: float = 60.0
    affinity: object = None
    requeued: bool = False


@dataclass
class WorkerEntry:
    wid: bytes
    data: str
    slots: int
    expiry: float
    curve: str | None = None
    info: dict = field(default_factory=dict)
    busy_s: float = 0.0  # age of the task it is running, from its last heartbeat
    leases: dict = field(default_factory=dict)  # lease id -> None, in assignment order

    @property
    def free(self) -> int:
        return self.slots - len(self.leases)


@dataclass
class Lease:
    lease_id: str
    request: Request
    worker: bytes
    expires_at: float


Assignment = tuple  # (client identity, ASSIGN fields dict)


class Dispatcher:
    """LRU load balancing with bounded queueing. All methods take `now` (monotonic seconds)."""

    def __init__(
        self, *, liveness_s: float, max_queue: int = 1024, lease_grace_s: float = 5.0, stuck_after_s: float = 300.0
    ):
        self.liveness_s = liveness_s
        self.max_queue = max_queue
        self.lease_grace_s = lease_grace_s
        # Heartbeats come from a worker thread, so a hung handler still looks alive; a worker
        # whose current task has run this long gets no new leases until it finishes.
        self.stuck_after_s = stuck_after_s
        self.workers: OrderedDict[bytes, WorkerEntry] = OrderedDict()  # least recently used first
        self.queue: deque[Request] = deque()
        self.leases: dict[str, Lease] = {}
        self._by_token: dict[tuple, str] = {}
        prefix = uuid.uuid4().hex[:8]  # lease ids stay unique across broker restarts
        self._ids = (f"{prefix}-{n}" for n in itertools.count())
        self._affinity: dict[object, bytes] = {}  # request affinity -> worker it was last assigned to
        self.counts = dict(
            assigned=0, done=0, released=0, requeued=0, busy=0, leases_expired=0, workers_expired=0, queue_max=0
        )

    # -- workers ---------------------------------------------------------------------------
    def ready(self, wid: bytes, data: str, slots: int, now: float, curve=None, info=None) -> list:
        entry = self.workers.get(wid)
        if entry is None:
            entry = WorkerEntry(wid, data, max(1, int(slots)), now + self.liveness_s, curve, dict(info or {}))
            self.workers[wid] = entry
        else:
            entry.data, entry.slots, entry.curve = data, max(1, int(slots)), curve
            entry.info.update(info or {})
        entry.expiry = now + self.liveness_s
        return self._drain(now)

    def heard(self, wid: bytes, now: float, metrics=None, busy_s=None) -> list:
        """Refresh a worker's expiry (and what its heartbeat reports); returns assignments that
        became possible because a stuck worker recovered."""
        entry = self.workers.get(wid)
        if entry is None:
            return []
        entry.expiry = now + self.liveness_s
        if isinstance(metrics, dict):
            entry.info["metrics"] = metrics
        if isinstance(busy_s, (int, float)):
            was_stuck = self._stuck(entry)
            entry.busy_s = float(busy_s)
            if was_stuck and not self._stuck(entry):
                return self._drain(now)
        return []

    def _stuck(self, entry: WorkerEntry) -> bool:
        return entry.busy_s > self.stuck_after_s

    def done(self, wid: bytes, lease_id, now: float) -> list:
        self.heard(wid, now)
        lease = self.leases.get(lease_id)
        if lease is not None and lease.worker == wid:
            self._end(lease)
            self.counts["done"] += 1
        return self._drain(now)

    def disconnect(self, wid: bytes, now: float) -> list:
        entry = self.workers.pop(wid, None)
        return self._requeue(entry, now) if entry else []

    # -- dealers ---------------------------------------------------------------------------
    def request(self, req: Request, now: float) -> tuple[list, bool]:
        """(assignments to send, busy). Idempotent per (client, token): a repeated LEASE for a
        token that holds a lease gets the same ASSIGN again, one still queued is not queued twice."""
        key = (req.client, req.token)
        lease_id = self._by_token.get(key)
        if lease_id is not None:
            return [self._assignment(self.leases[lease_id])], False
        if any((q.client, q.token) == key for q in self.queue):
            return [], False
        if len(self.queue) >= self.max_queue:
            self.counts["busy"] += 1
            return [], True
        self.queue.append(req)
        self.counts["queue_max"] = max(self.counts["queue_max"], len(self.queue))
        return self._drain(now), False

    def release(self, client: bytes, now: float, lease_id=None, token=None) -> list:
        lease = self.leases.get(lease_id) if lease_id else None
        if lease is None and token is not None:
            by_token = self._by_token.get((client, token))
            lease = self.leases.get(by_token) if by_token is not None else None
            self.queue = deque(q for q in self.queue if (q.client, q.token) != (client, token))
        if lease is not None and lease.request.client == client:
            self._end(lease)
            self.counts["released"] += 1
        return self._drain(now)

    # -- time ------------------------------------------------------------------------------
    def expire(self, now: float) -> tuple[list, list]:
        """(expired worker entries, assignments made by requeueing their leases)."""
        dead = [w for w in self.workers.values() if w.expiry < now]
        assignments = []
        for entry in dead:
            del self.workers[entry.wid]
            self.counts["workers_expired"] += 1
            assignments += self._requeue(entry, now)
        for lease in [l for l in self.leases.values() if l.expires_at < now]:
            self._end(lease)
            self.counts["leases_expired"] += 1
        return dead, assignments + self._drain(now)

    # -- internals -------------------------------------------------------------------------
    def _requeue(self, entry: WorkerEntry, now: float) -> list:
        for lease_id in reversed(list(entry.leases)):
            lease = self.leases.pop(lease_id, None)
            if lease is None:
                continue
            self._by_token.pop((lease.request.client, lease.request.token), None)
            lease.request.requeued = True
            self.queue.appendleft(lease.request)
            self.counts["requeued"] += 1
        entry.leases.clear()
        return self._drain(now)

    def _end(self, lease: Lease) -> None:
        self.leases.pop(lease.lease_id, None)
        self._by_token.pop((lease.request.client, lease.request.token), None)
        entry = self.workers.get(lease.worker)
        if entry is not None:
            entry.leases.pop(lease.lease_id, None)

    def _pick(self, req: Request) -> WorkerEntry | None:
        wid = self._affinity.get(req.affinity) if req.affinity is not None else None
        preferred = self.workers.get(wid) if wid is not None else None
        if preferred is not None and preferred.free > 0 and not self._stuck(preferred):
            return preferred
        return next((w for w in self.workers.values() if w.free > 0 and not self._stuck(w)), None)

    def _drain(self, now: float) -> list:
        out = []
        while self.queue:
            entry = self._pick(self.queue[0])
            if entry is None:
                break
            req = self.queue.popleft()
            lease = Lease(next(self._ids), req, entry.wid, now + req.ttl + self.lease_grace_s)
            self.leases[lease.lease_id] = lease
            self._by_token[(req.client, req.token)] = lease.lease_id
            entry.leases[lease.lease_id] = None
            self.workers.move_to_end(entry.wid)  # most recently used goes last
            if req.affinity is not None:
                self._affinity[req.affinity] = entry.wid
            self.counts["assigned"] += 1
            out.append(self._assignment(lease))
        return out

    def _assignment(self, lease: Lease) -> Assignment:
        entry = self.workers[lease.worker]
        req = lease.request
        return req.client, dict(
            token=req.token,
            batch=req.batch,
            lease=lease.lease_id,
            worker=entry.wid.hex(),
            data=entry.data,
            curve=entry.curve,
            requeued=req.requeued,
            host=entry.info.get("host"),
            max_bytes=entry.info.get("max_bytes"),
            shm=bool(entry.info.get("shm")),
        )

    def snapshot(self) -> dict:
        return dict(
            self.counts,
            live_workers=len(self.workers),
            queue_depth=len(self.queue),
            leases_active=len(self.leases),
            free_slots=sum(max(0, w.free) for w in self.workers.values()),
            stuck_workers=sum(self._stuck(w) for w in self.workers.values()),
            workers=[
                dict(
                    data=w.data,
                    slots=w.slots,
                    leases=len(w.leases),
                    busy_s=w.busy_s,
                    **{k: w.info.get(k) for k in ("pid", "device", "metrics")},
                )
                for w in self.workers.values()
            ],
        )
