"""`workers=` / `--workers` refusals: an unknown or malformed spec is a WorkersSpecError listing
the accepted forms; a tcp:// broker that does not answer, or has no worker, is refused from the
driver within the connect timeout (before any Spark task would wait on it). No Spark needed."""

import threading
import time

import pytest

from sparkgnn import runners
from sparkgnn.errors import SparkGNNError
from sparkgnn.messenger.broker import Broker
from sparkgnn.messenger.errors import BrokerUnreachableError, NoWorkerError
from sparkgnn.messenger.local import free_tcp_port
from sparkgnn.runners import WorkersSpecError, workers_for

BOUND = 30  # seconds: proves nothing hangs, claims nothing about speed


@pytest.mark.parametrize("spec", ["bogus", "spark", "TCP://127.0.0.1:5555", "", 42, 3.5, ["local[2]"]])
def test_unknown_specs_list_the_accepted_forms(spec):
    with pytest.raises(WorkersSpecError) as err:
        workers_for(spec, "/nowhere")
    message = str(err.value)
    assert f"unknown workers spec {spec!r}" in message
    for form in ("inprocess", "local[N]", "tcp://host:port"):
        assert form in message
    assert isinstance(err.value, SparkGNNError) and isinstance(err.value, ValueError)


@pytest.mark.parametrize("spec", ["local[0]", "local[-1]", "local[abc]", "local[]", "local", "localhost:5555"])
def test_bad_local_specs_say_what_n_must_be(spec):
    with pytest.raises(WorkersSpecError, match=r"want local\[N\] with N a whole number >= 1.*accepted: inprocess"):
        workers_for(spec, "/nowhere")


@pytest.mark.parametrize(
    "spec",
    [
        "tcp://",
        "tcp://127.0.0.1",
        "tcp://127.0.0.1:",
        "tcp://127.0.0.1:0",
        "tcp://127.0.0.1:70000",
        "tcp://:5555",
        "ipc://",
    ],
)
def test_endpoints_without_a_port_or_path_are_refused_at_once(spec):
    start = time.monotonic()
    with pytest.raises(
        WorkersSpecError, match=rf"bad workers endpoint {spec!r}: want tcp://host:port.*accepted: inprocess"
    ):
        workers_for(spec, "/nowhere")
    assert time.monotonic() - start < 5  # no probe was attempted


@pytest.mark.parametrize(
    "spec, ok",
    [
        ("bogus", False),
        ("local[0]", False),
        ("tcp://h", False),
        ("inprocess", True),
        (None, True),
        ("local[3]", True),
        ("tcp://127.0.0.1:1", True),
        ("ipc:///tmp/front.ipc", True),
    ],
)
def test_check_workers_is_syntax_only(spec, ok):
    """What a caller can run before preparing the graph: nothing is started or probed (port 1
    has no broker, yet the check passes at once)."""
    start = time.monotonic()
    if ok:
        runners.check_workers(spec)
    else:
        with pytest.raises(WorkersSpecError, match="accepted: inprocess"):
            runners.check_workers(spec)
    assert time.monotonic() - start < 5


def test_inproc_endpoints_cannot_reach_spark_tasks():
    with pytest.raises(WorkersSpecError, match="inproc:// endpoint lives inside one process"):
        workers_for("inproc://front", "/nowhere")


def test_no_broker_at_the_address_is_refused_from_the_driver():
    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    start = time.monotonic()
    with pytest.raises(BrokerUnreachableError) as err:
        workers_for(endpoint, "/nowhere", connect_timeout=1)
    assert time.monotonic() - start < BOUND
    assert f"no broker answered at {endpoint} within 1 s" in str(err.value)
    assert f"sparkgnn-broker --front {endpoint}" in str(err.value)


@pytest.fixture
def broker():
    """A broker on loopback tcp in a thread, with no worker."""
    front, back = f"tcp://127.0.0.1:{free_tcp_port()}", f"tcp://127.0.0.1:{free_tcp_port()}"
    stop = threading.Event()
    b = Broker(front, back, heartbeat_s=0.1, metrics_interval_s=3600)
    thread = threading.Thread(target=b.run, args=(stop,), daemon=True)
    thread.start()
    assert b.wait_bound(10)
    yield b
    stop.set()
    thread.join(5)


def test_a_broker_without_workers_is_refused_naming_both_endpoints(broker):
    start = time.monotonic()
    with pytest.raises(NoWorkerError) as err:
        workers_for(broker.front_endpoint, "/nowhere", connect_timeout=1)
    assert time.monotonic() - start < BOUND
    assert f"no worker is connected to the broker at {broker.front_endpoint}" in str(err.value)
    assert f"sparkgnn-worker --connect {broker.back_endpoint}" in str(err.value)


def test_a_broker_with_a_worker_passes_and_tasks_get_the_timeouts(broker):
    from sparkgnn.messenger.worker import Worker

    stop = threading.Event()
    worker = Worker(broker.back_endpoint, lambda h, t: ({}, {}), heartbeat_s=0.1)
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    try:
        runners = workers_for(broker.front_endpoint, "/nowhere", connect_timeout=5)
        assert runners.spec == {
            "kind": "messenger",
            "endpoint": broker.front_endpoint,
            "options": {"connect_timeout_s": 5.0, "no_worker_timeout_s": 5.0},
        }
    finally:
        stop.set()
        thread.join(5)


def test_connect_timeout_from_the_environment(monkeypatch):
    monkeypatch.setenv(runners.CONNECT_TIMEOUT_ENV, "2.5")
    assert runners.connect_timeout_s() == 2.5
    assert runners.connect_timeout_s(0) == 0
    monkeypatch.setenv(runners.CONNECT_TIMEOUT_ENV, "soon")
    with pytest.raises(WorkersSpecError, match="SPARKGNN_CONNECT_TIMEOUT_S='soon' is not a number"):
        runners.connect_timeout_s()
    with pytest.raises(WorkersSpecError, match="connect timeout must be a finite number"):
        runners.connect_timeout_s(-1)
