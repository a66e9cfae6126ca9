"""The same-host shared memory payload route and its guards (reuse, pinning, fallback, sweep)."""

import os
import subprocess
import sys

import fixture_handlers as fh
import pytest

from sparkgnn.messenger import shm
from sparkgnn.messenger.protocol import Kind, control, decode

pytestmark = pytest.mark.skipif(not shm.supported(), reason="no writable /dev/shm")


def own_segments(client):
    return [n for n in os.listdir(shm.SHM_DIR) if n.startswith(f"sparkgnn-{os.getpid()}-{client._client}-")]


def test_payloads_go_through_reused_segments_and_are_cleaned_up(thread_cluster):
    cluster = thread_cluster(workers=2)
    client = cluster.client(window=3)
    reqs = [({"batch": i, "id_column": "id"}, fh.batch(1000, 1000 * i)) for i in range(12)]
    results = list(client.map(reqs))
    assert [o["out"].column("id")[0].as_py() for _, o in results] == [1000 * i for i in range(12)]
    assert client.counts["sent_shm"] == 12 and client.counts.get("shm_retired", 0) == 0
    assert all(h["shm_pinned"] is False for h, _ in results)
    # results come back through reply segments offered by the dealer (with the default
    # shm_min_bytes only once an op's first result has shown its size)
    assert client.counts["results_shm"] >= 12 - 3
    assert 1 <= len(own_segments(client)) <= 2 * 3  # request + reply per in-flight batch, reused
    client.close()
    assert own_segments(client) == []


def test_a_handler_that_keeps_its_input_pins_the_segment_and_nothing_is_overwritten(thread_cluster):
    fh.KEPT.clear()
    cluster = thread_cluster(workers=1, handler=fh.keep)
    with cluster.client(window=2) as client:
        sent = [fh.batch(500, 1000 * i) for i in range(6)]
        results = list(client.map(({"batch": i}, t) for i, t in enumerate(sent)))
        assert all(h["shm_pinned"] is True for h, _ in results)
        assert client.counts["shm_retired"] == 6
    # the worker's retained tables still hold exactly what was sent, segments long retired
    assert [k.equals(t["batch"]) for k, t in zip(fh.KEPT, sent, strict=True)] == [True] * 6
    fh.KEPT.clear()


def test_frames_route_when_disabled_on_either_side(thread_cluster):
    cluster = thread_cluster(workers=1)
    with cluster.client(shm_payloads=False) as client:
        assert client.call({"batch": "a", "id_column": "id"}, fh.batch(10))[0]["batch"] == "a"
        assert client.counts["sent_shm"] == 0
    only_frames = thread_cluster(workers=1, worker_kwargs=dict(shm_payloads=False))
    with only_frames.client() as client:
        assert client.call({"batch": "b", "id_column": "id"}, fh.batch(10))[0]["batch"] == "b"
        assert client.counts["sent_shm"] == 0


def test_worker_that_cannot_open_the_segment_makes_the_dealer_fall_back_to_frames(thread_cluster, monkeypatch):
    cluster = thread_cluster(workers=1)

    def unavailable(name, max_bytes, **_):
        raise shm.ShmUnavailable(f"cannot open shared memory segment {name!r}: other namespace")

    monkeypatch.setattr(shm, "Mapping", unavailable)
    with cluster.client() as client:
        header, out = client.call({"batch": "x", "id_column": "id"}, fh.batch(10))
        assert out["out"].num_rows == 10
        assert client.counts["sent_shm"] == 1 and client.counts["sent"] == 2  # shm, then frames
    assert cluster.workers[0].metrics()["malformed"] == 1


@pytest.mark.parametrize(
    "ref, message",
    [
        ({"name": "../../etc/passwd", "parts": [[0, 10]]}, "bad shared memory segment name"),
        ({"name": "sparkgnn-1-0123456789ab-1", "parts": [[64, 10]], "key": "ab" * 32}, "cannot open shared memory"),
        ({"name": "sparkgnn-1-0123456789ab-1", "parts": [[64, 10]]}, "shared memory key must be"),
        ("not-an-object", "header 'shm' must be an object"),
    ],
)
def test_bad_segment_references_are_refused_and_counted(thread_cluster, ref, message):
    import zmq

    cluster = thread_cluster(workers=1)
    sock = cluster.context.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(cluster.workers[0].data_endpoint)
    sock.send_multipart(control(Kind.TASK, batch="evil", shm=ref))
    assert sock.poll(5000)
    header, _ = decode(sock.recv_multipart(), 1 << 20)
    sock.close(0)
    assert header["kind"] == "ERROR" and message in header["error"]
    assert cluster.workers[0].metrics()["malformed"] == 1


def test_out_of_bounds_parts_are_refused(tmp_path):
    seg = shm.Segment(f"sparkgnn-{os.getpid()}-{'ab' * 6}-99", 1 << 20)
    try:
        mapping = shm.Mapping(seg.name, 1 << 30, key=seg.key)
        with pytest.raises(ValueError, match="outside segment"):
            mapping.views([[1 << 20, 8]])
        with pytest.raises(ValueError, match="outside segment"):
            mapping.views([[0, 8]])  # the key block is never a payload part
        with pytest.raises(ValueError, match="bad shm part"):
            mapping.views([[0, "8"]])
        assert mapping.close() is True
    finally:
        seg.destroy()


def test_segments_of_dead_dealers_are_swept():
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    path = os.path.join(shm.SHM_DIR, f"sparkgnn-{dead}-{'cd' * 6}-1")
    open(path, "wb").close()
    mine = shm.Segment(f"sparkgnn-{os.getpid()}-{'cd' * 6}-2", 1 << 20)
    try:
        assert shm.sweep_stale() >= 1
        assert not os.path.exists(path)
        assert os.path.exists(os.path.join(shm.SHM_DIR, mine.name))  # live owner: kept
    finally:
        mine.destroy()


def test_results_that_outgrow_the_reply_segment_come_back_as_frames(thread_cluster):
    cluster = thread_cluster(workers=1)
    with cluster.client(shm_min_bytes=1) as client:
        small = client.call({"batch": "s", "op": "scale"}, fh.batch(10))  # sizes the offer
        big = client.call({"batch": "b", "op": "scale", "repeat": 400, "factor": 1.0}, fh.batch(5000))
        again = client.call({"batch": "a", "op": "scale"}, fh.batch(10))
    assert big[1]["out"].num_rows == 2_000_000 and small[1]["out"].num_rows == 10
    assert again[1]["out"].column("id").to_pylist() == list(range(10))


def test_a_result_naming_a_segment_the_dealer_did_not_offer_is_rejected(thread_cluster):
    """A fake worker (raw sockets) answers with a forged shared memory reference."""
    import threading

    import zmq
    from messenger_helpers import wait_for

    from sparkgnn.messenger.errors import TransportError
    from sparkgnn.messenger.protocol import peek_header

    cluster = thread_cluster(workers=0)
    ctx = cluster.context
    data = ctx.socket(zmq.ROUTER)
    data.linger = 0
    data.bind("inproc://fake-worker-data")
    ctl = ctx.socket(zmq.DEALER)
    ctl.linger = 0
    ctl.connect(cluster.back)
    ctl.send_multipart(control(Kind.READY, data="inproc://fake-worker-data", slots=1, host=shm.host_id(), shm=True))
    assert wait_for(lambda: cluster.broker.metrics().get("live_workers") == 1)
    stop = threading.Event()

    def fake_worker():
        while not stop.is_set():
            if data.poll(20):
                ident, *frames = data.recv_multipart()
                task = peek_header(frames)
                forged = {k: task.get(k) for k in ("batch", "token", "lease")}
                forged["shm"] = {"name": f"sparkgnn-{os.getpid()}-{'ef' * 6}-1", "parts": [[0, 8]]}
                forged.update(tables=["out"], rows={"out": 1}, hash="xxh3_64:0")
                data.send_multipart(
                    [ident]
                    + control(Kind.RESULT, **{k: v for k, v in forged.items() if k not in ("tables", "rows", "hash")})
                )
            ctl.send_multipart(control(Kind.HEARTBEAT, data="inproc://fake-worker-data", slots=1))

    thread = threading.Thread(target=fake_worker)
    thread.start()
    try:
        with cluster.client(timeout_s=5.0, retries=0) as client:
            with pytest.raises(TransportError, match="did not offer"):
                client.call({"batch": "forged"}, fh.batch(10))
            assert client.counts["bad_results"] == 1
    finally:
        stop.set()
        thread.join(5)
        data.close(0)
        ctl.close(0)


def _raw_task(cluster, header_fields: dict, payload_tables: dict | None = None, peek: bool = False):
    """Send one TASK straight to the first worker's data socket (a peer that skips the dealer);
    returns the decoded reply header and tables (with `peek`: the header and no tables, for a
    reply that names a shared memory segment)."""
    import zmq

    from sparkgnn.messenger.protocol import encode_header, peek_header, serialize_table, stamp

    tables = payload_tables or {}
    payload = [serialize_table(t) for t in tables.values()]
    header = stamp(header_fields, Kind.TASK.value, tables, payload)
    sock = cluster.context.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(cluster.workers[0].data_endpoint)
    try:
        sock.send_multipart([encode_header(header), *payload])
        assert sock.poll(5000)
        frames = sock.recv_multipart()
        return (peek_header(frames, 1 << 24), {}) if peek else decode(frames, 1 << 24)
    finally:
        sock.close(0)


def test_a_peer_naming_another_jobs_segment_is_refused_without_a_hash(thread_cluster):
    """The segment holds another job's table; the peer knows its name and parts (listing
    /dev/shm shows names) but not its key: refused before any byte is hashed or read, and the
    refusal carries nothing computed from the segment's bytes."""
    from sparkgnn.messenger import hashing
    from sparkgnn.messenger.protocol import encode_header, stamp

    cluster = thread_cluster(workers=1)
    other_job = shm.Segment(f"sparkgnn-{os.getpid()}-{'ef' * 6}-1", 1 << 20)
    try:
        tables = fh.batch(100)
        parts, views = other_job.write_tables(tables.values())
        actual = hashing.digest(views, hashing.DEFAULT)
        header = stamp({"batch": "probe", "id_column": "id"}, Kind.TASK.value, tables, views)
        header["hash"] = f"{hashing.DEFAULT}:{'0' * 16}"  # a guess the worker must not answer with the truth
        header["shm"] = {"name": other_job.name, "parts": parts, "key": "00" * 32}
        import zmq

        sock = cluster.context.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(cluster.workers[0].data_endpoint)
        sock.send_multipart([encode_header(header)])
        assert sock.poll(5000)
        reply, _ = decode(sock.recv_multipart(), 1 << 20)
        sock.close(0)
        del views
    finally:
        other_job.destroy()
    assert reply["kind"] == "ERROR" and "is not this task's" in reply["error"]
    assert actual.split(":", 1)[1] not in reply["error"] and "hash" not in reply["error"]
    assert cluster.workers[0].metrics()["tasks"] == 0  # the handler never ran


def test_a_hash_mismatch_never_names_the_computed_digest():
    from sparkgnn.messenger import hashing
    from sparkgnn.messenger.protocol import ProtocolError, decode_payload, serialize_table, stamp

    tables = fh.batch(10)
    payload = [serialize_table(t) for t in tables.values()]
    header = dict(stamp({"batch": "b"}, Kind.TASK.value, tables, payload), hash=f"{hashing.DEFAULT}:{'0' * 16}")
    actual = hashing.digest(payload, hashing.DEFAULT).split(":", 1)[1]
    with pytest.raises(ProtocolError, match="payload hash mismatch") as caught:
        decode_payload(header, [pa_buffer(f) for f in payload])
    assert actual not in str(caught.value)


def pa_buffer(frame):
    import pyarrow as pa

    return pa.py_buffer(bytes(frame))


def test_reply_shm_into_a_foreign_segment_is_refused(thread_cluster):
    """A peer offers another job's segment as the reply segment: the worker writes nothing
    into it and answers with frames."""
    cluster = thread_cluster(workers=1)
    foreign = shm.Segment(f"sparkgnn-{os.getpid()}-{'fe' * 6}-1", 1 << 20)
    try:
        before = bytes(foreign._mm[:])
        ref = {"name": foreign.name, "size": foreign.size, "key": "11" * 32}
        header, out = _raw_task(cluster, {"batch": "r", "id_column": "id", "reply_shm": ref}, fh.batch(50))
        assert header["kind"] == "RESULT" and header.get("shm") is None and out["out"].num_rows == 50
        assert bytes(foreign._mm[:]) == before
        assert cluster.workers[0].metrics()["reply_shm_unavailable"] == 1
        # the same offer with the segment's own key is written into (the route still works)
        ref["key"] = foreign.key
        header, _ = _raw_task(cluster, {"batch": "s", "id_column": "id", "reply_shm": ref}, fh.batch(50), peek=True)
        assert header["kind"] == "RESULT" and header["shm"]["name"] == foreign.name
    finally:
        foreign.destroy()
