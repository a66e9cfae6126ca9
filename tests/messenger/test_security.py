"""Ironhouse on the messenger's sockets: only listed worker keys register at the broker, only
listed client keys reach the broker's front and the workers' data sockets, dealers pin the server
key they were configured with, and key files are private. Broker and workers run as threads."""

import os
import threading

import fixture_handlers as fh
import pytest
import zmq
from messenger_helpers import HB, wait_for

from sparkgnn.messenger import security
from sparkgnn.messenger.broker import Broker
from sparkgnn.messenger.dealer import MessengerTransport
from sparkgnn.messenger.errors import BrokerUnreachableError, NoWorkerError, SecurityError, TransportError
from sparkgnn.messenger.protocol import Kind, control, encode
from sparkgnn.messenger.worker import Worker

SILENCE_MS = 300  # how long "gets nothing" is watched for


@pytest.fixture
def keyed(tmp_path):
    """A broker with a full key set (server, listed client and worker) on ipc, plus a way to
    start workers; everything in its own context, stopped and destroyed after."""
    context = zmq.Context()
    keys = security.make_full_set(tmp_path / "keys")
    stop = threading.Event()
    broker = Broker(
        f"ipc://{tmp_path}/f.ipc", f"ipc://{tmp_path}/b.ipc", heartbeat_s=HB, curve_keys_dir=keys, context=context
    )
    threads = [threading.Thread(target=broker.run, args=(stop,), daemon=True)]
    threads[0].start()
    assert broker.wait_bound(5)
    workers = []

    def start_worker(keys_dir):
        worker = Worker(broker.back_endpoint, fh.scale, heartbeat_s=HB, curve_keys_dir=keys_dir, context=context)
        threads.append(threading.Thread(target=worker.run, args=(stop,), daemon=True))
        threads[-1].start()
        assert worker.wait_ready(5)
        workers.append(worker)
        return worker

    yield broker, keys, start_worker, context
    stop.set()
    for t in threads:
        t.join(10)
    context.destroy(linger=0)


def other_keys(tmp_path, keys, name):
    """A keys folder with the deployment's server key pair (a worker serves with it) but client
    and worker key pairs of its own, listed nowhere."""
    folder = tmp_path / name
    folder.mkdir(mode=0o700)
    for file in ("server.key", "server.key_secret"):
        with open(os.path.join(keys, file), "rb") as src:
            data = src.read()
        with os.fdopen(os.open(folder / file, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as dst:
            dst.write(data)
    (folder / "authorized_clients").mkdir()
    for role in ("client", "worker"):
        security.make_keypair(folder, role)
    return folder


def test_a_worker_without_a_listed_key_cannot_register_and_gets_no_task(keyed, tmp_path):
    broker, keys, start_worker, context = keyed
    rogue = start_worker(other_keys(tmp_path, keys, "rogue"))
    with MessengerTransport(
        broker.front_endpoint, timeout_s=5, heartbeat_s=HB, keys_dir=keys, no_worker_timeout_s=0.5, context=context
    ) as client:
        with pytest.raises(NoWorkerError):
            client.call({"batch": "b1", "id_column": "id"}, fh.batch(3))
        assert broker.metrics()["live_workers"] == 0 and rogue.metrics()["tasks"] == 0
        start_worker(keys)  # the listed worker registers and serves
        header, _ = client.call({"batch": "b2", "id_column": "id"}, fh.batch(3))
    assert header["kind"] == "RESULT" and rogue.metrics()["tasks"] == 0


def test_a_worker_whose_key_is_delisted_cannot_register_again(keyed):
    """READY is checked against the allow-list by the connection's key (ZAP User-Id), not only
    at the handshake: a key removed from authorized_workers/ registers no more."""
    broker, keys, _, context = keyed
    pair = security.load_keypair(keys, "worker")
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    security.make_client(sock, security.ClientKeys(pair, security.server_public_key(keys)))
    sock.connect(broker.back_endpoint)
    try:
        ready = control(Kind.READY, data="ipc:///nowhere.ipc", slots=1)
        sock.send_multipart(ready)
        assert wait_for(lambda: broker.metrics().get("live_workers") == 1, timeout=5)
        os.remove(os.path.join(keys, "authorized_workers", "worker.key"))
        sock.send_multipart(control(Kind.DISCONNECT))
        assert wait_for(lambda: broker.metrics().get("live_workers") == 0, timeout=5)
        sock.send_multipart(ready)
        assert wait_for(lambda: broker.metrics().get("refused_workers") == 1, timeout=5)
        assert broker.metrics()["live_workers"] == 0
    finally:
        sock.close(0)


def test_a_client_without_a_listed_key_gets_nothing_from_broker_or_worker(keyed, tmp_path):
    broker, keys, start_worker, context = keyed
    worker = start_worker(keys)
    assert wait_for(lambda: broker.metrics().get("live_workers") == 1)
    stranger = other_keys(tmp_path, keys, "stranger")
    with MessengerTransport(
        broker.front_endpoint, timeout_s=5, heartbeat_s=HB, keys_dir=stranger, connect_timeout_s=0.5, context=context
    ) as client:
        with pytest.raises(BrokerUnreachableError):
            client.call({"batch": "b1", "id_column": "id"}, fh.batch(3))
    # straight to the worker's data socket, with the right server key but an unlisted pair
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.sndtimeo = 2000  # a handshake refused before the send leaves no pipe to queue on
    security.make_client(sock, security.ClientKeys.from_dir(stranger))
    sock.connect(worker.data_endpoint)
    try:
        try:
            sock.send_multipart(encode({"kind": "TASK", "batch": "b2", "token": "t"}, fh.batch(3)))
        except zmq.Again:
            pass  # refused already: nothing can reach the worker
        assert not sock.poll(SILENCE_MS)
    finally:
        sock.close(0)
    assert worker.metrics()["tasks"] == 0


def test_a_dealer_pins_its_configured_server_key_not_the_one_a_worker_advertises(keyed, tmp_path):
    """A registered worker whose data socket presents another server key (B) and advertises B in
    READY: the dealer, configured with A, completes no handshake and sends it nothing."""
    broker, keys, _, context = keyed
    other = zmq.Context()
    impostor = other.socket(zmq.ROUTER)
    impostor.linger = 0
    public_b, secret_b = zmq.curve_keypair()
    impostor.curve_secretkey, impostor.curve_publickey, impostor.curve_server = secret_b, public_b, True
    data = f"ipc://{tmp_path}/impostor.ipc"
    impostor.bind(data)
    control_sock = context.socket(zmq.DEALER)
    control_sock.linger = 0
    security.make_client(control_sock, security.ClientKeys.from_dir(keys, "worker"))
    control_sock.connect(broker.back_endpoint)
    try:
        control_sock.send_multipart(control(Kind.READY, data=data, slots=1, curve=public_b.decode()))
        assert wait_for(lambda: broker.metrics().get("live_workers") == 1, timeout=5)
        with MessengerTransport(
            broker.front_endpoint, timeout_s=0.5, retries=0, heartbeat_s=HB, keys_dir=keys, context=context
        ) as client:
            with pytest.raises(TransportError, match="no result"):
                client.call({"batch": "b1", "id_column": "id"}, fh.batch(3))
        assert not impostor.poll(0)
    finally:
        control_sock.close(0)
        impostor.close(0)
        other.destroy(linger=0)


def test_a_server_keys_folder_without_allow_lists_or_with_a_readable_secret_is_refused(tmp_path):
    keys = tmp_path / "k"
    security.make_keypair(keys, "server")
    os.rmdir(keys / "authorized_workers")
    with pytest.raises(SecurityError, match="authorized_workers not found"):
        Broker(f"ipc://{tmp_path}/f.ipc", f"ipc://{tmp_path}/b.ipc", curve_keys_dir=keys)
    os.chmod(keys / "server.key_secret", 0o644)
    with pytest.raises(SecurityError, match="readable by others"):
        security.load_keypair(keys, "server")
    with pytest.raises(SecurityError, match="needs this client's own key pair"):
        MessengerTransport(f"ipc://{tmp_path}/f.ipc", curve_server_key=security.server_public_key(keys))


def test_an_unkeyed_cluster_works_beside_a_keyed_server_in_the_same_context(tmp_path, thread_cluster):
    """A ZAP handler serves a whole context; sockets without a ZAP domain must not consult it
    (libzmq would hand their NULL handshakes to the keyed server's handler, which refuses them)."""
    context = zmq.Context()
    auth = security.ServerAuth(context, security.make_full_set(str(tmp_path / "keys")))
    try:
        cluster = thread_cluster(scheme="ipc", workers=1, context=context)  # inproc skips mechanisms
        with cluster.client(timeout_s=5) as client:
            assert client.call({"batch": "plain"}, fh.batch(3))[0]["batch"] == "plain"
        cluster.close()
    finally:
        auth.close()
        context.term()
