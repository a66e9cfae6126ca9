"""Serving new query nodes (docs/ARCHITECTURE.md "Serving modes and CGP").

request     Request (Q's ids, features, edges), validation (RequestError), Parquet files
workload    the OMEGA 8.1 workload: 25% of test vertices held out, requests of B queries
context     ServingContext: G's CSC index, G's layer statistics, counted feature access
compgraph   k-hop in-neighbourhood computation graph (exact or sampled) + layered forward
modes       registry of modes (full, ns) and Answer
reuse_modes he, srpe, exact: modes that reuse the PE store (stored.py aligns it to G)
plans       what each reuse mode recomputes, layer by layer (LayerWork lists)
sizes       a request's measured per-layer sizes as planner data (planner.serving: plans in the IR)
sketch      cheap pre-run size estimates of the exact plans (FULL, EXACT), registry EXACT_PLANS
auto_mode   auto: per request the exact plan (EXACT or FULL) with the lower estimated cost
delta       evaluates LayerWork: stored state + new - old messages; CGP over P partitions
policies    SRPE recomputation policies (qer, is, random, ae)
engine      QueryEngine(graph, model, mode=..., **mode_options).answer(request) / .explain(request)
typed       TypedQueryEngine: typed requests (queries per node type, edges per relation), TYPED_MODES
typed_request  the typed request file (request's rows plus type / relation), read into TypedRequests
dl_ops      the ops serving adds to a DL handler (serving_partials), registered on import
evaluate    score modes against FULL and labels (CLI)
"""

from sparkgnn.serving import (
    auto_mode,  # noqa: F401  (registers auto: the cheaper of exact and full per request)
    dl_ops,
    reuse_modes,  # noqa: F401  (registers he, srpe, exact)
)
from sparkgnn.serving.context import Meter, ServingContext
from sparkgnn.serving.engine import QueryEngine
from sparkgnn.serving.modes import MODES, Answer, Mode, ModeError, register_mode
from sparkgnn.serving.request import Request, RequestError, read_requests, write_requests

# The DL handler of an in-process runner serves serving's ops (serving_partials) wherever serving
# runs: dl itself never imports serving (dl_ops.py).
dl_ops.register()

# workload is loaded on first use (PEP 562), not here: `python -m sparkgnn.serving.workload` would
# otherwise find it imported by this package before runpy runs it, and warn on stderr each run.
_LAZY = {
    "Workload": "sparkgnn.serving.workload",
    "WorkloadError": "sparkgnn.serving.workload",
    "make_workload": "sparkgnn.serving.workload",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Answer",
    "MODES",
    "Meter",
    "Mode",
    "ModeError",
    "QueryEngine",
    "Request",
    "RequestError",
    "ServingContext",
    "Workload",
    "WorkloadError",
    "make_workload",
    "read_requests",
    "register_mode",
    "write_requests",
]
