"""Fixtures for messenger tests: a broker + worker threads cluster (fast: no child processes),
tmp ipc paths, short heartbeats. Every fixture stops what it started."""

import os
import pathlib
import threading
import uuid

import fixture_handlers
import pytest
import zmq
from messenger_helpers import HB, wait_for  # noqa: F401  (re-exported for fixtures)

HERE = pathlib.Path(__file__).resolve().parent


STOP_TIMEOUT_S = 30


class ThreadCluster:
    """Broker + workers in threads of this process, on inproc:// (or ipc://) endpoints."""

    def __init__(
        self,
        tmp_path,
        scheme="inproc",
        workers=2,
        handler=fixture_handlers.scale,
        broker_kwargs=None,
        worker_kwargs=None,
        context=None,
    ):
        from sparkgnn.messenger.broker import Broker

        self.context = context or zmq.Context.instance()
        tag = uuid.uuid4().hex[:8]
        if scheme == "inproc":
            front, back = f"inproc://front-{tag}", f"inproc://back-{tag}"
        else:
            front, back = f"ipc://{tmp_path}/front-{tag}.ipc", f"ipc://{tmp_path}/back-{tag}.ipc"
        self.stop_event = threading.Event()
        kwargs = dict(heartbeat_s=HB, metrics_interval_s=3600)
        kwargs.update(broker_kwargs or {})
        self.broker = Broker(front, back, context=self.context, **kwargs)
        self.broker_thread = threading.Thread(target=self.broker.run, args=(self.stop_event,), daemon=True)
        self.broker_thread.start()
        assert self.broker.wait_bound(5)
        self.front, self.back = self.broker.front_endpoint, self.broker.back_endpoint
        self.workers, self.worker_threads = [], []
        for _ in range(workers):
            self.add_worker(handler, **(worker_kwargs or {}))
        assert wait_for(lambda: self.broker.metrics().get("live_workers", 0) >= workers)

    def add_worker(self, handler, stop_event=None, **kwargs):
        from sparkgnn.messenger.worker import Worker

        kwargs.setdefault("context", self.context)
        worker = Worker(self.back, handler, heartbeat_s=HB, **kwargs)
        thread = threading.Thread(target=worker.run, args=(stop_event or self.stop_event,), daemon=True)
        thread.start()
        assert worker.wait_ready(5)
        self.workers.append(worker)
        self.worker_threads.append(thread)
        return worker

    def client(self, **kwargs):
        from sparkgnn.messenger.dealer import MessengerTransport

        kwargs.setdefault("timeout_s", 10)
        kwargs.setdefault("heartbeat_s", HB)
        kwargs.setdefault("context", self.context)
        kwargs.setdefault("shm_min_bytes", 0)  # tiny test batches still take the shm route
        return MessengerTransport(self.front, **kwargs)

    def close(self):
        self.stop_event.set()
        for t in [*self.worker_threads, self.broker_thread]:
            # generous: on a loaded 2-core CI box a thread that stops after 5 s is slow, not stuck
            # (the full suite once failed here at 5 s; the test alone stops in well under a second)
            t.join(STOP_TIMEOUT_S)
            assert not t.is_alive(), "a messenger thread did not stop"


@pytest.fixture
def thread_cluster(tmp_path):
    clusters = []

    def make(**kwargs):
        cluster = ThreadCluster(tmp_path, **kwargs)
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.close()


@pytest.fixture
def child_env():
    """Environment for child worker processes: the fixture handlers importable."""
    return {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
