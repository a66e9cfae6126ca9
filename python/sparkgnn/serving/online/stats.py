"""The online service's numbers: Prometheus metrics (GET /metrics on the HTTP front) and the
periodic status line of `sparkgnn-serve serve`, both read from one registry so they never
disagree.

WHY a registry per Server (prometheus_client.CollectorRegistry, never the library's global
one): a process may run several services (the tests do, and an embedding application may), and
each must count only its own requests; a global registry would also refuse the second service's
metric names as duplicates.

Events are counted as they happen (counters, histograms); states are read when scraped (a
collector asks the server for its queue, pools, version and hot cache), so an idle service does
no work for its metrics.

  sparkgnn_serve_requests_total{mode,outcome}   requests by mode and Outcome.kind (ok, error,
                                                too_large, busy, timeout, stopping, failed)
  sparkgnn_serve_shed_total{mode}               of the busy: refused at intake for a deadline
  sparkgnn_serve_latency_seconds{mode}          answered requests: queue wait + service
  sparkgnn_serve_batch_requests                 requests per batch served
  sparkgnn_serve_queue_requests / _queue_bytes  queued now
  sparkgnn_serve_pool_slots{pool} / _pool_busy{pool} / _pool_workers{pool}   slots, busy slots,
                                                live worker processes (worker health)
  sparkgnn_serve_version{graph_fingerprint}     the version number served
  sparkgnn_serve_swaps_total, _batch_timeouts_total
  sparkgnn_serve_cache_hits / _cache_misses / _cache_hit_rate   the hot cache (as the last batch
                                                reported it; absent without a cache)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # of exposition()
LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
OTHER_MODE = "other"  # the label of a mode the service does not serve (refused requests)
OUTCOME_STATS = {"ok": "answered", "busy": "busy", "too_large": "too_large"}  # any other kind: "errors"


class _StateCollector(Collector):
    """Gauges read from the server when scraped: `read()` returns the state (ServiceMetrics.state)."""

    def __init__(self, read: Callable[[], dict]):
        self._read = read

    def collect(self) -> Iterator[Metric]:
        state = self._read()
        queue = GaugeMetricFamily("sparkgnn_serve_queue_requests", "Requests queued in the scheduler")
        queue.add_metric([], state["queue_requests"])
        yield queue
        nbytes = GaugeMetricFamily("sparkgnn_serve_queue_bytes", "Bytes of the requests queued")
        nbytes.add_metric([], state["queue_bytes"])
        yield nbytes
        for name, what in (("slots", "Batch slots"), ("busy", "Slots running a batch"), ("workers", "Live workers")):
            family = GaugeMetricFamily(f"sparkgnn_serve_pool_{name}", f"{what} of each worker pool", labels=["pool"])
            for pool in state["pools"]:
                family.add_metric([pool["name"]], pool[name])
            yield family
        version = GaugeMetricFamily(
            "sparkgnn_serve_version", "The version (graph + PE store) served", labels=["graph_fingerprint"]
        )
        version.add_metric([state["graph_fingerprint"]], state["version"])
        yield version
        for key, what in (("swaps", "Version swaps done"), ("batch_timeouts", "Batches past the batch deadline")):
            counter = CounterMetricFamily(f"sparkgnn_serve_{key}", what)
            counter.add_metric([], state[key])
            yield counter
        cache = state.get("cache")
        if cache:
            for key in ("hits", "misses", "hit_rate"):
                gauge = GaugeMetricFamily(f"sparkgnn_serve_cache_{key}", f"Hot cache {key.replace('_', ' ')}")
                gauge.add_metric([], float(cache.get(key, 0.0)))
                yield gauge


class ServiceMetrics:
    """One service's metrics. `modes`: the modes served (other names are labelled "other", so a
    client cannot grow the label set); `state`: a callable returning the service's state for the
    scrape-time gauges: {queue_requests, queue_bytes, pools: [{name, slots, busy, workers}],
    version, graph_fingerprint, swaps, batch_timeouts, cache: {hits, misses, hit_rate} or None}."""

    def __init__(self, modes: list[str], state: Callable[[], dict]):
        self.modes = set(modes)
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "sparkgnn_serve_requests", "Requests by mode and outcome", ["mode", "outcome"], registry=self.registry
        )
        self._shed = Counter(
            "sparkgnn_serve_shed", "Requests refused at intake for a deadline they could not meet", ["mode"],
            registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "sparkgnn_serve_latency_seconds",
            "Answered requests: queue wait + service",
            ["mode"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_requests = Histogram(
            "sparkgnn_serve_batch_requests", "Requests per batch served", buckets=BATCH_BUCKETS, registry=self.registry
        )
        self.registry.register(_StateCollector(state))
        # labelled children by their labels: .labels() takes the metric's lock and builds a key
        # per call; the label sets are bounded (served modes + "other", the Outcome kinds)
        self._counted: dict[tuple[str, str], Any] = {}
        self._timed: dict[str, Any] = {}

    def label(self, mode: Any) -> str:
        return mode if isinstance(mode, str) and mode in self.modes else OTHER_MODE

    def outcome(self, mode: Any, kind: str, seconds: float | None = None) -> None:
        """Count one request's outcome; `seconds`: its latency when answered."""
        label = self.label(mode)
        counter = self._counted.get((label, kind))
        if counter is None:
            counter = self._counted[(label, kind)] = self.requests.labels(label, kind)
        counter.inc()
        if seconds is not None:
            timer = self._timed.get(label)
            if timer is None:
                timer = self._timed[label] = self.latency.labels(label)
            timer.observe(seconds)

    def shed(self, mode: Any) -> None:
        """A request refused at intake for a deadline it could not meet (its outcome, busy, is
        counted by `outcome` too)."""
        self._shed.labels(self.label(mode)).inc()

    def batch(self, requests: int) -> None:
        self.batch_requests.observe(requests)

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)

    def status_line(self) -> str:
        """The numbers of /metrics in one line: requests by mode and outcome, mean latency per
        mode, queue, mean batch size, pools (busy/slots, workers), version, cache hit rate."""
        values: dict[str, list[tuple[dict, float]]] = {}
        for family in self.registry.collect():
            for sample in family.samples:
                values.setdefault(sample.name, []).append((sample.labels, sample.value))

        def one(name: str) -> float:
            return sum(v for _labels, v in values.get(name, []))

        requests: dict[str, dict[str, int]] = {}
        for labels, value in values.get("sparkgnn_serve_requests_total", []):
            requests.setdefault(labels["mode"], {})[labels["outcome"]] = int(value)
        latency = {labels["mode"]: value for labels, value in values.get("sparkgnn_serve_latency_seconds_sum", [])}
        counts = {labels["mode"]: value for labels, value in values.get("sparkgnn_serve_latency_seconds_count", [])}
        parts = []
        for mode in sorted(requests):
            outcomes = ",".join(f"{k}={v}" for k, v in sorted(requests[mode].items()))
            mean = f" mean={latency[mode] / counts[mode] * 1e3:.1f}ms" if counts.get(mode) else ""
            parts.append(f"{mode}[{outcomes}{mean}]")
        batches = one("sparkgnn_serve_batch_requests_count")
        mean_batch = one("sparkgnn_serve_batch_requests_sum") / batches if batches else 0.0
        pools: dict[str, dict[str, int]] = {}
        for name in ("slots", "busy", "workers"):
            for labels, value in values.get(f"sparkgnn_serve_pool_{name}", []):
                pools.setdefault(labels["pool"], {})[name] = int(value)
        pool_text = " ".join(
            f"{p}={v['busy']}/{v['slots']}busy,{v['workers']}workers" for p, v in sorted(pools.items())
        )
        version = values.get("sparkgnn_serve_version", [({}, 0.0)])[0][1]
        line = (
            f"requests {' '.join(parts) or 'none'}; queue={int(one('sparkgnn_serve_queue_requests'))} "
            f"({int(one('sparkgnn_serve_queue_bytes'))} B); batches={int(batches)} mean={mean_batch:.1f}; "
            f"pools {pool_text}; version={int(version)}"
        )
        if "sparkgnn_serve_cache_hit_rate" in values:
            line += f"; cache hit rate={one('sparkgnn_serve_cache_hit_rate'):.3f}"
        return line


def service_stats(version: int, graph_fingerprint: str) -> dict[str, Any]:
    """A new service's counters (Server.stats), and the version it serves."""
    return {
        "requests": 0,
        "answered": 0,
        "errors": 0,
        "busy": 0,
        "shed": 0,  # of the busy: refused at intake for a deadline they could not meet
        "too_large": 0,
        "batch_timeouts": 0,
        "batches": 0,
        "lane_batches": 0,  # batches taken by the express lanes (dispatch.py)
        "overflow": 0,
        "version": version,
        "graph_fingerprint": graph_fingerprint,
        "swaps": 0,
        "swaps_refused": 0,
        "evicted": 0,
    }


class Tally:
    """Counts what happens to a service's requests in its counters (`stats`, guarded by `lock`,
    the service's) and its `metrics`, so every part of the service (intake, dispatch, the
    fronts) counts an outcome the same way."""

    def __init__(self, stats: dict[str, Any], lock: threading.Lock, metrics: ServiceMetrics):
        self.stats = stats
        self._lock = lock
        self.metrics = metrics

    def add(self, key: str, n: int = 1) -> None:
        """Add `n` to the counter `key`."""
        with self._lock:
            self.stats[key] += n

    def finish(self, deliver: Callable[[Any], None], outcome: Any, mode: Any = "") -> None:
        """Count `outcome` (an Outcome: its kind, and its latency when answered) by `mode` and
        hand it to `deliver`."""
        with self._lock:
            self.stats[OUTCOME_STATS.get(outcome.kind, "errors")] += 1
        answered = outcome.kind == "ok"
        self.metrics.outcome(mode, outcome.kind, outcome.queue_s + outcome.service_s if answered else None)
        deliver(outcome)

    def refusal(self) -> None:
        """A message a front could not even read as a request (it never reached submit)."""
        with self._lock:
            self.stats["requests"] += 1
            self.stats["errors"] += 1
        self.metrics.outcome(OTHER_MODE, "error")
