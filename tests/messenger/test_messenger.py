"""Broker + worker threads + dealer over real ZeroMQ sockets (inproc/ipc/tcp), in one process."""

import logging
import os
import threading

import fixture_handlers as fh
import pytest
import zmq
from messenger_helpers import HB, wait_for

from sparkgnn.messenger import endpoints
from sparkgnn.messenger.broker import Broker
from sparkgnn.messenger.dealer import MessengerTransport
from sparkgnn.messenger.errors import RemoteTaskError, SecurityError, TransportError
from sparkgnn.messenger.local import free_tcp_port
from sparkgnn.messenger.protocol import Kind, control, decode, encode


@pytest.mark.parametrize("scheme", ["inproc", "ipc"])
def test_call_and_pipelined_map_return_verified_results_in_order(thread_cluster, scheme):
    cluster = thread_cluster(scheme=scheme)
    with cluster.client(window=4) as client:
        header, out = client.call({"op": "scale", "factor": 3.0, "id_column": "id"}, fh.batch(5))
        assert header["kind"] == "RESULT" and out["out"].column("x").to_pylist() == [0, 1.5, 3, 4.5, 6]
        reqs = (({"op": "scale", "batch": i, "id_column": "id"}, fh.batch(50, 100 * i)) for i in range(24))
        results = list(client.map(reqs, window=4))
    assert [h["batch"] for h, _ in results] == list(range(24))
    for i, (_, out) in enumerate(results):
        assert out["out"].column("id").to_pylist() == list(range(100 * i, 100 * i + 50))
    done = [w.metrics()["results"] for w in cluster.workers]
    assert sum(done) == 25 and all(d > 0 for d in done)  # both workers used


def test_handler_error_is_an_error_frame_and_the_worker_keeps_serving(thread_cluster):
    cluster = thread_cluster(workers=1)
    with cluster.client() as client:
        with pytest.raises(RemoteTaskError, match=r"batch 'bad' op 'scale'.*ValueError: asked to fail: wrong width"):
            client.call({"batch": "bad", "op": "scale", "fail": "wrong width"}, fh.batch(3))
        header, _ = client.call({"batch": "good", "op": "scale"}, fh.batch(3))
    assert header["batch"] == "good"
    assert cluster.workers[0].metrics()["errors"] == 1


def test_an_error_reply_carries_one_line_and_the_traceback_stays_in_the_worker_log(thread_cluster, caplog):
    cluster = thread_cluster(workers=1)
    secret = 'detail\n  File "/srv/worker/secret_module.py", line 7, in handler'
    with caplog.at_level(logging.WARNING, logger="sparkgnn.messenger.worker_loop"):
        with cluster.client() as client:
            with pytest.raises(RemoteTaskError, match=r"ValueError: asked to fail: detail") as caught:
                client.call({"batch": "bad", "op": "scale", "fail": secret}, fh.batch(3))
    assert "secret_module" not in str(caught.value) and "Traceback" not in str(caught.value)
    logged = [r for r in caplog.records if r.exc_info]
    assert logged and "secret_module" in str(logged[0].exc_info[1])  # kept locally, with its traceback


def _raw(sock_type, endpoint, context):
    s = context.socket(sock_type)
    s.linger = 0
    s.connect(endpoint)
    return s


def _malformed_messages():
    good = encode({"kind": "TASK", "batch": "m", "lease": "nope"}, fh.batch(10))
    truncated = [good[0], bytes(good[1])[:-40]]
    wrong_version = control(Kind.TASK, batch="m")
    wrong_version[0] = wrong_version[0].replace(b'"v":1', b'"v":7')
    unknown = [wrong_version[0].replace(b'"v":7', b'"v":1').replace(b'"TASK"', b'"FROB"')]
    return {
        "random": [os.urandom(64)],
        "truncated": truncated,
        "version": wrong_version,
        "unknown": unknown,
        "oversize": [good[0]] + [b"\0" * 700_000] * 2,
    }


def test_malformed_frames_are_counted_and_survived(thread_cluster):
    cluster = thread_cluster(workers=1, worker_kwargs=dict(max_message_bytes=1_000_000))
    ctx = cluster.context
    front = _raw(zmq.DEALER, cluster.front, ctx)
    back = _raw(zmq.DEALER, cluster.back, ctx)
    data = _raw(zmq.DEALER, cluster.workers[0].data_endpoint, ctx)
    bad = _malformed_messages()
    for frames in bad.values():
        front.send_multipart(frames)
        back.send_multipart(frames)
        data.send_multipart(frames)
    # the worker answers each bad task with an ERROR naming the problem
    errors = []
    for _ in bad:
        assert data.poll(5000)
        header, _ = decode(data.recv_multipart(), 1 << 20)
        errors.append((header["kind"], header["error_type"], header["retryable"]))
    assert all(kind == "ERROR" and etype == "ProtocolError" for kind, etype, _ in errors)

    def worker_bad():
        return cluster.workers[0].metrics()["malformed"] + cluster.workers[0].metrics()["unknown_kind"]

    assert wait_for(lambda: worker_bad() == len(bad))
    # the broker counts them per socket (the oversize frame is dropped by libzmq's size cap
    # on the broker, which only takes control messages, so it may not reach the counter)
    assert wait_for(lambda: cluster.broker.metrics()["malformed_front"] + cluster.broker.metrics()["unknown_kind"] >= 4)
    assert wait_for(lambda: cluster.broker.metrics()["malformed_back"] >= 3)
    for s in (front, back, data):
        s.close(0)
    # and both still work
    with cluster.client() as client:
        assert client.call({"batch": "after"}, fh.batch(2))[0]["batch"] == "after"
    assert cluster.broker.metrics()["live_workers"] == 1


def test_full_broker_queue_means_busy_back_pressure_and_bounded_memory(thread_cluster):
    # a slower broker heartbeat: a false expiry under CPU load would requeue past max_queue
    cluster = thread_cluster(workers=1, broker_kwargs=dict(max_queue=1, heartbeat_s=0.3), worker_kwargs=dict(slots=1))
    clients = [cluster.client(window=4) for _ in range(2)]
    results = {}

    def run(i, client):
        reqs = (({"batch": f"{i}-{j}", "sleep": 0.02}, fh.batch(4)) for j in range(6))
        results[i] = [h["batch"] for h, _ in client.map(reqs)]

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(clients)]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    metrics = cluster.broker.metrics()
    assert results == {i: [f"{i}-{j}" for j in range(6)] for i in range(2)}
    assert metrics["busy"] > 0 and sum(c.counts["busy"] for c in clients) > 0
    assert metrics["queue_max"] <= 1
    for c in clients:
        c.close()


@pytest.fixture
def fresh_context():
    """Separate contexts (each CURVE server side needs its own ZAP handler); destroyed after."""
    made = []

    def make():
        made.append(zmq.Context())
        return made[-1]

    yield make
    for ctx in made:
        ctx.destroy(linger=0)


def test_periodic_metrics_line(tmp_path, fresh_context, caplog):
    caplog.set_level(logging.INFO, logger="sparkgnn.messenger")
    stop = threading.Event()
    broker = Broker(
        f"ipc://{tmp_path}/f.ipc",
        f"ipc://{tmp_path}/b.ipc",
        heartbeat_s=HB,
        metrics_interval_s=0.05,
        context=fresh_context(),
    )
    thread = threading.Thread(target=broker.run, args=(stop,))
    thread.start()
    lines = lambda: [r.getMessage() for r in caplog.records if r.name == "sparkgnn.messenger.broker"]  # noqa: E731
    assert wait_for(lambda: len(lines()) >= 2)
    stop.set()
    thread.join(5)
    line = lines()[0]
    for key in ("tasks/s=", "queue=", "live_workers="):
        assert key in line
    assert not os.path.exists(f"{tmp_path}/f.ipc")  # ipc files cleaned up


def test_no_broker_fails_within_the_timeout_naming_batch_op_and_endpoint(tmp_path):
    endpoint = f"ipc://{tmp_path}/nobody.ipc"
    with MessengerTransport(endpoint, timeout_s=0.3, retries=1, heartbeat_s=HB) as client:
        with pytest.raises(TransportError, match=rf"batch 'b1' op 'scale'.*{endpoint}.*gave up after 2 attempts"):
            client.call({"batch": "b1", "op": "scale"}, fh.batch(2))


def test_non_loopback_binds_need_curve_keys():
    with pytest.raises(SecurityError, match="requires CURVE keys"):
        Broker("tcp://0.0.0.0:5999", "tcp://127.0.0.1:5998")
    with pytest.raises(SecurityError, match="--bind-any"):
        endpoints.check_bind("tcp://10.1.2.3:5999", None, bind_any=False)
    assert endpoints.is_loopback("tcp://127.0.0.1:1") and endpoints.is_loopback("ipc:///tmp/x")
    assert endpoints.is_loopback("tcp://[::1]:5") and not endpoints.is_loopback("tcp://*:5")


def test_ipc_data_sockets_default_to_a_private_folder_not_the_shared_temp_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("SPARKGNN_IPC_DIR", raising=False)
    runtime = tmp_path / "run"
    runtime.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    bound = endpoints.data_bind_for("ipc:///somewhere/back.ipc")
    folder = runtime / f"sparkgnn-{os.getuid()}"
    assert bound.startswith(f"ipc://{folder}/sparkgnn-w") and (folder.stat().st_mode & 0o777) == 0o700
    folder.chmod(0o777)  # a folder others may write into is refused, never used
    with pytest.raises(SecurityError, match="is not a private directory of this user"):
        endpoints.data_bind_for("ipc:///somewhere/back.ipc")
    monkeypatch.setenv("SPARKGNN_IPC_DIR", str(tmp_path))  # an explicit folder is the caller's choice
    assert endpoints.data_bind_for("ipc:///x").startswith(f"ipc://{tmp_path}/")


def test_curve_without_the_server_key_gets_nothing_through_and_with_it_works(tmp_path, fresh_context):
    from sparkgnn.messenger.security import make_full_set
    from sparkgnn.messenger.worker import Worker

    keys = tmp_path / "keys"
    make_full_set(keys)
    assert "public-key" in (keys / "server.key").read_text()

    front, back = f"tcp://127.0.0.1:{free_tcp_port()}", f"tcp://127.0.0.1:{free_tcp_port()}"
    stop = threading.Event()
    broker = Broker(front, back, heartbeat_s=HB, curve_keys_dir=str(keys), context=fresh_context())
    worker = Worker(back, fh.scale, heartbeat_s=HB, curve_keys_dir=str(keys), context=fresh_context())
    threads = [threading.Thread(target=broker.run, args=(stop,)), threading.Thread(target=worker.run, args=(stop,))]
    [t.start() for t in threads]
    try:
        assert wait_for(lambda: broker.metrics().get("live_workers") == 1)
        with MessengerTransport(front, timeout_s=0.3, retries=0, heartbeat_s=HB, context=fresh_context()) as plain:
            with pytest.raises(TransportError, match=front):
                plain.call({"batch": "sneaky"}, fh.batch(2))
        with MessengerTransport(front, timeout_s=5, heartbeat_s=HB, keys_dir=keys, context=fresh_context()) as good:
            header, out = good.call({"batch": "ok", "id_column": "id"}, fh.batch(3))
        assert header["batch"] == "ok" and out["out"].num_rows == 3
        assert worker.metrics()["tasks"] == 1  # the key-less client's task never arrived
    finally:
        stop.set()
        [t.join(5) for t in threads]


def test_broker_cli_refuses_exposed_binds_without_keys(capsys):
    """The SecurityError is the CLI's one line on stderr with exit code 2 (messenger.cli)."""
    from sparkgnn.messenger.broker import main

    assert main(["--front", "tcp://0.0.0.0:5999", "--back", "tcp://127.0.0.1:5998"]) == 2
    assert capsys.readouterr().err.strip().startswith("sparkgnn-broker: error: refusing to bind")
    assert main(["--front", "tcp://0.0.0.0:5999", "--back", "tcp://127.0.0.1:5998", "--bind-any"]) == 2
    err = capsys.readouterr().err
    assert "requires CURVE keys" in err and len(err.strip().splitlines()) == 1


def test_size_caps_fail_fast_with_a_clear_error_instead_of_a_timeout(thread_cluster):
    cluster = thread_cluster(workers=1, worker_kwargs=dict(max_message_bytes=50_000))
    with cluster.client(timeout_s=10) as client:
        with pytest.raises(TransportError, match="over worker .* max_message_bytes=50000"):
            client.call({"batch": "big"}, fh.batch(10_000))
    with cluster.client(timeout_s=10, max_message_bytes=20_000) as client:
        with pytest.raises(RemoteTaskError, match="over the dealer's max_message_bytes=20000"):
            client.call({"batch": "big-result", "repeat": 4}, fh.batch(500))
        assert client.call({"batch": "small"}, fh.batch(10))[0]["batch"] == "small"


def test_a_worker_stuck_in_its_handler_gets_no_new_batches(thread_cluster):
    cluster = thread_cluster(workers=2, broker_kwargs=dict(stuck_after_s=0.2))
    stuck_client = cluster.client()
    results = {}
    thread = threading.Thread(
        target=lambda: results.update(slow=stuck_client.call({"batch": "slow", "sleep": 5.0}, fh.batch(2)))
    )  # long enough for a loaded CI box
    thread.start()
    assert wait_for(lambda: cluster.broker.metrics().get("stuck_workers") == 1)
    stuck = next(w for w in cluster.workers if w.metrics()["tasks"] == 1)
    with cluster.client() as client:
        done = [h["batch"] for h, _ in client.map((({"batch": i}, fh.batch(2)) for i in range(8)), window=4)]
    assert done == list(range(8))
    assert stuck.metrics()["tasks"] == 1  # everything went to the healthy worker
    thread.join(15)
    stuck_client.close()
    assert results["slow"][0]["batch"] == "slow"
    assert wait_for(lambda: cluster.broker.metrics().get("stuck_workers") == 0)
