"""sparkgnn.serving.online.versions.VersionManager on fake pools: a swap switches only after
every pool loaded the new version; a batch keeps the version it took, and a replaced version is
dropped from every pool (withdrawn, then op "serve_evict") once its last batch ends; a refused
swap names the cause, keeps serving the old version and drops what the workers loaded; swaps
over the wire without `swap_roots` are refused."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from sparkgnn.serving.online import wire
from sparkgnn.serving.online.batch_op import BATCH_OP, EVICT_OP
from sparkgnn.serving.online.config import ServeConfig
from sparkgnn.serving.online.costs import GraphFacts
from sparkgnn.serving.online.deployments import SwapRefused, Version
from sparkgnn.serving.online.stats import service_stats
from sparkgnn.serving.online.versions import VersionManager

FACTS = GraphFacts(np.arange(4), np.ones(4), np.ones(4), feature_dim=3, num_layers=2)


class FakePool:
    """One worker (pid 1) that loads or drops whatever it is sent; `missing`: pids it reports
    not reached when loading."""

    name = "main"
    width = 1

    def __init__(self, missing: tuple = ()):
        self.missing = list(missing)
        self.registered: list[str] = []
        self.withdrawn: list[str] = []
        self.sent: list[dict] = []

    def register(self, spec: dict) -> None:
        self.registered.append(spec["graph"])

    def withdraw(self, key: str) -> None:
        self.withdrawn.append(key)

    def warm_up(self, header: dict, tables: dict) -> None:
        self.sent.append(header)

    def broadcast(self, header, tables, timeout_s, reached=None, call_timeout_s=None):
        self.sent.append(header)
        missing = self.missing if header["op"] == BATCH_OP else []
        return {1: {wire.META: wire.meta_table({"pid": 1})}}, missing


def version(number: int, graph: str) -> Version:
    spec = {"graph": graph, "model": "m", "store": None, "options": {}, "cache": {}}
    return Version(number, graph, None, spec, FACTS, f"fp-{graph}")


@pytest.fixture
def manager():
    """(VersionManager serving version 1 of graph "g1" on a FakePool, the pool, its stats), with
    its evictor thread running."""
    pool = FakePool()
    stats, stop = service_stats(1, "fp-g1"), threading.Event()
    config = ServeConfig(graph="g1", model="m", http=None)
    versions = VersionManager(config, None, [pool], version(1, "g1"), lock=threading.Lock(), stats=stats, stop=stop)
    versions._open_version = lambda old, graph, store: version(old.number + 1, graph)  # type: ignore[method-assign]
    evictor = threading.Thread(target=versions.evict_loop, daemon=True)
    evictor.start()
    yield versions, pool, stats
    stop.set()
    versions.wake()
    evictor.join(5)


def test_a_replaced_version_is_dropped_when_its_last_batch_ends(manager):
    versions, pool, stats = manager
    batch = versions.take()  # a batch dispatched on version 1
    report = versions.swap("g2")
    assert report["changed"] and report["version"] == 2 and report["previous_batches_in_flight"] == 1
    assert versions.current.number == 2 and versions.config.graph == "g2"
    assert pool.registered == ["g2"] and pool.sent[-1]["warm_modes"] == versions.config.modes
    assert versions.info()["draining"] == [{"version": 1, "batches_in_flight": 1}]
    assert not versions.settle(0.1) and pool.withdrawn == []  # its batch still runs on it
    assert versions.take() is versions.current  # a later batch takes version 2
    versions.release(batch)
    assert versions.settle(5)
    assert pool.withdrawn == [batch.key] and pool.sent[-1] == {"op": EVICT_OP, "retire": [batch.key]}
    assert stats["swaps"] == 1 and stats["evicted"] == 1 and stats["version"] == 2
    assert versions.info()["draining"] == [] and versions.info()["evicting"] == []


def test_a_swap_a_worker_did_not_load_is_refused_and_dropped_again(manager):
    versions, pool, stats = manager
    pool.missing = [7]
    with pytest.raises(SwapRefused, match=r"worker\(s\) \[7\] of pool 'main' did not load it") as info:
        versions.swap("g2", timeout_s=1.0)
    assert "still serving version 1" in str(info.value) and "\n" not in str(info.value)
    assert versions.current.number == 1 and stats["swaps_refused"] == 1 and stats["swaps"] == 0
    assert versions.settle(5) and pool.withdrawn == [version(2, "g2").key]  # what it loaded: dropped
    assert "refused" in versions.swap_log[-1]


def test_a_swap_to_the_version_served_changes_nothing(manager):
    versions, pool, stats = manager
    assert versions.swap("g1")["changed"] is False and stats["swaps"] == 0 and pool.registered == []


def test_swaps_over_the_wire_need_swap_roots(manager):
    versions, _pool, stats = manager
    with pytest.raises(SwapRefused, match="lists no `swap_roots`; still serving version 1"):
        versions.check_swap_paths("/etc", None)
    assert stats["swaps_refused"] == 1


class SlowPool(FakePool):
    """A FakePool whose load takes `seconds` and records when it ran."""

    def __init__(self, name: str, seconds: float):
        super().__init__()
        self.name, self.seconds, self.ran = name, seconds, None

    def broadcast(self, header, tables, timeout_s, reached=None, call_timeout_s=None):
        started = time.monotonic()
        time.sleep(self.seconds if header["op"] == BATCH_OP else 0.0)
        self.ran = (started, time.monotonic())
        return super().broadcast(header, tables, timeout_s, reached, call_timeout_s)


def test_every_pool_loads_a_new_version_at_once():
    pools = [SlowPool("cpu", 0.3), SlowPool("wide", 0.3)]
    config = ServeConfig(graph="g1", model="m", http=None)
    versions = VersionManager(
        config, None, pools, version(1, "g1"), lock=threading.Lock(), stats=service_stats(1, "fp-g1"),
        stop=threading.Event(),
    )  # fmt: skip
    versions._open_version = lambda old, graph, store: version(old.number + 1, graph)  # type: ignore[method-assign]
    report = versions.swap("g2")
    assert report["changed"] and sorted(report["warmed"]) == ["cpu", "wide"]
    (a0, a1), (b0, b1) = pools[0].ran, pools[1].ran
    assert a0 < b1 and b0 < a1  # the loads overlapped: the swap waits for the slowest, not the sum
