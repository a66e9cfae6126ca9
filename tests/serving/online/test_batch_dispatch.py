"""sparkgnn.serving.online.dispatch.Dispatcher on fake pools: a batch whose pool has no free
slot overflows to an idle pool; a request past its deadline is answered "timeout" without
work; a failed call answers "failed" and a call past batch_timeout_s answers "timeout", each
releasing the version the batch took; the threads answer a queued batch and stop on their
sentinels."""

from __future__ import annotations

import math
import threading
import time

import numpy as np

from sparkgnn.serving.online.admission import Admission
from sparkgnn.serving.online.config import ServeConfig
from sparkgnn.serving.online.dispatch import Dispatcher
from sparkgnn.serving.online.intake import Outcome, Ticket
from sparkgnn.serving.online.scheduler import SCHEDULERS, Pending, ServiceModel
from sparkgnn.serving.online.stats import ServiceMetrics, Tally, service_stats
from sparkgnn.serving.request import Request


class FakePool:
    """A pool whose call runs `behaviour(header)` (default: raise, a worker's failure)."""

    def __init__(self, name: str, behaviour=None):
        self.name, self.width = name, 1
        self.behaviour = behaviour
        self.calls = 0

    def call(self, slot: int, header: dict, tables: dict) -> dict:
        self.calls += 1
        if self.behaviour is None:
            raise RuntimeError("worker gone")
        return self.behaviour(header)


class FakeVersions:
    """Counts the batches in flight on the one version."""

    def __init__(self):
        self.in_flight = 0
        self.number = 1
        self.key = "ab" * 32
        self.facts = object()  # the version's GraphFacts (dispatch compares them by identity)

    def take(self):
        self.in_flight += 1
        return self

    def release(self, version) -> None:
        self.in_flight -= 1


def dispatcher(pools: list, stop: threading.Event | None = None, **settings) -> tuple[Dispatcher, dict, FakeVersions]:
    config = ServeConfig(graph="g", model="m", http=None, **settings)
    scheduler = SCHEDULERS.lookup("fifo")(config.t_d, capacity=config.capacity, max_batch=config.max_batch)
    stats, lock = service_stats(1, "fp"), threading.Lock()
    versions = FakeVersions()
    out = Dispatcher(
        config,
        pools,
        scheduler,
        versions,  # type: ignore[arg-type]  # take/release is all a dispatcher uses
        service=ServiceModel(),
        admission=Admission(1, config.t_d, {}),
        dequeued=lambda batch: None,
        tally=Tally(stats, lock, ServiceMetrics(config.modes, lambda: {})),
        lock=lock,
        stop=stop or threading.Event(),
    )
    out.start_watch()  # the batch deadline's watchdog (start() starts it with the other threads)
    return out, stats, versions


def ticket(rid: str, got: list, *, waited: float = 0.0, deadline_s: float = math.inf) -> Ticket:
    request = Request(rid, np.array([10]), np.ones((1, 3), np.float32), np.array([0]), np.array([10]))
    arrived = time.monotonic() - waited
    return Ticket(request, "he", arrived, 1.0, got.append, cost=1.0, deadline=arrived + deadline_s)


def test_a_batch_overflows_to_an_idle_pool():
    d, stats, _ = dispatcher([FakePool("small"), FakePool("big")])
    assert d.choose_pool(1.0) == 0 and stats["overflow"] == 0
    d.pool_queues[0].put([])  # the first pool's one slot has a batch waiting
    assert d.choose_pool(1.0) == 1 and stats["overflow"] == 1


def test_late_requests_failed_calls_and_calls_past_the_batch_deadline_are_answered():
    got: list[Outcome] = []
    pool = FakePool("main")
    d, stats, versions = dispatcher([pool], batch_timeout_s=0.2, request_timeout_s=5.0)
    d.run_batch(pool, 0, [ticket("late", got, waited=0.5, deadline_s=0.1), ticket("old", got, waited=6.0)])
    assert [o.kind for o in got] == ["timeout", "timeout"] and pool.calls == 0
    assert "past its deadline of 100 ms" in got[0].error and "request timeout of 5.0 s" in got[1].error
    d.run_batch(pool, 0, [ticket("a", got)])
    assert got[-1].kind == "failed" and "RuntimeError: worker gone" in got[-1].error
    assert versions.in_flight == 0
    gate = threading.Event()
    pool.behaviour = lambda header: gate.wait(10)
    threading.Timer(0.5, gate.set).start()
    d.run_batch(pool, 0, [ticket("slow", got)])  # returns once the call does: its slot stays taken
    assert got[-1].kind == "timeout" and "batch deadline of 0.2 s" in got[-1].error
    assert stats["batch_timeouts"] == 1 and versions.in_flight == 0
    assert stats["errors"] == 4 and stats["batches"] == 0
    d.stop_dispatch()


def spawner(threads: list[threading.Thread]):
    """Dispatcher.start's `spawn`: a daemon thread per target, kept in `threads` for the joins."""

    def spawn(name, target, *args):
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        threads.append(thread)
        return thread

    return spawn


def test_the_threads_dispatch_a_queued_batch_and_stop_on_their_sentinels():
    got: list[Outcome] = []
    headers: list[dict] = []
    pool = FakePool("main", behaviour=lambda header: headers.append(header) or {})
    stop = threading.Event()
    d, stats, _ = dispatcher([pool, FakePool("other")], stop)  # two pools: the batcher routes
    threads: list[threading.Thread] = []
    spawn = spawner(threads)
    d.start(spawn)
    d.pool_queues[0].put([ticket("a", got)])
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    assert headers[0]["requests"] == ["a"] and headers[0]["deployment"] == "ab" * 32
    assert got[0].kind == "failed"  # the fake answers no tables: the batch fails its request
    d.scheduler.close()
    stop.set()
    d.close_batcher([])
    for thread in threads:
        thread.join(5)
    assert not any(t.is_alive() for t in threads)
    d.stop_dispatch()
    assert d._watch_thread is not None and not d._watch_thread.is_alive()  # the watchdog ended too


def test_with_one_pool_the_slots_take_from_the_scheduler_and_end_when_it_closes():
    got: list[Outcome] = []
    headers: list[dict] = []
    pool = FakePool("main", behaviour=lambda header: headers.append(header) or {})
    stop = threading.Event()
    d, _, versions = dispatcher([pool], stop)
    threads: list[threading.Thread] = []
    spawn = spawner(threads)
    d.start(spawn)
    assert d._batcher is None and len(threads) == 1  # one slot's thread, no batcher
    d.scheduler.push(Pending(key=ticket("a", got), cost=1.0, hop_sizes=(1,), group="he"))
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    assert headers[0]["requests"] == ["a"] and got[0].kind == "failed" and versions.in_flight == 0
    left = d.scheduler.close()
    stop.set()
    d.close_batcher(left)
    threads[0].join(5)
    assert not threads[0].is_alive()
    d.stop_dispatch()


def test_each_request_of_a_batch_gets_its_own_rows_and_an_erring_one_its_error():
    from sparkgnn.serving.online.wire import answer_table, meta_table

    h = np.arange(6, dtype=np.float32).reshape(3, 2)
    tables = {
        "answer": answer_table(np.array([0, 2, 2]), np.array([10, 11, 12]), h, None),
        "meta": meta_table({"errors": {"1": "request 'b' is invalid"}}),
    }
    got: list[Outcome] = []
    pool = FakePool("main", behaviour=lambda header: tables)
    d, stats, _ = dispatcher([pool])
    d.run_batch(pool, 0, [ticket(rid, got) for rid in ("a", "b", "c")])
    assert [(o.request_id, o.kind) for o in got] == [("a", "ok"), ("b", "error"), ("c", "ok")]
    assert got[1].answer is None and got[1].error == "request 'b' is invalid"
    np.testing.assert_array_equal(got[2].answer.arrays()[0], [11, 12])
    np.testing.assert_array_equal(got[2].answer.arrays()[1], h[1:])
    assert all(o.batch_requests == 3 for o in got) and stats["batches"] == 1
    d.stop_dispatch()


class InProcessFake(FakePool):
    """A pool answered in this process: dispatch hands it the Request objects and says whether
    intake checked them against the batch's version."""

    def __init__(self, name: str):
        super().__init__(name)
        self.checked: list[bool] = []

    def call_requests(self, slot: int, header: dict, requests: list, *, checked: bool = False) -> tuple:
        self.checked.append(checked)
        raise RuntimeError("answered nothing")


def test_an_in_process_batch_is_validated_again_unless_intake_checked_every_request_against_its_version():
    got: list[Outcome] = []
    pool = InProcessFake("main")
    d, _, versions = dispatcher([pool])
    same, other = ticket("a", got), ticket("b", got)
    same.facts, other.facts = versions.facts, object()  # `other`: checked against a version since replaced
    d.run_batch(pool, 0, [same])
    d.run_batch(pool, 0, [same, other])
    d.run_batch(pool, 0, [ticket("c", got)])  # never checked by intake
    assert pool.checked == [True, False, False] and pool.calls == 0  # no Arrow tables were built
    d.stop_dispatch()
