"""What sparkgnn's Spark jobs return: one small result family.

  JobResult    `sparkgnn.infer`: the output DataFrame(s), by model name, with each model's run
               report and plan (`frames`, `reports`, `plans`; `.frame`, `.report`, `.plan` for a
               single model).
  StoreResult  `sparkgnn.precompute` and `sparkgnn.refresh`: the opened PE store with what the job
               did (`store`, `report`, `plan`).

WHY one result type per call: a return type that depended on the arguments (a DataFrame, a list of
them, or tuples with a report) would keep a caller from writing one line that works for both a model
and a list of models. Every field a caller might need is always there instead. Both are frozen: a
result describes a finished job.

`legacy_positional` keeps the call forms of the previous release (options passed by position)
working for one release, with a DeprecationWarning; see its docstring.
"""

from __future__ import annotations

import functools
import inspect
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from sparkgnn.errors import SparkGNNError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from sparkgnn.pe import PEStore
    from sparkgnn.planner.ir import Plan

SINGLE_MODEL_NAME = "model"

F = TypeVar("F", bound=Callable[..., Any])


def model_name(source: Any) -> str:
    """The name of one model in a result: the saved model's directory name for a path, else "model"."""
    if isinstance(source, (str, os.PathLike)):
        return os.path.basename(os.fspath(source).rstrip("/")) or SINGLE_MODEL_NAME
    return SINGLE_MODEL_NAME


@dataclass(frozen=True)
class JobResult:
    """The result of `sparkgnn.infer`, keyed by model name in the order the models were given.

    `frames[name]`: DataFrame(id, h[, pred]) of that model (h its final output, float32 list; pred
    the argmax when the model ends in a classifier), read back from `out/<name>` when the job wrote
    one. `reports[name]` / `plans[name]`: the run report (engine.executor.RunReport: seconds and
    bytes per step) and the compiled plan of the job that computed it; models batched into one job
    share the same report and plan objects. A single model is keyed by its directory name when
    given as a path, else "model". `phases`: where the call's wall time went
    (engine.phases.PhaseClock.summary: wall_s, phases, unaccounted_s, unaccounted_fraction; the
    caller's own active clock when it had one, so its phases before the call are in it too)."""

    frames: Mapping[str, DataFrame]
    reports: Mapping[str, Any] = field(default_factory=dict)
    plans: Mapping[str, Plan] = field(default_factory=dict)
    phases: Mapping[str, Any] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        """The model names, in the order the models were given."""
        return list(self.frames)

    def _only(self, what: str, values: Mapping[str, Any]) -> Any:
        if len(self.frames) != 1:
            raise SparkGNNError(
                f"this result holds {len(self.frames)} models ({', '.join(self.frames)}): "
                f"use result.{what}s[name] instead of result.{what}"
            )
        (name,) = self.frames
        if name not in values:
            raise SparkGNNError(f"this result holds no {what} for model {name!r}")
        return values[name]

    @property
    def frame(self) -> DataFrame:
        """The one model's DataFrame; an error naming the models when the result holds several."""
        return self._only("frame", self.frames)

    @property
    def report(self) -> Any:
        """The one model's run report (see `frame`)."""
        return self._only("report", self.reports)

    @property
    def plan(self) -> Plan:
        """The one model's compiled plan (see `frame`)."""
        return self._only("plan", self.plans)

    @property
    def runs(self) -> list[tuple[Any, Plan]]:
        """(report, plan) of each job that ran, in order: one per batch of models (a single model
        or models batched together share one)."""
        return list(zip(_distinct(self.reports.values()), _distinct(self.plans.values()), strict=True))

    def legacy(self, as_list: bool, with_report: bool) -> Any:
        """The previous release's return value for the same call: a DataFrame or a list of them,
        or with `return_report` (frame, report, plan) / (frames, reports per job, plans per job)."""
        if not as_list:
            return (self.frame, self.report, self.plan) if with_report else self.frame
        frames = list(self.frames.values())
        if not with_report:
            return frames
        return frames, [report for report, _ in self.runs], [plan for _, plan in self.runs]


@dataclass(frozen=True)
class StoreResult:
    """The result of `sparkgnn.precompute` and `sparkgnn.refresh`: `store`, the PE store opened
    against the graph it now describes; `report`, what the job did (precompute: the engine's
    RunReport, None when every layer was already committed; refresh: a pe.refresh.RefreshReport);
    `plan`, the compiled plan the precompute ran (None for a refresh, which runs no planner plan,
    and for a precompute with nothing left to compute)."""

    store: PEStore
    report: Any = None
    plan: Plan | None = None


def _distinct(values) -> list:
    """`values` without repeats (by identity), first occurrence first."""
    seen: list = []
    for value in values:
        if not any(value is kept for kept in seen):
            seen.append(value)
    return seen


def legacy_positional(names: Sequence[str], *, leading: int = 3) -> Callable[[F], F]:
    """Accept, with a DeprecationWarning, the previous release's positional options.

    The decorated function takes `leading` positional parameters (spark, graph, model) and
    keyword-only options. A call passing more positionals is mapped onto `names` (the old
    parameter order) and gets the keyword `_legacy=True`, so the function can return what the old
    form returned. More positionals than `names`, or an option given both ways, is a TypeError
    as before; an old option the function no longer has (`log`: sparkgnn logs through `logging`)
    is dropped. The wrapper keeps the new signature (inspect.signature, help, type checkers)."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if len(args) <= leading:
                return fn(*args, **kwargs)
            extra = args[leading:]
            if len(extra) > len(names):
                raise TypeError(
                    f"{fn.__name__}() takes {leading} positional arguments; pass the options by keyword "
                    f"({', '.join(names)})"
                )
            given = dict(zip(names, extra, strict=False))
            both = sorted(set(given) & set(kwargs))
            if both:
                raise TypeError(f"{fn.__name__}() got multiple values for {', '.join(both)}")
            warnings.warn(
                f"{fn.__name__}(): passing {', '.join(given)} by position is deprecated and will stop "
                f"working in the next release; pass them by keyword (see sparkgnn.engine.result)",
                DeprecationWarning,
                stacklevel=2,
            )
            accepted = inspect.signature(fn).parameters
            kept = {name: value for name, value in given.items() if name in accepted}
            return fn(*args[:leading], **kept, **kwargs, _legacy=True)

        wrapper.__signature__ = _public_signature(fn)  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


def _public_signature(fn: Callable) -> inspect.Signature:
    """fn's signature without the private `_legacy` and deprecated `return_report` keywords."""
    signature = inspect.signature(fn)
    hidden = {"_legacy", "return_report"}
    return signature.replace(parameters=[p for p in signature.parameters.values() if p.name not in hidden])


def warn_return_report(fn_name: str) -> None:
    """The DeprecationWarning for infer's old `return_report=` keyword."""
    warnings.warn(
        f"{fn_name}(return_report=...) is deprecated and will be removed in the next release: "
        "the result now always carries the report and plan (JobResult.report, .plan)",
        DeprecationWarning,
        stacklevel=4,  # past infer and legacy_positional's wrapper: the caller's line
    )
