"""Cost model: seconds = shuffle_bytes / shuffle_Bps + python_bytes / python_Bps
                        + passes x pass_overhead_s + edges x per_edge_s + jvm_edges x jvm_edge_s.

Why so simple: Lotan (§4.2, appendix A.1) found that the plan space is small and that linear
terms in the bytes each boundary moves — Spark's shuffle, the Arrow pipe into Python — plus a
fixed cost per Python round trip rank the plans correctly; its eq. (13)-(16) have exactly these
terms (scatter/move c1·R_f, pipe c3·f_e, per-edge ApplyEdge/Aggregation w0, w1). The estimate is
derived from the operators themselves (`measure`), so what `explain()` shows and what the cost
says can never disagree.

Every constant lives in one `CostModel` so the bench can recalibrate from measured runs
(`CostModel.from_dict`) without touching the planner.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any

from sparkgnn.planner.errors import PlanError
from sparkgnn.planner.ir import Operator

#: Operators whose bytes go through Spark's shuffle (write + fetch).
SHUFFLE_OPERATORS = ("Shuffle", "Partition")


@dataclass(frozen=True)
class CostModel:
    """Throughput constants of the linear model (module doc). The defaults are fitted to the probe
    of docs/PLATFORM.md (derived in docs/ARCHITECTURE.md, "Data movement and the planner", cost
    model constants); planner.calibration refits them from a work dir's own runs.

    shuffle_Bps: bytes per second through Spark's shuffle (write + fetch, join included).
    python_Bps: bytes per second through the Arrow pipe into Python, in the packed binary format
        the executor uses (a messenger broker leg in series would lower it: recalibrate then).
    pass_overhead_s: the fixed cost of one Python round trip (task launch, Arrow stream set-up,
        worker reuse) on a warm session.
    per_edge_s: the DL step's "neural math" per edge (message + aggregation + the update
        amortised over edges).
    jvm_edge_s: per edge a native aggregate reduces inside Spark (pushdown: the join row built for
        the edge and its weighted vector folded into the group's buffer).
    """

    shuffle_Bps: float = 0.29e9
    python_Bps: float = 0.42e9
    pass_overhead_s: float = 0.9
    per_edge_s: float = 0.7e-6
    jvm_edge_s: float = 1.0e-6

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise PlanError(f"CostModel.{f.name} must be a finite number, got {value!r}")
            positive = f.name.endswith("_Bps")
            if (positive and value <= 0) or value < 0:
                raise PlanError(f"CostModel.{f.name} must be {'positive' if positive else '>= 0'}, got {value}")

    def seconds(
        self, shuffle_bytes: float, python_bytes: float, passes: float, edges: float, jvm_edges: float = 0.0
    ) -> float:
        return (
            shuffle_bytes / self.shuffle_Bps
            + python_bytes / self.python_Bps
            + passes * self.pass_overhead_s
            + edges * self.per_edge_s
            + jvm_edges * self.jvm_edge_s
        )

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostModel:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PlanError(f"unknown CostModel constant(s) {unknown}; known: {sorted(known)}")
        return cls(**data)


@dataclass(frozen=True)
class Estimate:
    """What a list of operators moves and does (additive, so layers and candidates can be summed
    and differenced)."""

    shuffle_bytes: int = 0
    python_in_bytes: int = 0
    python_out_bytes: int = 0
    passes: int = 0
    edges: int = 0
    jvm_edges: int = 0

    @property
    def python_bytes(self) -> int:
        return self.python_in_bytes + self.python_out_bytes

    def __add__(self, other: Estimate) -> Estimate:
        return Estimate(*(a + b for a, b in zip(self._tuple(), other._tuple(), strict=True)))

    def __sub__(self, other: Estimate) -> Estimate:
        return Estimate(*(a - b for a, b in zip(self._tuple(), other._tuple(), strict=True)))

    def _tuple(self) -> tuple[int, ...]:
        return (
            self.shuffle_bytes,
            self.python_in_bytes,
            self.python_out_bytes,
            self.passes,
            self.edges,
            self.jvm_edges,
        )

    def seconds(self, model: CostModel) -> float:
        return model.seconds(self.shuffle_bytes, self.python_bytes, self.passes, self.edges, self.jvm_edges)

    def to_dict(self, model: CostModel) -> dict[str, float]:
        return {
            "shuffle_bytes": self.shuffle_bytes,
            "python_in_bytes": self.python_in_bytes,
            "python_out_bytes": self.python_out_bytes,
            "python_bytes": self.python_bytes,
            "passes": self.passes,
            "edges": self.edges,
            "jvm_edges": self.jvm_edges,
            "seconds": round(self.seconds(model), 6),
        }


def measure(ops: Iterable[Operator]) -> Estimate:
    """Sum the costed quantities of operators: Shuffle/Partition bytes are shuffled, Pipe bytes
    cross the Python boundary (a to_dl Pipe opens one pass), DL ops report their edge work, GRAPH
    ops that reduce edges in the JVM (pushdown's native aggregate) theirs as `jvm_edges`.
    Scatter/Join/Collect/Materialize bytes are informative only: they are either local or the
    same rows a Shuffle already counts, so counting them would double-charge."""
    shuffle = py_in = py_out = passes = edges = jvm_edges = 0
    for op in ops:
        if op.engine == "GRAPH" and op.name in SHUFFLE_OPERATORS:
            shuffle += op.est_bytes
        elif op.engine == "GRAPH":
            jvm_edges += int(op.attrs.get("jvm_edges", 0))
        elif op.name == "Pipe":
            if op.direction == "to_dl":
                py_in += op.est_bytes
                passes += 1
            else:
                py_out += op.est_bytes
        elif op.engine == "DL":
            edges += int(op.attrs.get("edges", 0))
    return Estimate(shuffle, py_in, py_out, passes, edges, jvm_edges)
