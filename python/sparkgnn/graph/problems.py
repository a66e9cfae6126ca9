"""One catalogue of graph problems, shared by the numpy and the Spark validators.

Why: users meet the same malformed graph through two doors (a GraphData in memory, DataFrames
in Spark) and tests assert on the wording, so both paths must report a problem with the SAME
sentence: what is wrong, how many rows, and the first few offenders. The validators only find
counts and examples; this module owns the words.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sparkgnn.errors import GraphValidationError

# How many offending rows an error message lists.
MAX_EXAMPLES = 5

# Problem kind -> message template. {count} is the number of offending rows, {examples} the
# formatted first few, {detail} any kind-specific extra (e.g. the expected width).
TEMPLATES = {
    "missing_column": "{count} required column(s) missing: {examples}",
    "column_type": "{count} column(s) have the wrong type: {examples}",
    "null_id": "{count} vertices have a null id",
    "duplicate_id": "{count} vertex ids appear more than once; first: {examples}",
    "null_x": "{count} vertices have a null feature vector x; first ids: {examples}",
    "x_width": "{count} vertices have a feature vector whose length is not {detail}; first: {examples}",
    "x_nonfinite": "{count} vertices have NaN/Inf (or null) feature values; first ids: {examples}",
    "bad_label": "{count} vertices have a label y below -1 (-1 marks 'unlabelled'); first: {examples}",
    "bad_split": "{count} vertices have a split not in {{train, val, test}}; first: {examples}",
    "null_endpoint": "{count} edges have a null src or dst; first: {examples}",
    "dangling_src": "{count} edges have a src that is not a vertex id; first: {examples}",
    "dangling_dst": "{count} edges have a dst that is not a vertex id; first: {examples}",
    "typed_dangling_src": "{count} edges have a src that is not an id of node type {detail}; first: {examples}",
    "typed_dangling_dst": "{count} edges have a dst that is not an id of node type {detail}; first: {examples}",
    "bad_weight": "{count} edges have a negative, NaN, Inf or null weight; first: {examples}",
    "null_edge_attr": "{count} edges have a null edge_attr vector; first: {examples}",
    "edge_attr_width": "{count} edges have an edge_attr vector whose length is not {detail}; first: {examples}",
    "edge_attr_nonfinite": "{count} edges have NaN/Inf (or null) edge_attr values; first: {examples}",
    "bad_index": "{count} edges have a dense src/dst index outside [0, {detail}); first: {examples}",
    "unknown_id": "{count} requested ids are not vertex ids; first: {examples}",
    "shape": "{count} array(s) have an inconsistent shape: {examples}",
}


@dataclass(frozen=True)
class Problem:
    """One kind of defect found in a graph: how many rows, and a few of them, already formatted."""

    kind: str
    count: int
    examples: tuple[str, ...] = ()
    detail: str = ""

    def message(self) -> str:
        shown = ", ".join(self.examples[:MAX_EXAMPLES])
        if self.count > len(self.examples[:MAX_EXAMPLES]) and self.examples:
            shown += ", ..."
        return TEMPLATES[self.kind].format(count=self.count, examples=shown, detail=self.detail)


def fmt_edge(src, dst) -> str:
    """Edges are shown as `(src -> dst)` with the caller's original ids."""
    return f"({_fmt_id(src)} -> {_fmt_id(dst)})"


def fmt_edge_weight(src, dst, weight) -> str:
    """Weights print with 6 significant digits so numpy float32 and Spark's widened Python floats
    read the same (e.g. 0.1, not 0.10000000149011612)."""
    shown = "null" if weight is None else format(float(weight), ".6g")
    return f"({_fmt_id(src)} -> {_fmt_id(dst)}, weight={shown})"


def _fmt_id(value) -> str:
    return "null" if value is None else str(value)


def fmt_ids(values: Iterable) -> tuple[str, ...]:
    return tuple(_fmt_id(v) for v in list(values)[:MAX_EXAMPLES])


def schema_problems(missing: list[str], wrong: list[str]) -> list[Problem]:
    """Missing and mistyped columns of vertices AND edges, as (at most) two problems."""
    problems = []
    if missing:
        problems.append(Problem("missing_column", len(missing), tuple(missing)))
    if wrong:
        problems.append(Problem("column_type", len(wrong), tuple(wrong)))
    return problems


def raise_if_any(problems: Sequence[Problem], name: str | None) -> None:
    """Raise one GraphValidationError listing every problem found (not just the first), so a user
    fixes their data in one round trip. The error keeps the structured list as `.problems`."""
    problems = [p for p in problems if p.count > 0]
    if not problems:
        return
    label = f"graph {name!r}" if name else "graph"
    noun = "problem" if len(problems) == 1 else "problems"
    lines = "\n".join(f"  - {p.message()}" for p in problems)
    error = GraphValidationError(f"{label} failed validation ({len(problems)} {noun}):\n{lines}")
    error.problems = list(problems)
    raise error
