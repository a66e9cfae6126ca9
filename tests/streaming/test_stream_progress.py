"""progress: percentiles and the one-line summary of a micro-batch."""

from sparkgnn.streaming.progress import batch_progress, percentile


def test_batch_progress_counts_and_percentiles():
    rows = [{"latency_s": v, "error": None} for v in (1.0, 2.0, 3.0, 4.0)] + [{"latency_s": 10.0, "error": "x"}]
    p = batch_progress(7, 4, rows, 1, 0.5, "srpe", "degree")
    assert (p.requests, p.answered, p.errors, p.dead_letters) == (5, 4, 1, 1)
    assert p.p50_latency_s == 3.0 and abs(p.p99_latency_s - 9.76) < 1e-9 and p.mean_latency_s == 4.0
    line = p.line()
    for words in (
        "stream batch 7",
        "5 requests from 4 files",
        "1 errors",
        "1 dead-lettered",
        "p50 3.000s",
        "p99 9.760s",
        "mode srpe",
        "grouping degree",
    ):
        assert words in line
    empty = batch_progress(8, 0, [], 0, 0.1, "full", "fifo")
    assert empty.p50_latency_s is None and "p50 -" in empty.line()
    assert percentile([], 50) is None
