"""Admission control (serving/online/admission.py): the predicted wait of a request is the work
queued ahead of it, in the batches the scheduler forms, timed by each mode's service model and
spread over the pool slots; a request whose wait plus own service passes its deadline is refused
with one line naming the deadline and the prediction."""

from __future__ import annotations

import pytest

from sparkgnn.serving.online.admission import Admission, Estimate
from sparkgnn.serving.online.scheduler import SCHEDULERS, Pending


def fitted(admission: Admission, mode: str, a: float, b: float) -> None:
    """Teach `mode`'s model seconds = a + b * cost exactly (two cost levels identify both)."""
    for cost in (10.0, 1000.0) * 20:
        admission.observe(mode, cost, a + b * cost)


def test_the_backlog_is_timed_in_the_batches_the_scheduler_forms():
    admission = Admission(slots=2, t_d=100.0, limits={"he": 64, "exact": 1})
    fitted(admission, "he", 0.002, 1e-5)
    fitted(admission, "exact", 0.010, 1e-4)
    a_he, b_he = admission.model("he").params
    assert a_he == pytest.approx(0.002) and b_he == pytest.approx(1e-5)
    # HE: 10 requests of cost 300 in all fit one batch by count but T_d = 100 makes 3
    assert admission.batch_seconds("he", 10, 300.0) == pytest.approx(3 * 0.002 + 1e-5 * 300)
    # EXACT: one request per batch
    assert admission.batch_seconds("exact", 4, 40.0) == pytest.approx(4 * 0.010 + 1e-4 * 40)
    estimate = admission.estimate({"he": (10, 300.0), "exact": (4, 40.0)}, "exact", 5.0)
    queued = 3 * 0.002 + 1e-5 * 300 + 4 * 0.010 + 1e-4 * 40
    assert estimate.wait_s == pytest.approx(queued / 2)  # two slots share the backlog
    assert estimate.service_s == pytest.approx(0.010 + 1e-4 * 5)
    assert admission.estimate({}, "he", 0.0).wait_s == 0.0


def test_a_request_past_its_deadline_is_refused_naming_the_prediction():
    admission = Admission(slots=1, t_d=100.0, limits={})
    assert admission.refusal(Estimate(0.010, 0.005), deadline_s=0.020) is None
    why = admission.refusal(Estimate(0.030, 0.005), deadline_s=0.020)
    assert "deadline of 20 ms" in why and "30 ms in the queue + 5 ms of service" in why and "\n" not in why
    with pytest.raises(ValueError, match="slots >= 1"):
        Admission(slots=0, t_d=100.0, limits={})


@pytest.mark.parametrize("name", ["fifo", "degree"])
def test_the_schedulers_backlog_counts_what_is_queued_per_group(name):
    scheduler = SCHEDULERS.lookup(name)(10.0, group_max_batch={"exact": 1})
    for cost, group in ((3.0, "he"), (4.0, "he"), (2.0, "exact"), (5.0, "exact")):
        scheduler.push(Pending(key=None, cost=cost, group=group))
    assert scheduler.backlog() == {"he": (2, 7.0), "exact": (2, 7.0)}
    assert scheduler.group_limit("exact") == 1
    taken = scheduler.take(0)
    left = {g: n for g, (n, _c) in scheduler.backlog().items()}
    assert sum(left.values()) == 4 - len(taken)
    scheduler.close()
    assert scheduler.backlog() == {}
