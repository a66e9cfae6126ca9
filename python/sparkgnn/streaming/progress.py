"""One progress line per micro-batch: batch id, requests, errors, dead letters, p50/p99 latency
(file arrival to answer), mode, grouping, and how long the micro-batch took."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


def percentile(values, q: float) -> float | None:
    """The q-th percentile (linear interpolation), None for no values."""
    values = np.asarray([v for v in values if v is not None], np.float64)
    return float(np.percentile(values, q)) if len(values) else None


@dataclass
class BatchProgress:
    batch_id: int
    files: int
    requests: int
    answered: int
    errors: int
    dead_letters: int
    p50_latency_s: float | None
    p99_latency_s: float | None
    mean_latency_s: float | None
    seconds: float
    mode: str
    grouping: str

    def line(self) -> str:
        def s(v):
            return "-" if v is None else f"{v:.3f}s"

        return (
            f"stream batch {self.batch_id}: {self.requests} requests from {self.files} files, "
            f"{self.errors} errors, {self.dead_letters} dead-lettered; latency p50 "
            f"{s(self.p50_latency_s)} p99 {s(self.p99_latency_s)}; mode {self.mode}, grouping "
            f"{self.grouping}; batch took {self.seconds:.3f}s"
        )

    def as_dict(self) -> dict:
        return asdict(self)


def batch_progress(
    batch_id: int, files: int, rows: list[dict], dead_letters: int, seconds: float, mode: str, grouping: str
) -> BatchProgress:
    lat = [r["latency_s"] for r in rows]
    errors = sum(1 for r in rows if r.get("error"))
    return BatchProgress(
        batch_id,
        files,
        len(rows),
        len(rows) - errors,
        errors,
        dead_letters,
        percentile(lat, 50),
        percentile(lat, 99),
        float(np.mean(lat)) if lat else None,
        seconds,
        mode,
        grouping,
    )
