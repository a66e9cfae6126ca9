"""The broker's bookkeeping without sockets: LRU, slots, bounded queue, expiry and requeue."""

from sparkgnn.messenger.dispatch import Dispatcher, Request


def req(token, client=b"c", **kw):
    return Request(client, token, batch=token, **kw)


def test_lru_assigns_least_recently_used_worker_with_a_free_slot():
    d = Dispatcher(liveness_s=1.0)
    d.ready(b"w1", "ipc://w1", 1, now=0)
    d.ready(b"w2", "ipc://w2", 1, now=0)
    ((c1, a1),) = d.request(req("t1"), 0)[0]
    ((c2, a2),) = d.request(req("t2"), 0)[0]
    assert (a1["data"], a2["data"]) == ("ipc://w1", "ipc://w2")
    assert d.request(req("t3"), 0) == ([], False)  # no free slot: queued
    assert d.snapshot()["queue_depth"] == 1
    ((_, a3),) = d.done(b"w2", a2["lease"], now=0.1)  # w2 frees first, gets the queued one
    assert a3["token"] == "t3" and a3["data"] == "ipc://w2"


def test_full_queue_answers_busy_and_does_not_grow():
    d = Dispatcher(liveness_s=1.0, max_queue=2)
    for t in ("a", "b"):
        assert d.request(req(t), 0) == ([], False)
    assert d.request(req("c"), 0) == ([], True)
    assert d.snapshot()["queue_depth"] == 2 and d.counts["busy"] == 1


def test_repeated_lease_request_is_idempotent():
    d = Dispatcher(liveness_s=1.0)
    d.ready(b"w1", "ipc://w1", 2, now=0)
    ((_, first),) = d.request(req("t"), 0)[0]
    ((_, again),) = d.request(req("t"), 0)[0]
    assert first == again and d.snapshot()["leases_active"] == 1


def test_expired_worker_leases_are_requeued_in_front_and_reassigned():
    d = Dispatcher(liveness_s=1.0)
    d.ready(b"w1", "ipc://w1", 2, now=0)
    ((_, a),) = d.request(req("t1"), 0)[0]
    d.request(req("t2"), 0)
    d.request(req("t3", client=b"other"), 0)  # waits behind w1's two slots
    d.ready(b"w2", "ipc://w2", 1, now=0.9)  # takes t3
    d.heard(b"w2", 1.5)
    dead, assignments = d.expire(now=1.5)
    assert [w.wid for w in dead] == [b"w1"]
    assert d.counts["requeued"] == 2
    assert d.snapshot()["queue_depth"] == 2 and assignments == []  # w2 busy with t3
    (t3_lease,) = d.leases
    ((_, b),) = d.done(b"w2", t3_lease, now=1.6)
    assert b["token"] == "t1" and b["requeued"] is True and b["data"] == "ipc://w2"


def test_unused_lease_expires_after_its_ttl_and_frees_the_slot():
    d = Dispatcher(liveness_s=100.0, lease_grace_s=0.0)
    d.ready(b"w1", "ipc://w1", 1, now=0)
    d.request(req("t1", ttl=1.0), 0)
    d.heard(b"w1", 2)
    d.expire(now=2)
    assert d.counts["leases_expired"] == 1 and d.snapshot()["free_slots"] == 1


def test_release_by_token_cancels_a_queued_request():
    d = Dispatcher(liveness_s=1.0)
    d.request(req("t1"), 0)
    d.release(b"c", 0, token="t1")
    assert d.snapshot()["queue_depth"] == 0


def test_affinity_prefers_the_worker_that_served_the_key_before():
    d = Dispatcher(liveness_s=10.0)
    d.ready(b"w1", "ipc://w1", 4, now=0)
    d.ready(b"w2", "ipc://w2", 4, now=0)
    ((_, a),) = d.request(req("t1", affinity="part-3"), 0)[0]
    for t in ("x", "y"):
        d.request(req(t), 0)
    ((_, b),) = d.request(req("t2", affinity="part-3"), 0)[0]
    assert a["data"] == b["data"]
