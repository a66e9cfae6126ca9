"""sparkgnn.serving.online.intake.Intake without workers: every refusal is answered at once with
one line and counted (a bad deadline, over the size or cost caps, a mode not served, an invalid
request, a predicted wait past the deadline, the queue's byte budget); an accepted request is
queued with its cost, PSGS, bytes and deadline, and its bytes leave the budget when dequeued."""

from __future__ import annotations

import threading

import numpy as np

from sparkgnn.serving.online.admission import Admission
from sparkgnn.serving.online.config import ServeConfig
from sparkgnn.serving.online.costs import GraphFacts
from sparkgnn.serving.online.intake import Intake, request_bytes
from sparkgnn.serving.online.scheduler import SCHEDULERS
from sparkgnn.serving.online.stats import ServiceMetrics, Tally, service_stats
from sparkgnn.serving.request import Request

FACTS = GraphFacts(np.arange(4), np.array([0, 1, 2, 3.0]), np.ones(4), feature_dim=3, num_layers=2)


def request(rid: str, queries: int = 1, src: int = 3) -> Request:
    qid = np.arange(10, 10 + queries)
    return Request(rid, qid, np.ones((queries, 3), np.float32), np.full(queries, src), qid)


def intake(**settings) -> tuple[Intake, dict]:
    """An Intake over a fifo scheduler of FACTS' graph, and its stats."""
    config = ServeConfig(graph="g", model="m", http=None, **settings)
    scheduler = SCHEDULERS.lookup("fifo")(config.t_d, capacity=config.capacity, max_batch=config.max_batch)
    stats, lock = service_stats(1, "fp"), threading.Lock()
    tally = Tally(stats, lock, ServiceMetrics(config.modes, lambda: {}))
    admission = Admission(1, config.t_d, {mode: 64 for mode in config.modes})
    return Intake(config, scheduler, admission, lambda: FACTS, tally, lock), stats


def test_refusals_are_answered_at_once_in_one_line_and_counted():
    front, stats = intake(max_queries=2, max_cost=5.0)
    bad_ids = Request("ids", np.array([10]), np.ones((1, 3), np.float32), np.array([99]), np.array([10]))
    cases = [
        (front.submit(request("r0"), deadline_ms=-1), "error", "deadline_ms must be a finite number > 0"),
        (front.submit(request("r1", queries=3)), "too_large", "3"),
        (front.submit(request("r2"), "full"), "error", "mode 'full' is not served here"),
        (front.submit(bad_ids), "error", "request 'ids' is invalid"),
        (front.submit(request("r4", queries=2, src=3)), "too_large", "predicted cost of 8"),
    ]
    for future, kind, words in cases:
        outcome = future.result(timeout=1)
        assert outcome.kind == kind and words in outcome.error and "\n" not in outcome.error, outcome
    assert stats["requests"] == 5 and stats["errors"] == 3 and stats["too_large"] == 2
    assert len(front.scheduler) == 0 and front.queued_bytes == 0


def test_an_accepted_request_is_queued_with_its_cost_bytes_and_deadline_and_freed_when_dequeued():
    front, stats = intake(deadline_ms=500.0)
    future = front.submit(request("ok", src=2))
    assert not future.done() and len(front.scheduler) == 1
    assert front.queued_bytes == request_bytes(request("ok", src=2))
    batch = front.scheduler.take(0.1)
    ticket = batch[0].key
    assert ticket.cost == 1 + 2 and ticket.psgs == 1 + 1 and ticket.mode == "he"
    assert abs((ticket.deadline - ticket.arrived) - 0.5) < 1e-9
    front.dequeued(batch)
    assert front.queued_bytes == 0 and stats["requests"] == 1


def test_the_byte_budget_and_the_deadline_shed_with_busy():
    one = request_bytes(request("a"))
    front, stats = intake(queue_bytes=one + one // 2)
    assert not front.submit(request("a")).done()
    outcome = front.submit(request("b")).result(timeout=1)
    assert outcome.kind == "busy" and f"budget of {one + one // 2} bytes" in outcome.error
    for _ in range(40):  # teach the service model 1 s a batch: the queued request makes a wait of 1 s
        front.admission.observe("he", 1.0, 1.0)
    shed = front.submit(request("c"), deadline_ms=100.0).result(timeout=1)
    assert shed.kind == "busy" and shed.retry_after_s is not None and shed.retry_after_s >= 1
    assert stats["busy"] == 2 and stats["shed"] == 1


def test_the_deadline_counts_from_receipt_and_an_early_refusal_counts_the_requests_ahead():
    """A request received 300 ms before it was parsed cannot meet a 100 ms deadline even on an
    idle service; refuse_early (header only) refuses when the queue, with the requests still
    being parsed ahead, passes the deadline, answers like submit's refusal, and lets a request
    it cannot judge (a mode not served, a bad deadline) through to submit."""
    import time

    front, stats = intake()
    late = front.submit(request("late"), deadline_ms=100.0, received=time.monotonic() - 0.3).result(timeout=1)
    assert late.kind == "busy" and "deadline of 100 ms" in late.error and stats["shed"] == 1
    assert not front.submit(request("fresh"), deadline_ms=100.0, received=time.monotonic()).done()
    for cost in (10.0, 1000.0) * 20:  # 40 ms a batch, whatever its cost
        front.admission.observe("he", cost, 0.04)
    got: list = []
    assert not front.refuse_early("a", None, got.append, deadline_ms=100.0)  # 1 queued: 40 + 40 ms
    assert not front.refuse_early("b", "full", got.append, deadline_ms=1.0)  # not served: submit says so
    assert not front.refuse_early("c", "he", got.append, deadline_ms=-5)  # bad deadline: submit says so
    assert got == [] and stats["requests"] == 2
    assert not front.refuse_early("d", "he", got.append, deadline_ms=100.0, ahead=2)  # one batch of 3: 40 + 40
    assert front.refuse_early("d", "he", got.append, deadline_ms=100.0, ahead=70)  # batches of 64: 80 + 40 ms
    assert front.refuse_early("e", "he", got.append, deadline_ms=100.0, ahead_s=0.07)  # 40 + 70 + 40 ms
    assert [o.kind for o in got] == ["busy", "busy"] and all(o.retry_after_s >= 1 for o in got)
    assert "deadline of 100 ms" in got[0].error and stats["requests"] == 4 and stats["shed"] == 3
    assert len(front.scheduler) == 1  # nothing refused early was queued
