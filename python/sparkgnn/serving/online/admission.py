"""Admission control of the online service: refuse at intake a request that cannot meet its
deadline, so that past capacity the service answers at its capacity and sheds the excess fast.

WHY at intake: a queue that takes every request grows without limit past capacity; every request
then waits longer than any client waits for it, and the service spends its capacity on answers
nobody reads (throughput collapses while the queue holds seconds of work). Refusing a request
the moment its predicted completion passes its deadline costs microseconds, tells the client to
retry (BUSY / HTTP 503 with Retry-After: the predicted wait), and keeps the queue at what the
service can answer in time.

The prediction: the work queued ahead of the request (the scheduler's backlog per mode: requests
and their predicted cost, GraphFacts.pending), in batches as the scheduler forms them (at most
the mode's batch limit, at most T_d of cost each), timed by each mode's service model
(scheduler.ServiceModel: seconds = a + b * cost, fitted online from the batches served), spread
over the pool slots; plus the request's own service time. The degree scheduler serves cheap
requests first, so the whole backlog is an upper bound of the wait of a cheap request and a fair
one of an expensive request; batches already running are not counted (their remainder is
unknown, and at most one batch per slot).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from sparkgnn.serving.online.scheduler import ServiceModel


@dataclass(frozen=True)
class Estimate:
    """A request's predicted wait in the queue and its own service time, in seconds."""

    wait_s: float
    service_s: float

    @property
    def total_s(self) -> float:
        return self.wait_s + self.service_s


class Admission:
    """Per-mode service models and the admission rule.

    slots        pool slots serving batches at once (the backlog's work is spread over them)
    t_d          the scheduler's batch cost threshold T_d
    limits       the most requests a batch of each mode holds (the scheduler's group_limit)
    """

    def __init__(self, slots: int, t_d: float, limits: dict[str, int]):
        if slots < 1 or not (math.isfinite(t_d) and t_d > 0):
            raise ValueError(f"admission needs slots >= 1 and a finite T_d > 0, got {slots}, {t_d}")
        self.slots = int(slots)
        self.t_d = float(t_d)
        self.limits = {str(m): max(1, int(n)) for m, n in limits.items()}
        self._models: dict[str, ServiceModel] = {}
        self._lock = threading.Lock()

    def model(self, mode: str) -> ServiceModel:
        """The service model of `mode` (created with the prior on first use)."""
        found = self._models.get(mode)  # models are only ever added: a hit needs no lock
        if found is not None:
            return found
        with self._lock:
            found = self._models.get(mode)
            if found is None:
                found = self._models[mode] = ServiceModel()
            return found

    def observe(self, mode: str, cost_sum: float, seconds: float) -> None:
        """A batch of `mode` with predicted cost `cost_sum` was served in `seconds`."""
        self.model(mode).observe(cost_sum, seconds)

    def batch_seconds(self, mode: str, requests: int, cost: float) -> float:
        """Predicted seconds to serve `requests` queued requests of `mode` of summed cost `cost`,
        in the batches the scheduler would form."""
        if requests <= 0:
            return 0.0
        a, b = self.model(mode).params
        limit = self.limits.get(mode, requests)
        batches = max(math.ceil(requests / limit), math.ceil(cost / self.t_d), 1)
        return batches * a + b * max(0.0, cost)

    def estimate(self, backlog: dict[str, tuple[int, float]], mode: str, cost: float) -> Estimate:
        """The predicted wait of a request of `mode` and `cost` queued behind `backlog` (the
        scheduler's: mode -> (requests, cost sum)), and its own service time."""
        work = sum(self.batch_seconds(m, n, c) for m, (n, c) in backlog.items())
        return Estimate(work / self.slots, self.batch_seconds(mode, 1, cost))

    def refusal(self, estimate: Estimate, deadline_s: float) -> str | None:
        """Why a request with `estimate` cannot meet `deadline_s`, as one line; None when it can."""
        if estimate.total_s <= deadline_s:
            return None
        return (
            f"the service cannot answer within this request's deadline of {deadline_s * 1e3:.0f} ms (predicted "
            f"{estimate.wait_s * 1e3:.0f} ms in the queue + {estimate.service_s * 1e3:.0f} ms of service); retry later"
        )
