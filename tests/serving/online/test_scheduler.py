"""sparkgnn.serving.online.scheduler: fifo and degree (GSM) batching under T_d and max_batch, groups
never mixed, promotion of a starving request (fake clock), back-pressure, take's timeout and close,
the batch divider, and the online service model."""

import random
import threading

import pytest

from sparkgnn.serving.online.scheduler import (
    SCHEDULERS,
    DegreeScheduler,
    FifoScheduler,
    Pending,
    QueueFull,
    SchedulerError,
    ServiceModel,
    divide,
)


class FakeClock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def req(key, cost, group="", arrived=0.0, hop_sizes=()):
    return Pending(key=key, cost=cost, hop_sizes=tuple(hop_sizes), group=group, arrived=arrived)


def drain(s, limit=10_000):
    batches = []
    while len(s) and len(batches) < limit:
        batches.append(s.take(0))
    return batches


def keys(batch):
    return [p.key for p in batch]


def test_registry_names_and_unknown_name():
    assert SCHEDULERS.names() == ["degree", "fifo"]
    assert isinstance(SCHEDULERS.lookup("degree")(10), DegreeScheduler)
    assert isinstance(SCHEDULERS.lookup("fifo")(10, capacity=3), FifoScheduler)
    with pytest.raises(SchedulerError, match="unknown scheduler 'lifo'; known: degree, fifo"):
        SCHEDULERS.lookup("lifo")(10)


def test_fifo_keeps_arrival_order_and_fills_up_to_t_d():
    s = FifoScheduler(t_d=10)
    for i, cost in enumerate([4, 5, 2, 9, 1, 1]):
        s.push(req(i, cost))
    # 4+5 = 9 (+2 would be 11); 2 (+9 = 11); 9+1 = 10; 1
    assert [keys(b) for b in drain(s)] == [[0, 1], [2], [3, 4], [5]]


def test_degree_serves_cheapest_first_ascending():
    s = DegreeScheduler(t_d=1000, max_batch=2, clock=FakeClock(0.0))
    costs = [50, 3, 20, 7, 1, 30]
    for i, cost in enumerate(costs):
        s.push(req(i, cost))
    order = [p.cost for b in drain(s) for p in b]
    assert order == sorted(costs)


@pytest.mark.parametrize("name", ["fifo", "degree"])
def test_a_batch_never_exceeds_t_d_unless_it_is_one_request(name):
    rng = random.Random(7)
    s = SCHEDULERS.lookup(name)(100, max_batch=16, clock=FakeClock(0.0))
    pushed = []
    for i in range(500):
        p = req(i, rng.choice([0, 1, 5, 30, 60, 99, 100, 101, 250, 1000]))
        s.push(p)
        pushed.append(p)
    seen = []
    for batch in drain(s):
        assert 1 <= len(batch) <= 16
        if len(batch) > 1:
            assert sum(p.cost for p in batch) <= 100
        seen.extend(batch)
    assert sorted(map(id, seen)) == sorted(map(id, pushed))  # each request exactly once


def test_degree_fills_until_the_next_would_exceed():
    s = DegreeScheduler(t_d=10, clock=FakeClock(0.0))
    for i, cost in enumerate([6, 3, 2, 4]):
        s.push(req(i, cost))
    assert [[p.cost for p in b] for b in drain(s)] == [[2, 3, 4], [6]]


@pytest.mark.parametrize("name", ["fifo", "degree"])
def test_groups_are_never_mixed(name):
    rng = random.Random(3)
    s = SCHEDULERS.lookup(name)(50, clock=FakeClock(0.0))
    for i in range(300):
        s.push(req(i, rng.randint(0, 20), group=rng.choice(["full", "srpe", "he"])))
    total = 0
    for batch in drain(s):
        assert len({p.group for p in batch}) == 1
        total += len(batch)
    assert total == 300


def test_fifo_batch_takes_the_oldest_requests_group():
    s = FifoScheduler(t_d=100)
    s.push(req("a1", 1, group="a"))
    s.push(req("b1", 1, group="b"))
    s.push(req("a2", 1, group="a"))
    assert keys(s.take(0)) == ["a1", "a2"]
    assert keys(s.take(0)) == ["b1"]


def test_starving_expensive_request_is_promoted_ahead_of_cheaper_ones():
    clock = FakeClock(0.0)
    service = ServiceModel(overhead_s=0.0, per_cost_s=0.01)  # cost 100 -> 1 s; promoted after 4 s
    s = DegreeScheduler(t_d=100, max_wait_factor=4.0, service=service, clock=clock)
    s.push(req("big", 100, arrived=0.0))
    # A steady stream of cheap requests keeps the big one behind them...
    for step in range(4):
        clock.now = float(step)
        s.push(req(f"small{step}", 1, arrived=clock.now))
        assert keys(s.take(0)) == [f"small{step}"]
    # ...until its wait reaches 4 x its predicted service time: then it goes first.
    clock.now = 4.0
    s.push(req("small4", 1, arrived=clock.now))
    assert keys(s.take(0)) == ["big"]
    assert keys(s.take(0)) == ["small4"]


def test_promoted_requests_go_oldest_first_and_then_the_batch_fills_by_cost():
    clock = FakeClock(0.0)
    s = DegreeScheduler(t_d=100, service=ServiceModel(overhead_s=1.0, per_cost_s=0.0), clock=clock)
    s.push(req("old-b", 40, arrived=1.0))
    s.push(req("old-a", 50, arrived=0.5))
    s.push(req("fresh-cheap", 5, arrived=9.0))
    s.push(req("fresh-mid", 8, arrived=9.0))
    clock.now = 9.0  # deadline = arrived + 4 s: the first two are due, the fresh ones are not
    assert keys(s.take(0)) == ["old-a", "old-b", "fresh-cheap"]  # 50 + 40 + 5 <= 100 < +8
    assert keys(s.take(0)) == ["fresh-mid"]


def test_degree_scheduler_at_10k_queued_keeps_its_invariants():
    rng = random.Random(11)
    clock = FakeClock(0.0)
    s = DegreeScheduler(t_d=500, service=ServiceModel(0.0, 1e-3), clock=clock)
    pushed = 0
    for i in range(10_000):
        s.push(req(i, rng.randint(1, 400), group=str(i % 2), arrived=clock.now))
        pushed += 1
    assert len(s) == 10_000
    taken = 0
    while len(s):
        clock.now += 0.05
        batch = s.take(0)
        assert batch and len({p.group for p in batch}) == 1
        taken += len(batch)
        if rng.random() < 0.5 and pushed < 15_000:  # keep arrivals going while serving
            s.push(req(pushed, rng.randint(1, 400), arrived=clock.now))
            pushed += 1
    assert taken == pushed
    # lazy deletion leaves no unbounded garbage behind
    assert len(s._deadlines) <= 64 and not s._by_cost


def test_push_refuses_at_capacity_with_queue_full():
    s = DegreeScheduler(t_d=10, capacity=2)
    s.push(req(1, 1))
    s.push(req(2, 1))
    with pytest.raises(QueueFull, match=r"full \(2 requests queued, its capacity\)"):
        s.push(req(3, 1))
    assert isinstance(QueueFull("x"), SchedulerError) and len(s) == 2
    s.take(0)
    s.push(req(3, 1))  # room again


@pytest.mark.parametrize("cost", [-1, float("nan"), float("inf"), None])
def test_push_refuses_a_malformed_cost(cost):
    with pytest.raises(SchedulerError, match="cost"):
        FifoScheduler(t_d=10).push(req(1, cost))


def test_bad_configuration_is_refused():
    with pytest.raises(SchedulerError, match="T_d"):
        DegreeScheduler(t_d=0)
    with pytest.raises(SchedulerError, match="capacity"):
        FifoScheduler(t_d=1, capacity=0)


@pytest.mark.parametrize("name", ["fifo", "degree"])
def test_take_times_out_with_an_empty_batch(name):
    assert SCHEDULERS.lookup(name)(10).take(0.01) == []


@pytest.mark.parametrize("name", ["fifo", "degree"])
def test_close_wakes_a_blocked_take_and_returns_what_was_left(name):
    s = SCHEDULERS.lookup(name)(10)
    got = []
    waiting = threading.Thread(target=lambda: got.append(s.take(60)))
    waiting.start()
    s.close()
    waiting.join(30)
    assert not waiting.is_alive() and got == [[]]
    with pytest.raises(SchedulerError, match="closed"):
        s.push(req(1, 1))
    t = SCHEDULERS.lookup(name)(10)
    a, b = req("a", 5), req("b", 1)
    t.push(a)
    t.push(b)
    assert t.close() == [a, b] and t.take(0) == [] and len(t) == 0


def test_a_push_wakes_a_blocked_take():
    s = FifoScheduler(t_d=10)
    got = []
    waiting = threading.Thread(target=lambda: got.append(keys(s.take(60))))
    waiting.start()
    s.push(req("x", 1))
    waiting.join(30)
    assert got == [["x"]]


def test_divide_respects_t_s_on_every_layer_and_keeps_every_request_once_in_order():
    rng = random.Random(5)
    batch = [req(i, 1, hop_sizes=(rng.randint(1, 30), rng.randint(1, 300))) for i in range(200)]
    batch.append(req("huge", 1, hop_sizes=(5, 5000)))
    parts = divide(batch, 250)
    assert [p for part in parts for p in part] == batch
    for part in parts:
        assert part
        if len(part) > 1:
            for l in range(2):
                assert sum(p.hop_sizes[l] for p in part) <= 250
    assert [keys(part) for part in parts if "huge" in keys(part)] == [["huge"]]
    # greedy: a sub-batch is closed only when the next request would not fit
    for part, following in zip(parts, parts[1:], strict=False):
        nxt = following[0].hop_sizes
        assert any(sum(p.hop_sizes[l] for p in part) + nxt[l] > 250 for l in range(2))


def test_divide_without_threshold_and_on_uneven_layer_counts():
    batch = [req(1, 1, hop_sizes=(3,)), req(2, 1, hop_sizes=(3, 9))]
    assert divide(batch, 0) == [batch] and divide([], 5) == []
    assert divide(batch, 10) == [batch]
    assert divide(batch, 8) == [[batch[0]], [batch[1]]]


def test_service_model_starts_at_its_prior_and_learns_a_linear_relation():
    m = ServiceModel(overhead_s=0.01, per_cost_s=1e-4)
    assert m.predict(1000) == pytest.approx(0.11)
    rng = random.Random(2)
    for _ in range(300):
        x = rng.uniform(100, 5000)
        m.observe(x, 0.003 + 2e-6 * x + rng.gauss(0, 1e-5))
    a, b = m.params
    assert a == pytest.approx(0.003, abs=5e-4) and b == pytest.approx(2e-6, rel=0.05)
    assert m.predict(10_000) == pytest.approx(0.023, rel=0.05)


def test_service_model_with_one_cost_level_keeps_the_prior_overhead():
    m = ServiceModel(overhead_s=0.01, per_cost_s=1e-4)
    m.observe(100, 0.05)
    m.observe(100, 0.05)
    assert m.params == pytest.approx((0.01, 4e-4))
    with pytest.raises(SchedulerError):
        m.observe(-1, 0.1)


@pytest.mark.parametrize("name", ["fifo", "degree"])
def test_group_max_batch_caps_only_its_group(name):
    """Modes answered request by request (serving EXACT) take one request per batch, so the
    scheduler chooses again whenever a slot frees; other groups still fill up to T_d."""
    s = SCHEDULERS.lookup(name)(1e9, group_max_batch={"exact": 1})
    for i in range(4):
        s.push(req(f"e{i}", 1.0, group="exact", arrived=i))
        s.push(req(f"h{i}", 1.0, group="he", arrived=i + 0.5))
    sizes = {}
    for batch in drain(s):
        sizes.setdefault(batch[0].group, []).append(len(batch))
    assert sizes == {"exact": [1, 1, 1, 1], "he": [4]}


def test_an_express_take_serves_only_requests_within_its_ceiling_cheapest_first():
    service = ServiceModel(overhead_s=0.001, per_cost_s=0.001)  # predict(cost) = (1 + cost) ms
    s = DegreeScheduler(t_d=1000, service=service, clock=FakeClock(0.0))  # nothing promoted
    for key, cost in (("big", 200), ("c3", 3), ("c10", 10), ("c1", 1)):
        s.push(req(key, cost))
    # within 5 ms: cost sums <= 4, cheapest first
    assert keys(s.take(0, within_s=0.005)) == ["c1", "c3"]
    assert s.take(0, within_s=0.005) == [] and len(s) == 2  # the rest stays for the plain takes
    assert s.backlog() == {"": (2, 210.0)}
    assert keys(s.take(0)) == ["c10", "big"]
    with pytest.raises(SchedulerError, match="within_s"):
        s.take(0, within_s=float("nan"))


def test_fifo_has_no_express_lanes():
    s = FifoScheduler(t_d=1000, service=ServiceModel(overhead_s=0.001, per_cost_s=0.001))
    s.push(req("cheap", 1))
    assert s.take(0, within_s=1.0) == [] and len(s) == 1
    assert keys(s.take(0)) == ["cheap"]


def test_a_blocked_express_take_is_woken_only_by_a_request_within_its_ceiling():
    s = DegreeScheduler(t_d=1000, service=ServiceModel(overhead_s=0.001, per_cost_s=0.001))
    got: list = []
    lane = threading.Thread(target=lambda: got.append(s.take(30.0, within_s=0.005)))
    lane.start()
    s.push(req("expensive", 500))
    assert keys(s.take(5.0)) == ["expensive"]  # the plain take gets it; the lane keeps waiting
    assert lane.is_alive() and got == []
    s.push(req("cheap", 2))
    lane.join(timeout=10.0)
    assert not lane.is_alive() and [keys(b) for b in got] == [["cheap"]]


def test_an_express_take_holds_only_while_its_condition_does_and_a_poke_ends_it():
    s = DegreeScheduler(t_d=1000, service=ServiceModel(overhead_s=0.001, per_cost_s=0.001))
    held = threading.Event()  # the condition: the slots are held by an expensive batch
    s.push(req("cheap", 2))
    assert s.take(5.0, within_s=0.005, when=held.is_set) == [] and len(s) == 1  # at once, nothing taken
    held.set()
    assert keys(s.take(5.0, within_s=0.005, when=held.is_set)) == ["cheap"]
    got: list = []
    lane = threading.Thread(target=lambda: got.append(s.take(30.0, within_s=0.005, when=held.is_set)))
    lane.start()
    lane.join(timeout=0.3)
    assert lane.is_alive()  # waiting for a request within its ceiling
    held.clear()
    s.poke()  # the slots freed: the take ends empty instead of waiting on
    lane.join(timeout=10.0)
    assert not lane.is_alive() and got == [[]]


def _simulate(
    lanes: int, arrivals: list[tuple[float, str, float]], factor: float = 4.0
) -> tuple[dict[str, float], int]:
    """A fake-clock run of one plain slot plus `lanes` express lanes (ceilings as dispatch.py:
    factor**k x a cost-1 request's predicted service), one request per batch as for the modes
    answered request by request, each batch taking exactly its predicted service: per request,
    its wait / its own service; and how many requests the lanes took. A lane takes only while the
    plain slot runs a batch predicted to take longer than the lane's ceiling (dispatch.py's
    condition)."""
    clock = FakeClock(0.0)
    service = ServiceModel(overhead_s=0.001, per_cost_s=0.001)
    s = DegreeScheduler(t_d=1e9, max_batch=1, service=service, max_wait_factor=factor, clock=clock)
    ceilings = [None] + [factor**k * service.predict(1.0) for k in range(1, lanes + 1)]
    free_at = [0.0] * len(ceilings)
    running = [0.0]  # predicted seconds of the plain slot's batch while it runs
    lane_takes = [0]
    todo = sorted(arrivals)
    ratios: dict[str, float] = {}
    i = 0
    while True:
        while i < len(todo) and todo[i][0] <= clock.now:
            t, key, cost = todo[i]
            s.push(req(key, cost, arrived=t))
            i += 1
        if free_at[0] <= clock.now:
            running[0] = 0.0
        for slot, ceiling in enumerate(ceilings):
            if free_at[slot] <= clock.now:
                held = None if ceiling is None else (lambda c=ceiling: running[0] > c)
                for p in s.take(0, within_s=ceiling, when=held):
                    seconds = service.predict(p.cost)
                    ratios[p.key] = (clock.now - p.arrived) / seconds
                    free_at[slot] = clock.now + seconds
                    if slot == 0:
                        running[0] = seconds
                    else:
                        lane_takes[0] += 1
        later = [t for t in free_at if t > clock.now] + ([todo[i][0]] if i < len(todo) else [])
        if not later:
            return ratios, lane_takes[0]
        clock.now = min(later)


def test_express_lanes_bound_the_wait_of_requests_arriving_behind_an_expensive_batch():
    # an expensive request (about 1 s) starts first; requests of 2 to 61 ms arrive while it runs,
    # some of them at once
    arrivals = [(0.0, "expensive", 1000.0)]
    for burst in range(5):
        t = 0.05 + 0.15 * burst
        arrivals += [(t, f"b{burst}-c60", 60.0), (t, f"b{burst}-c20", 20.0), (t + 0.001, f"b{burst}-c5", 5.0)]
        arrivals += [(t + 0.002, f"b{burst}-c1-{k}", 1.0) for k in range(2)]
    with_lanes, taken = _simulate(3, arrivals)
    assert len(with_lanes) == len(arrivals) and taken > 0
    assert max(with_lanes.values()) <= 4.0  # every wait <= max_wait_factor x the request's own service
    without, _ = _simulate(0, arrivals)  # one slot: the cheap ones wait for the expensive batch
    assert max(without.values()) > 100.0


def test_express_lanes_stay_idle_behind_cheap_batches():
    # cheap requests (2-4 ms), now and then two at once: the slot's batches never exceed a lane's
    # ceiling, so the lanes take nothing (the slot keeps every request) and the bound holds anyway
    arrivals = [(0.005 * k, f"c{k}", float(1 + k % 3)) for k in range(60)]
    arrivals += [(0.005 * k + 0.001, f"pair{k}", 1.0) for k in range(0, 60, 10)]
    ratios, taken = _simulate(3, arrivals)
    assert len(ratios) == len(arrivals) and taken == 0
    assert max(ratios.values()) <= 4.0
