"""The request queue of an online GNN serving front end: which queued requests form the next batch.

WHY (GSM, section IV-A): exact online inference visits every neighbour, so a request's service time
follows the in-degrees of its query nodes, which are heavily skewed. Served first come, first
served, one expensive request holds up every cheap one behind it (head-of-line blocking,
Observation 1). The in-degree sum of a batch's query nodes predicts its service time well and costs
nothing to compute (Observation 2), so each request carries it as `cost`, and:

- "fifo" serves in arrival order (the baseline, GSM's S variant without degree scheduling);
- "degree" serves the cheapest requests first and fills a batch up to the in-degree sum T_d, the
  threshold the tuner picked to balance GPU utilisation against memory (tuner.py). Cheapest-first
  alone can starve an expensive request for as long as cheaper ones keep arriving (the paper's
  "Resource starvation" note: long-tail latency and unfairness, to be cured by a promotion scheme
  such as a multi-level feedback queue). So a request that has waited `max_wait_factor` times its
  own predicted service time is promoted: promoted requests go first, oldest first. Each batch
  takes at least one request, so a promoted request is served after at most the promoted requests
  older than it: every request is served, and its wait is bounded by its own predicted cost.

Express lanes (`take(within_s=...)`): a batch in service is never preempted, so with one slot a
cheap request that arrives just after an expensive one has started waits for all of it, however
it is ordered: its wait over its own service time is the ratio of the two, which no queue order
bounds. The dispatcher therefore runs express lanes next to the pool's slots (dispatch.py): lane
k takes only requests whose predicted service is at most `max_wait_factor`**k times the cheapest
one's, cheapest first, so a request of predicted service p waits behind a batch in service of at
most `max_wait_factor` x p on the first lane whose ceiling holds it, never behind an expensive
batch. A lane takes only while every slot runs a batch predicted to take longer than its ceiling
(the dispatcher's gate, then `take(when=...)`): behind a cheaper batch the request's wait stays
within the bound anyway, and a lane that took it would only split the batches the slot fuses and
share the cores with it (under an overload of cheap requests ungated lanes cut the answered rate
by a third). Lanes need the cost order: the degree scheduler serves them; FIFO has none (its lane
takes never return a request), so FIFO stays the one-slot baseline.

`divide` is GSM's batch divider (section IV-B) at request granularity: a batch whose per-layer
subgraph would hold more than T_s vertices is run as consecutive sub-batches, which flattens the
memory peaks that T_d (a first-hop measure) cannot see.

Every scheduler is thread-safe behind one interface (`push`, `take`, `close`, `len`): the server's
receiving threads push, its worker threads take. A full queue refuses with QueueFull (back-pressure:
the caller replies "busy" at once instead of queueing without bound).
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sparkgnn.errors import SparkGNNError
from sparkgnn.registry import Registry


class SchedulerError(SparkGNNError, ValueError):
    """A scheduler was misconfigured, given a malformed request, or used after close()."""


class QueueFull(SchedulerError):
    """The queue holds `capacity` requests: the caller should refuse the request (back-pressure)."""


@dataclass(eq=False)
class Pending:
    """One queued request. Compared by identity: two requests with the same fields are still two.

    key        opaque object the server uses to reply (a future, a connection, an id)
    cost       predicted cost: the in-degree sum of the request's query nodes (GSM Observation 2)
    hop_sizes  estimated number of vertices of each layer's subgraph for this request (divide)
    group      requests of different groups (e.g. serving modes) never share a batch
    arrived    time.monotonic() at arrival (the scheduler's clock)
    queries    number of query nodes
    """

    key: object
    cost: float
    hop_sizes: tuple[int, ...] = ()
    group: str = ""
    arrived: float = field(default_factory=time.monotonic)
    queries: int = 1


class ServiceModel:
    """Predicts a batch's service seconds from its cost sum: `predict(cost) = a + b * cost`.

    WHY learnt online: the constant a (launch, transfer and Python overhead per batch) and the slope
    b (seconds per unit of in-degree) depend on the model, the graph, the cache and the hardware, so
    they are fitted from the batches actually served, by exponentially weighted least squares
    (`decay` per observation: recent batches count more, so the fit follows a warming cache).
    Robust with few samples: until two observations with distinct cost sums exist, the prior
    overhead is kept and only the slope is fitted through it; a fit with a negative slope or
    intercept (noise) falls back to a non-negative one. Thread-safe.
    """

    def __init__(self, overhead_s: float = 0.002, per_cost_s: float = 1e-5, decay: float = 0.95):
        if not (math.isfinite(overhead_s) and overhead_s >= 0 and math.isfinite(per_cost_s) and per_cost_s >= 0):
            raise SchedulerError(f"ServiceModel prior must be finite and >= 0, got a={overhead_s}, b={per_cost_s}")
        if not 0 < decay <= 1:
            raise SchedulerError(f"ServiceModel decay must be in (0, 1], got {decay}")
        self.prior = (float(overhead_s), float(per_cost_s))
        self.decay = float(decay)
        self._lock = threading.Lock()
        self._w = 0.0  # sum of weights
        self._mx = 0.0  # weighted means of cost and seconds
        self._my = 0.0
        self._cxx = 0.0  # weighted (co)variance sums about the means
        self._cxy = 0.0
        self._n = 0
        self._distinct = False  # two different cost sums seen: the intercept is identifiable
        self._first_x: float | None = None
        self._ab = self.prior

    @property
    def params(self) -> tuple[float, float]:
        """(a, b): seconds per batch and seconds per unit of cost."""
        with self._lock:
            return self._ab

    @property
    def samples(self) -> int:
        return self._n

    def predict(self, cost: float) -> float:
        a, b = self.params
        return a + b * max(0.0, float(cost))

    def observe(self, cost_sum: float, seconds: float) -> None:
        """Record one served batch: its cost sum and its measured service seconds."""
        x, y = float(cost_sum), float(seconds)
        if not (math.isfinite(x) and x >= 0 and math.isfinite(y) and y >= 0):
            raise SchedulerError(f"ServiceModel.observe needs finite cost_sum, seconds >= 0, got {x}, {y}")
        with self._lock:
            # Exponentially weighted mean / covariance update (West's incremental form: stable for
            # large cost sums, unlike sums of squares).
            w = self.decay * self._w + 1.0
            dx, dy = x - self._mx, y - self._my
            self._mx += dx / w
            self._my += dy / w
            self._cxx = self.decay * self._cxx + dx * (x - self._mx)
            self._cxy = self.decay * self._cxy + dx * (y - self._my)
            self._w = w
            self._n += 1
            if self._first_x is None:
                self._first_x = x
            elif x != self._first_x:
                self._distinct = True
            self._ab = self._fit()

    def _fit(self) -> tuple[float, float]:
        mx, my, w = self._mx, self._my, self._w
        var = self._cxx / w
        if self._distinct and var > 1e-12 * max(mx * mx, 1.0):
            b = (self._cxy / w) / var
            a = my - b * mx
            if b >= 0 and a >= 0:
                return a, b
            if b < 0:  # noise: service time does not fall with cost
                return max(my, 0.0), 0.0
            # a < 0: through the origin, b = sum(w x y) / sum(w x^2)
            sxx = self._cxx + w * mx * mx
            return 0.0, max((self._cxy + w * mx * my) / sxx, 0.0) if sxx > 0 else self.prior[1]
        # One cost level seen: the intercept is not identifiable; keep the prior's (at most the mean).
        a = min(self.prior[0], my)
        return a, (my - a) / mx if mx > 0 else self.prior[1]


def _finite_nonnegative(value: object) -> bool:
    """A finite number >= 0 (numpy scalars included: in-degree sums often come from numpy)."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return math.isfinite(number) and number >= 0


def _fits(total: float, n: int, cost: float, t_d: float, max_batch: int, ceiling: float = math.inf) -> bool:
    """Whether a request of `cost` joins a batch of `n` requests and cost sum `total`: the first
    always does (a request above T_d alone is still served), the others while the sum stays <= T_d;
    and every request only while the sum stays <= `ceiling` (an express lane's cost ceiling)."""
    if total + cost > ceiling:
        return False
    return n == 0 or (n < max_batch and total + cost <= t_d)


class Scheduler:
    """The shared, thread-safe interface; subclasses implement `_add`, `_select` and `_drain`
    (called with the lock held)."""

    name: ClassVar[str] = ""

    def __init__(
        self,
        t_d: float,
        capacity: int = 10000,
        max_batch: int = 4096,
        service: ServiceModel | None = None,
        max_wait_factor: float = 4.0,
        clock: Callable[[], float] = time.monotonic,
        group_max_batch: dict[str, int] | None = None,
    ):
        if not (_finite_nonnegative(t_d) and float(t_d) > 0):
            raise SchedulerError(f"{self.name} scheduler: T_d (the batch in-degree sum) must be > 0, got {t_d!r}")
        if capacity < 1 or max_batch < 1:
            raise SchedulerError(f"{self.name} scheduler: need capacity, max_batch >= 1, got {capacity}, {max_batch}")
        if not (math.isfinite(max_wait_factor) and max_wait_factor > 0):
            raise SchedulerError(f"{self.name} scheduler: max_wait_factor must be > 0, got {max_wait_factor}")
        self.t_d = float(t_d)
        self.capacity = int(capacity)
        # groups whose batches are capped lower (e.g. serving modes answered request by request
        # inside a call: batching them would only make each wait for the others)
        self.group_max_batch = {str(g): max(1, int(n)) for g, n in (group_max_batch or {}).items()}
        self.max_batch = int(max_batch)
        self.service = service if service is not None else ServiceModel()
        self.max_wait_factor = float(max_wait_factor)
        self.clock = clock
        self._cond = threading.Condition()
        self._size = 0
        self._backlog: dict[str, list[float]] = {}  # group -> [requests, cost sum] queued
        self._seq = 0
        self._closed = False

    def __len__(self) -> int:
        with self._cond:
            return self._size

    @property
    def closed(self) -> bool:
        return self._closed

    def push(self, item: Pending) -> None:
        """Queue `item`; QueueFull when `capacity` requests are already queued."""
        if not _finite_nonnegative(item.cost):
            raise SchedulerError(f"request cost must be a finite number >= 0, got {item.cost!r}")
        with self._cond:
            if self._closed:
                raise SchedulerError(f"{self.name} scheduler is closed: no more requests are accepted")
            if self._size >= self.capacity:
                raise QueueFull(
                    f"{self.name} scheduler queue is full ({self.capacity} requests queued, its capacity); retry later"
                )
            self._seq += 1
            self._add(item, self._seq)
            self._size += 1
            queued = self._backlog.setdefault(item.group, [0, 0.0])
            queued[0] += 1
            queued[1] += float(item.cost)
            # every taker: the batcher and the express lanes wait for different requests
            self._cond.notify_all()

    def take(
        self, timeout_s: float | None, *, within_s: float | None = None, when: Callable[[], bool] | None = None
    ) -> list[Pending]:
        """The next batch (all of one group), waiting up to `timeout_s` for a request (None: until
        one comes or the scheduler closes, without waking meanwhile); [] when none came in time or
        the scheduler is closed.

        `within_s` (an express lane's take, module doc): only requests whose predicted service
        (`service.predict` of their cost) is at most `within_s` seconds, cheapest first, in a batch
        whose cost sum's predicted service stays within it too; the others stay queued for the
        plain takes. A scheduler without a cost order (FIFO) never returns a request to it.

        `when`: a condition the take holds for (an express lane's: the slots are held by a batch
        costlier than its ceiling): once it is false the take returns [] instead of waiting on. It
        is evaluated under the scheduler's lock whenever a push or `poke` wakes the takers, and
        must not block."""
        wait = None if timeout_s is None else max(0.0, float(timeout_s))
        if within_s is not None and not (math.isfinite(within_s) and within_s >= 0):
            raise SchedulerError(f"{self.name} scheduler: within_s must be a finite number >= 0, got {within_s!r}")

        def ready() -> bool:
            if when is not None and not when():
                return True  # abandoned: the caller waits for its condition elsewhere
            if self._closed or self._size == 0:
                return self._closed
            if within_s is None:
                return True
            cheapest = self._cheapest()
            return cheapest is not None and cheapest <= self._cost_within(within_s)

        with self._cond:
            self._cond.wait_for(ready, timeout=wait)
            if self._closed or self._size == 0 or not ready() or (when is not None and not when()):
                return []
            batch = self._select() if within_s is None else self._select_within(self._cost_within(within_s))
            self._size -= len(batch)
            queued = self._backlog[batch[0].group]
            queued[0] -= len(batch)
            queued[1] -= sum(float(p.cost) for p in batch)
            if queued[0] <= 0:
                del self._backlog[batch[0].group]
            return batch

    def poke(self) -> None:
        """Wake every waiting take to re-evaluate its `when` condition (it turned false)."""
        with self._cond:
            self._cond.notify_all()

    def backlog(self) -> dict[str, tuple[int, float]]:
        """What is queued, per group: (requests, their predicted cost sum). The server's admission
        control estimates a new request's wait from it."""
        with self._cond:
            return {group: (int(n), max(0.0, cost)) for group, (n, cost) in self._backlog.items()}

    def group_limit(self, group: str) -> int:
        """The most requests a batch of `group` holds."""
        return self._limit(group)

    def close(self) -> list[Pending]:
        """Stop: wake every waiting take (they return []), refuse further pushes. Returns the requests
        still queued, in arrival order, so the server can answer them (e.g. "shutting down")."""
        with self._cond:
            left = [] if self._closed else self._drain()
            self._closed = True
            self._size = 0
            self._backlog.clear()
            self._cond.notify_all()
        return left

    def _limit(self, group: str) -> int:
        return min(self.max_batch, self.group_max_batch.get(group, self.max_batch))

    def _cost_within(self, seconds: float) -> float:
        """The largest cost sum the service model predicts to take at most `seconds` (-inf: none)."""
        a, b = self.service.params
        if a > seconds:
            return -math.inf
        return math.inf if b <= 0 else (seconds - a) / b

    def _cheapest(self) -> float | None:
        """The cost of the cheapest queued request, or None when this order does not know it
        (then express lanes get nothing)."""
        return None

    def _select_within(self, ceiling: float) -> list[Pending]:
        raise NotImplementedError

    def _add(self, item: Pending, seq: int) -> None:
        raise NotImplementedError

    def _select(self) -> list[Pending]:
        raise NotImplementedError

    def _drain(self) -> list[Pending]:
        raise NotImplementedError


SCHEDULERS: Registry[type[Scheduler]] = Registry("scheduler", SchedulerError)


@SCHEDULERS.register("fifo")
class FifoScheduler(Scheduler):
    """Arrival (push) order; a batch takes the oldest request's group in arrival order until the
    next request would push the cost sum over T_d or the batch holds max_batch requests.
    `service`, `max_wait_factor` and `clock` are accepted and unused (nothing starves here)."""

    name = "fifo"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._queues: dict[str, deque[tuple[int, Pending]]] = {}

    def _add(self, item: Pending, seq: int) -> None:
        self._queues.setdefault(item.group, deque()).append((seq, item))

    def _select(self) -> list[Pending]:
        group = min(self._queues, key=lambda g: self._queues[g][0][0])
        queue = self._queues[group]
        batch: list[Pending] = []
        total = 0.0
        limit = self._limit(group)
        while queue and _fits(total, len(batch), queue[0][1].cost, self.t_d, limit):
            item = queue.popleft()[1]
            batch.append(item)
            total += item.cost
        if not queue:
            del self._queues[group]
        return batch

    def _drain(self) -> list[Pending]:
        left = sorted((entry for queue in self._queues.values() for entry in queue), key=lambda e: e[0])
        self._queues.clear()
        return [item for _seq, item in left]


@dataclass(eq=False)
class _Entry:
    seq: int
    item: Pending
    taken: bool = False


# (sort key, push sequence number: ties and a total order without comparing entries, entry)
_HeapRow = tuple[float, int, _Entry]


def _clean(heap: list[_HeapRow]) -> None:
    """Lazy deletion: drop the rows at the head whose request was taken through another heap."""
    while heap and heap[0][2].taken:
        heapq.heappop(heap)


@SCHEDULERS.register("degree")
class DegreeScheduler(Scheduler):
    """GSM's degree-based scheduler with promotion of starving requests (see the module docstring).

    Per group, a heap by cost (the sorted order of the paper, without re-sorting the queue per batch)
    and a heap of promoted requests by arrival; one heap of promotion deadlines across groups. A
    request lives in several heaps; taking it marks it taken and the other heaps drop it when it
    reaches their head (lazy deletion), and a heap holding mostly taken rows is rebuilt. Push is
    O(log n); a batch of k requests costs O((k + promoted) log n + groups).

    A request's deadline, `arrived + max_wait_factor * service.predict(cost)`, is fixed when it is
    pushed, with the service model of that moment (a model that keeps changing would otherwise
    reorder the deadline heap).
    """

    name = "degree"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._by_cost: dict[str, list[_HeapRow]] = {}
        self._promoted: dict[str, list[_HeapRow]] = {}
        self._live: dict[str, int] = {}
        self._deadlines: list[_HeapRow] = []

    def _add(self, item: Pending, seq: int) -> None:
        entry = _Entry(seq, item)
        group = item.group
        heapq.heappush(self._by_cost.setdefault(group, []), (float(item.cost), seq, entry))
        deadline = item.arrived + self.max_wait_factor * self.service.predict(item.cost)
        heapq.heappush(self._deadlines, (deadline, seq, entry))
        self._live[group] = self._live.get(group, 0) + 1

    def _promote(self, now: float) -> None:
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _deadline, seq, entry = heapq.heappop(deadlines)
            if not entry.taken:
                heapq.heappush(self._promoted.setdefault(entry.item.group, []), (entry.item.arrived, seq, entry))

    def _first_group(self) -> str:
        """The group of the oldest promoted request, else of the cheapest request."""
        best: tuple[float, int] | None = None
        group = ""
        for lanes in (self._promoted, self._by_cost):
            for g, heap in lanes.items():
                _clean(heap)
                if heap and (best is None or heap[0][:2] < best):
                    best, group = heap[0][:2], g
            if best is not None:
                return group
        raise AssertionError("degree scheduler: no live request although the queue is not empty")

    def _cheapest_group(self) -> tuple[str, float] | None:
        best: tuple[str, float] | None = None
        for g, heap in self._by_cost.items():
            _clean(heap)
            if heap and (best is None or heap[0][0] < best[1]):
                best = (g, heap[0][0])
        return best

    def _cheapest(self) -> float | None:
        best = self._cheapest_group()
        return None if best is None else best[1]

    def _select_within(self, ceiling: float) -> list[Pending]:
        """An express lane's batch: the cheapest requests of the group holding the cheapest one,
        while their cost sum stays <= `ceiling` (and T_d, the group's batch limit)."""
        best = self._cheapest_group()
        assert best is not None and best[1] <= ceiling, "degree scheduler: no request within the lane's ceiling"
        group = best[0]
        batch = self._fill(group, (self._by_cost[group],), ceiling)
        self._live[group] -= len(batch)
        self._compact(group)
        return batch

    def _fill(self, group: str, heaps: tuple[list[_HeapRow], ...], ceiling: float = math.inf) -> list[Pending]:
        """Pop from `heaps` in turn (each by its own order) while the requests fit the batch."""
        batch: list[Pending] = []
        total = 0.0
        limit = self._limit(group)
        for heap in heaps:
            while True:
                _clean(heap)
                if not heap or not _fits(total, len(batch), heap[0][2].item.cost, self.t_d, limit, ceiling):
                    break
                entry = heapq.heappop(heap)[2]
                entry.taken = True
                batch.append(entry.item)
                total += entry.item.cost
        return batch

    def _select(self) -> list[Pending]:
        self._promote(self.clock())
        group = self._first_group()
        # Promoted first, oldest first, while they fit; then the cheapest, while they fit.
        batch = self._fill(group, (self._promoted.get(group, []), self._by_cost[group]))
        self._live[group] -= len(batch)
        self._compact(group)
        return batch

    def _compact(self, group: str) -> None:
        live = self._live[group]
        if live == 0:  # only taken rows are left in this group's heaps
            del self._live[group], self._by_cost[group]
            self._promoted.pop(group, None)
        else:
            for lanes in (self._by_cost, self._promoted):
                heap = lanes.get(group)
                if heap is not None and len(heap) > 2 * live + 64:
                    lanes[group] = [row for row in heap if not row[2].taken]
                    heapq.heapify(lanes[group])
        if len(self._deadlines) > 2 * sum(self._live.values()) + 64:
            self._deadlines = [row for row in self._deadlines if not row[2].taken]
            heapq.heapify(self._deadlines)

    def _drain(self) -> list[Pending]:
        left = sorted((row for heap in self._by_cost.values() for row in heap if not row[2].taken), key=lambda r: r[1])
        self._by_cost.clear()
        self._promoted.clear()
        self._live.clear()
        self._deadlines.clear()
        return [row[2].item for row in left]


def divide(batch: list[Pending], t_s: int) -> list[list[Pending]]:
    """GSM's batch divider at request granularity: consecutive sub-batches (order kept) such that
    for every layer l the sum of `hop_sizes[l]` in a sub-batch is <= t_s; a request alone above t_s
    forms a sub-batch by itself. t_s <= 0: no division.

    Summing per-request estimates ignores the overlap of their neighbourhoods, so the true
    sub-batch subgraph is at most this sum: the division is conservative (never too large for the
    memory T_s stands for), at the price of sometimes splitting a batch that would have fit.
    """
    if not batch:
        return []
    if t_s <= 0:
        return [list(batch)]
    parts: list[list[Pending]] = []
    current: list[Pending] = []
    sums: list[int] = []
    for item in batch:
        sizes = item.hop_sizes
        width = max(len(sums), len(sizes))
        grown = [(sums[l] if l < len(sums) else 0) + (sizes[l] if l < len(sizes) else 0) for l in range(width)]
        if current and any(s > t_s for s in grown):
            parts.append(current)
            current, grown = [], list(sizes)
        current.append(item)
        sums = grown
    parts.append(current)
    return parts
