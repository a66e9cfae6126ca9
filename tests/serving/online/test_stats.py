"""The service's metrics (serving/online/stats.py): events counted by mode and outcome, latency and
batch-size histograms, state gauges read when scraped, a registry per service (two services in
one process count apart), modes the service does not serve labelled "other", and a status line
with the same numbers as the Prometheus text."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from sparkgnn.serving.online.stats import ServiceMetrics


def state(**overrides) -> dict:
    base = {
        "queue_requests": 3,
        "queue_bytes": 4096,
        "pools": [{"name": "cpu", "slots": 2, "busy": 1, "workers": 2}],
        "version": 4,
        "graph_fingerprint": "abc",
        "swaps": 3,
        "batch_timeouts": 0,
        "cache": None,
    }
    return {**base, **overrides}


def samples(metrics: ServiceMetrics) -> dict:
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_events_and_state_are_exposed_and_the_status_line_reports_the_same_numbers():
    reads = []
    metrics = ServiceMetrics(
        ["he", "exact"], lambda: reads.append(1) or state(cache={"hits": 9, "misses": 1, "hit_rate": 0.9})
    )
    assert reads == []  # nothing is read until a scrape
    metrics.outcome("he", "ok", 0.004)
    metrics.outcome("he", "ok", 0.006)
    metrics.outcome("exact", "busy")
    metrics.shed("exact")
    metrics.outcome("made-up", "error")  # a client's mode name never becomes a label
    metrics.batch(2)
    got = samples(metrics)
    assert got[("sparkgnn_serve_requests_total", (("mode", "he"), ("outcome", "ok")))] == 2
    assert got[("sparkgnn_serve_requests_total", (("mode", "exact"), ("outcome", "busy")))] == 1
    assert got[("sparkgnn_serve_requests_total", (("mode", "other"), ("outcome", "error")))] == 1
    assert got[("sparkgnn_serve_shed_total", (("mode", "exact"),))] == 1
    assert got[("sparkgnn_serve_latency_seconds_sum", (("mode", "he"),))] == 0.01
    assert got[("sparkgnn_serve_latency_seconds_bucket", (("le", "0.005"), ("mode", "he")))] == 1
    assert got[("sparkgnn_serve_batch_requests_sum", ())] == 2
    assert got[("sparkgnn_serve_queue_requests", ())] == 3 and got[("sparkgnn_serve_queue_bytes", ())] == 4096
    assert got[("sparkgnn_serve_pool_busy", (("pool", "cpu"),))] == 1
    assert got[("sparkgnn_serve_pool_workers", (("pool", "cpu"),))] == 2
    assert got[("sparkgnn_serve_version", (("graph_fingerprint", "abc"),))] == 4
    assert got[("sparkgnn_serve_swaps_total", ())] == 3
    assert got[("sparkgnn_serve_cache_hit_rate", ())] == 0.9
    line = metrics.status_line()
    assert "he[ok=2 mean=5.0ms]" in line and "exact[busy=1]" in line and "other[error=1]" in line
    assert "queue=3 (4096 B)" in line and "batches=1 mean=2.0" in line and "cpu=1/2busy,2workers" in line
    assert "version=4" in line and "cache hit rate=0.900" in line
    assert "\n" not in line


def test_two_services_count_apart_and_no_cache_means_no_cache_metrics():
    one, two = ServiceMetrics(["he"], state), ServiceMetrics(["he"], state)
    one.outcome("he", "ok", 0.001)
    key = ("sparkgnn_serve_requests_total", (("mode", "he"), ("outcome", "ok")))
    assert samples(one)[key] == 1 and key not in samples(two)
    assert not any(name.startswith("sparkgnn_serve_cache") for name, _ in samples(two))
    assert "cache" not in two.status_line() and "requests none" in two.status_line()


def test_tally_counts_each_outcome_in_the_counters_and_the_metrics_then_delivers_it():
    import threading

    from sparkgnn.serving.online.intake import Outcome
    from sparkgnn.serving.online.stats import Tally, service_stats

    metrics = ServiceMetrics(["he"], state)
    stats = service_stats(1, "abc")
    tally = Tally(stats, threading.Lock(), metrics)
    got: list = []
    tally.finish(got.append, Outcome("a", "ok", queue_s=0.25, service_s=0.5), "he")
    tally.finish(got.append, Outcome("b", "timeout"), "he")
    tally.finish(got.append, Outcome("c", "too_large"), "nope")
    tally.refusal()
    assert [o.request_id for o in got] == ["a", "b", "c"]
    assert (stats["answered"], stats["errors"], stats["too_large"], stats["requests"]) == (1, 2, 1, 1)
    values = samples(metrics)
    assert values[("sparkgnn_serve_requests_total", (("mode", "he"), ("outcome", "timeout")))] == 1
    assert values[("sparkgnn_serve_requests_total", (("mode", "other"), ("outcome", "error")))] == 1
    assert values[("sparkgnn_serve_latency_seconds_sum", (("mode", "he"),))] == 0.75
