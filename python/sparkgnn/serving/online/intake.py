"""The submit side of the online service: what a request gets back (`Outcome`), what the queue
holds of it (`Ticket`), and `Intake.submit`, which checks a request and queues it or answers it
at once.

A request is refused before it costs the workers anything, each with one line: a bad
`deadline_ms`; over the size caps (`max_queries`, `max_edges`: "too_large", HTTP 413); a mode
the deployment does not serve, or ids, features or edges GraphFacts finds wrong ("error"); a
predicted cost (GraphFacts.pending, the in-degree sum GSM's scheduler uses) over `max_cost`
("too_large"); a predicted completion past its deadline (admission.py: "busy" with Retry-After;
`refuse_early` decides it from a request's header alone when the queue is already too long);
a queue whose byte budget (`queue_bytes`) or request count (`capacity`) it would pass ("busy").

WHY its own object: every check runs on the fronts' threads against one version's GraphFacts,
and the queue's byte budget is intake's own state (freed by `dequeued` when the batcher takes
requests out); dispatch never validates again. Workers do, against their own graph, except the
in-process pool for a batch whose version is the one intake checked every request against (the
Ticket keeps those facts): the same sentences against the same ids would only be paid twice.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkgnn.serving.online.admission import Admission, Estimate
from sparkgnn.serving.online.config import ServeConfig, over_caps
from sparkgnn.serving.online.costs import GraphFacts
from sparkgnn.serving.online.scheduler import QueueFull, SchedulerError
from sparkgnn.serving.online.stats import Tally
from sparkgnn.serving.request import Request

if TYPE_CHECKING:
    from sparkgnn.serving.online.wire import AnswerRows


@dataclass
class Outcome:
    """What one request gets back: its answer (its rows of the batch's answer, wire.AnswerRows), or
    an error. kind: "ok"; "error" (the request's fault); "too_large" (over the service's size or
    cost caps: split it); "busy" (the queue is full), "timeout" (it waited past the request
    timeout, or its batch ran past the batch deadline), "stopping" (the service is stopping): the
    server's limits, retry later; "failed" (its batch failed on a worker)."""

    request_id: str
    kind: str
    answer: AnswerRows | None = None
    error: str | None = None
    queue_s: float = 0.0
    service_s: float = 0.0
    batch_requests: int = 0
    pool: str = ""
    version: int = 0  # the Version that answered it (0: none did)
    retry_after_s: float | None = None  # "busy": when a retry may be admitted (else the front's default)


@dataclass
class Ticket:
    """A queued request, with what dispatch needs of it: its mode, arrival, predicted PSGS and
    cost, its bytes, its deadline and where its Outcome goes."""

    request: Request
    mode: str
    arrived: float
    psgs: float
    deliver: Callable[[Outcome], None]
    cost: float = 0.0
    nbytes: int = 0  # the request's arrays, counted against the queue's byte budget
    deadline: float = math.inf  # time.monotonic() past which its answer is no use (not started: "timeout")
    facts: GraphFacts | None = None  # what intake validated it against (one version's: dispatch compares)


def request_bytes(request: Request) -> int:
    """The bytes of a request's arrays (ids, features, edges): what it holds while queued."""
    return int(request.qid.nbytes + request.x.nbytes + request.src.nbytes + request.dst.nbytes)


class Intake:
    """Checks requests and queues them in `scheduler` (module doc). `facts`: returns the
    GraphFacts of the version served now (read once per request: a swap may replace them
    meanwhile); `tally`: counts and delivers every Outcome; `lock`: the service's lock (it guards
    `queued_bytes` too)."""

    def __init__(
        self,
        config: ServeConfig,
        scheduler,
        admission: Admission,
        facts: Callable[[], GraphFacts],
        tally: Tally,
        lock: threading.Lock,
    ):
        self.config = config
        self.scheduler = scheduler
        self.admission = admission
        self._facts = facts
        self._tally = tally
        self._lock = lock
        self.queued_bytes = 0  # of the requests in the scheduler (guarded by lock)

    def submit(
        self,
        request: Request,
        mode: str | None = None,
        deliver: Callable[[Outcome], None] | None = None,
        *,
        deadline_ms: float | None = None,
        received: float | None = None,
    ) -> Future:
        """Queue a request; the Future resolves to its Outcome (`deliver`, when given, gets it
        instead). Refusals (module doc) resolve it at once. `received`: the time.monotonic() a
        front received it (default now): its deadline and queue time count from then, so the
        time it waited to be parsed is part of its predicted wait."""
        future: Future = Future()
        deliver = deliver or future.set_result
        mode = mode or self.config.mode
        finish = self._tally.finish
        self._tally.add("requests")
        if deadline_ms is not None and (
            isinstance(deadline_ms, bool)
            or not isinstance(deadline_ms, int | float)
            or not (math.isfinite(deadline_ms) and deadline_ms > 0)
        ):
            error = f"request {request.request_id!r}: deadline_ms must be a finite number > 0, got {deadline_ms!r}"
            finish(deliver, Outcome(request.request_id, "error", error=error), mode)
            return future
        facts = self._facts()  # one version's facts for this request
        too_large = self.oversize(request)
        if too_large:
            finish(deliver, Outcome(request.request_id, "too_large", error=too_large), mode)
            return future
        problems = self.problems(request, mode, facts)
        if problems:
            finish(deliver, Outcome(request.request_id, "error", error=problems), mode)
            return future
        now = time.monotonic()
        arrived = now if received is None else min(float(received), now)
        ticket = Ticket(request, mode, arrived, 0.0, deliver, nbytes=request_bytes(request), facts=facts)
        pending, ticket.psgs = facts.pending(request, ticket, mode, ticket.arrived)
        ticket.cost = pending.cost
        if pending.cost > self.config.max_cost:
            error = (
                f"request {request.request_id!r} has a predicted cost of {pending.cost:.0f} (the in-degree "
                f"sum its layers aggregate over); this service takes at most {self.config.max_cost:.0f} "
                "per request (split it)"
            )
            finish(deliver, Outcome(request.request_id, "too_large", error=error), mode)
            return future
        deadline_s = self.config.deadline_s(deadline_ms)
        found = self.admission.estimate(self.scheduler.backlog(), mode, pending.cost)
        estimate = Estimate(found.wait_s + (now - arrived), found.service_s)  # waited already, and to come
        if self._shed(request.request_id, mode, estimate, deadline_s, deliver):
            return future
        ticket.deadline = ticket.arrived + deadline_s
        with self._lock:
            over = self.queued_bytes + ticket.nbytes > self.config.queue_bytes and self.queued_bytes > 0
            if not over:
                self.queued_bytes += ticket.nbytes
        if over:
            error = (
                f"the queue holds {self.queued_bytes} bytes of requests; with this one's {ticket.nbytes} it "
                f"would pass its budget of {self.config.queue_bytes} bytes; retry later"
            )
            finish(deliver, Outcome(request.request_id, "busy", error=error), mode)
            return future
        try:
            self.scheduler.push(pending)
        except (QueueFull, SchedulerError) as exc:
            self.dequeued([pending])
            kind = "busy" if isinstance(exc, QueueFull) else "stopping"
            finish(deliver, Outcome(request.request_id, kind, error=str(exc)), mode)
        return future

    def refuse_early(
        self,
        request_id: str,
        mode: object,
        deliver: Callable[[Outcome], None],
        *,
        deadline_ms: object = None,
        ahead: int = 0,
        ahead_s: float = 0.0,
    ) -> bool:
        """Refuse a request BUSY before its body is read when the work already queued passes its
        deadline whatever the request costs; True when it was refused (counted, and its Outcome
        handed to `deliver`). `ahead`: requests the front received before this one and has not
        submitted yet (being parsed), `ahead_s`: the seconds their parsing still takes; they are
        counted as queued requests of `mode` at the backlog's mean cost. The prediction (the
        backlog's wait plus the cheapest service) is at most what `submit` would predict once
        they are queued, so a request refused here would be refused there. O(modes), no parsing:
        a front calls it on its intake thread with the request's header only, so that past
        capacity a refusal costs microseconds and does not wait behind the requests being
        parsed. A mode not served or a bad deadline: False (`submit` refuses those naming the
        problem)."""
        mode = mode or self.config.mode
        if not isinstance(mode, str) or mode not in self.config.modes:
            return False
        if deadline_ms is not None and (
            isinstance(deadline_ms, bool)
            or not isinstance(deadline_ms, int | float)
            or not (math.isfinite(deadline_ms) and deadline_ms > 0)
        ):
            return False
        backlog = self.scheduler.backlog()
        if not backlog and ahead <= 0:  # nothing queued ahead: submit judges the request's own service
            return False
        if ahead > 0:
            queued, cost = backlog.get(mode, (0, 0.0))
            backlog[mode] = (queued + ahead, cost + ahead * (cost / queued if queued else 0.0))
        found = self.admission.estimate(backlog, mode, 0.0)
        estimate = Estimate(found.wait_s + max(0.0, ahead_s), found.service_s)
        if estimate.total_s <= self.config.deadline_s(deadline_ms):
            return False
        self._tally.add("requests")
        return self._shed(request_id, mode, estimate, self.config.deadline_s(deadline_ms), deliver)

    def _shed(
        self, request_id: str, mode: str, estimate: Estimate, deadline_s: float, deliver: Callable[[Outcome], None]
    ) -> bool:
        """Refuse BUSY with Retry-After (the predicted wait) when `estimate` passes `deadline_s`."""
        refused = self.admission.refusal(estimate, deadline_s)
        if not refused:
            return False
        self._tally.add("shed")
        self._tally.metrics.shed(mode)
        retry = float(max(1, math.ceil(estimate.wait_s)))
        self._tally.finish(deliver, Outcome(request_id, "busy", error=refused, retry_after_s=retry), mode)
        return True

    def dequeued(self, pendings: Iterable) -> None:
        """Requests left the scheduler's queue (scheduler.Pending, keyed by their Ticket): their
        bytes leave its budget."""
        freed = sum(p.key.nbytes for p in pendings)
        with self._lock:
            self.queued_bytes -= freed

    def oversize(self, request: Request) -> str | None:
        """Why `request` is over this service's size limits (max_queries, max_edges), or None."""
        return over_caps(request, self.config.max_queries, self.config.max_edges)

    def problems(self, request: Request, mode: str, facts: GraphFacts) -> str | None:
        """Why `request` cannot be served in `mode` against `facts` (a mode not served, unknown
        ids, collisions, width, NaN), or None."""
        if not isinstance(mode, str) or mode not in self.config.modes:
            return (
                f"mode {mode!r} is not served here (served: {', '.join(self.config.modes)}; a deployment "
                "serves the modes its config lists in `modes`)"
            )
        found = facts.problems(request)
        if found:
            return f"request {request.request_id!r} is invalid: " + "; ".join(found)
        return None
