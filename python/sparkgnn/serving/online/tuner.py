"""GSM's offline parameter tuner (section IV-C): the batch in-degree sum T_d and the batch subgraph
size T_s a deployment runs with.

WHY two 1-D searches: both thresholds trade computation against CPU-GPU communication and they
interact (a larger T_d makes larger batches, which leave less memory for the cache unless T_s
divides them), so no closed form picks them, and each candidate costs a dry run of the server.
An exhaustive grid is |T_d| x |T_s| dry runs; GSM instead (1) for each of a few T_d values finds
the T_s with the lowest latency, then (2) tests these (T_d, T_s) pairs again and keeps the best.
The T_s axis is short too: dividing a batch runs it as sequential sub-batches that leave the GPU
under-used, so GSM only considers T_s values at which a small fraction of batches is divided
(10-25% for GraphSAGE, 1-4% for the compute-heavier GAT): `candidate_ts`.

`tune` is the pure algorithm: the caller's `measure(t_d, t_s)` runs the dry inference and returns
a latency (lower is better). The result is written as the deployment's JSON config
(`write_thresholds`), which the server reads at start (`read_thresholds`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from sparkgnn import files
from sparkgnn.errors import SparkGNNError

FORMAT = "sparkgnn.serving.online.thresholds"
VERSION = 1

Measure = Callable[[float, int], float]


class TunerError(SparkGNNError, ValueError):
    """Empty search space, a measurement that is not a number, or an unreadable thresholds file."""


@dataclass
class TuneResult:
    """The chosen thresholds and everything measured on the way.

    points  every measurement, in order: {"t_d", "t_s", "latency", "stage"} ("ts": the 1-D search
            over T_s for one T_d; "pair": the second search over the best pair of each T_d), plus
            "divided" (the fraction of divided batches) when the tuner was given a way to know it
    pairs   the best T_s of each T_d: {"t_d", "t_s", "latency"} (latency of the pair stage)
    """

    t_d: float
    t_s: int
    latency: float
    points: list[dict] = field(default_factory=list)
    pairs: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"t_d": self.t_d, "t_s": self.t_s, "latency": self.latency, "pairs": self.pairs, "points": self.points}


def _latency(measure: Measure, t_d: float, t_s: int) -> float:
    value = float(measure(t_d, t_s))
    if math.isnan(value):
        raise TunerError(f"measure(t_d={t_d}, t_s={t_s}) returned NaN; return inf for a failed run (e.g. OOM)")
    return value


def tune(
    measure: Measure,
    td_values: Sequence[float],
    ts_values: Sequence[int] | Callable[[float], Sequence[int]],
    divided_fraction: Callable[[float, int], float] | None = None,
    remeasure: bool = True,
) -> TuneResult:
    """GSM's two 1-D searches. For each T_d in `td_values`, the T_s of `ts_values` (a sequence, or a
    function of T_d giving one: the batches, hence `candidate_ts`, change with T_d) with the lowest
    `measure(t_d, t_s)`; then the pair with the lowest latency, measured once more when `remeasure`
    (GSM's second search; a fresh run also keeps the winner of many noisy runs from being chosen
    for its luck). Ties go to the earlier candidate. `divided_fraction(t_d, t_s)`, when given, is
    recorded with each point. T_s <= 0 stands for "no division" and may be a candidate.
    """
    tds = [float(t) for t in td_values]
    if not tds:
        raise TunerError("tune: no T_d candidates")
    points: list[dict] = []

    def record(t_d: float, t_s: int, latency: float, stage: str) -> None:
        point = {"t_d": t_d, "t_s": t_s, "latency": latency, "stage": stage}
        if divided_fraction is not None:
            point["divided"] = float(divided_fraction(t_d, t_s))
        points.append(point)

    best_ts: list[tuple[float, int, float]] = []  # (t_d, best t_s, its latency in the T_s search)
    for t_d in tds:
        candidates = [int(t) for t in (ts_values(t_d) if callable(ts_values) else ts_values)]
        if not candidates:
            raise TunerError(f"tune: no T_s candidates for T_d={t_d}")
        best: tuple[int, float] | None = None
        for t_s in candidates:
            latency = _latency(measure, t_d, t_s)
            record(t_d, t_s, latency, "ts")
            if best is None or latency < best[1]:
                best = (t_s, latency)
        assert best is not None
        best_ts.append((t_d, best[0], best[1]))

    pairs: list[dict] = []
    for t_d, t_s, latency in best_ts:
        if remeasure:
            latency = _latency(measure, t_d, t_s)
            record(t_d, t_s, latency, "pair")
        pairs.append({"t_d": t_d, "t_s": t_s, "latency": latency})
    chosen = min(pairs, key=lambda p: p["latency"])  # min keeps the first of equal latencies
    return TuneResult(chosen["t_d"], chosen["t_s"], chosen["latency"], points, pairs)


def candidate_ts(hop_sizes_per_batch: Iterable[Sequence[int]], fractions: Sequence[float] = (0.10, 0.25)) -> list[int]:
    """The T_s values at which (at most, and as close as the sample allows) each of `fractions` of
    the sample batches would be divided, sorted ascending, duplicates dropped.

    A batch is divided when one of its layer subgraphs holds more than T_s vertices, i.e. when its
    largest layer exceeds T_s; so the T_s for a fraction f is the smallest value leaving at most
    floor(f * n) of the n batches' largest layers above it. GSM: f in 10-25% for GraphSAGE, 1-4% for
    GAT.
    """
    largest = sorted(max(sizes, default=0) for sizes in hop_sizes_per_batch)
    if not largest:
        raise TunerError("candidate_ts: no sample batches")
    n = len(largest)
    found = set()
    for f in fractions:
        if not 0 <= f < 1:
            raise TunerError(f"candidate_ts: a divided fraction must be in [0, 1), got {f}")
        allowed = math.floor(f * n + 1e-9)  # batches allowed above T_s
        found.add(int(largest[n - allowed - 1]))
    return sorted(found)


def write_thresholds(path: str, result: TuneResult, extra: dict | None = None) -> None:
    """The deployment config: the chosen T_d and T_s, the measurements behind them and `extra`
    (what they were tuned for: model, dataset, arrival rate, scheduler...). Written atomically, so a
    server starting meanwhile reads the old config or the new one."""
    content = {"format": FORMAT, "version": VERSION, **result.to_dict(), "extra": dict(extra or {})}
    files.write_json_atomic(path, content, indent=1, sort_keys=True)


def read_thresholds(path: str) -> tuple[TuneResult, dict]:
    """(TuneResult, extra) from a config written by write_thresholds; TunerError naming the path
    when it is absent, unreadable or not such a config."""
    try:
        content = files.read_json(path)
    except FileNotFoundError:
        raise TunerError(f"no thresholds config at {path}: run the tuner first") from None
    except ValueError as e:
        raise TunerError(f"thresholds config {path} is not JSON: {e}") from None
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        raise TunerError(f"{path} is not a thresholds config (format {FORMAT!r} expected)")
    if content.get("version") != VERSION:
        raise TunerError(f"thresholds config {path} has version {content.get('version')!r}; this reads {VERSION}")
    try:
        result = TuneResult(
            t_d=float(content["t_d"]),
            t_s=int(content["t_s"]),
            latency=float(content["latency"]),
            points=list(content.get("points", [])),
            pairs=list(content.get("pairs", [])),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise TunerError(f"thresholds config {path} is malformed ({type(e).__name__}: {e})") from None
    if not (math.isfinite(result.t_d) and result.t_d > 0):
        raise TunerError(f"thresholds config {path}: T_d must be > 0, got {result.t_d}")
    return result, dict(content.get("extra") or {})
