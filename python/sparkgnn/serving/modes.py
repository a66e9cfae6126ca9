"""Serving modes: how a request's answer is computed. A registry (MODES, by name) so that the
engine, the CLIs and the benchmark pick a mode by string and later modes (HE, SRPE, EXACT) plug
in with `@register_mode("he")` and no edit here.

    full  the exact answer: the model on G + Q + request edges, read at Q, computed on the k-hop
          in-neighbourhood of Q from raw features (compgraph.py says why that is exact).
    ns    neighbour sampling from raw features: per hop, at most fanouts[h] in-edges per vertex,
          without replacement, seeded by (seed, request_id) so an answer does not depend on the
          order requests arrive in. GCN normalisation under sampling (`ns_norm`):
            "full"    (default) degrees of the whole union graph, as FULL uses. They are metadata
                      (no feature bytes), and with fanouts >= the max in-degree NS equals FULL.
            "sampled" degrees of the sampled subgraph: what PyG NeighborLoader + GCNConv (and
                      DGL blocks) compute; hop-k vertices then have degree 1 (self loop only).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sparkgnn.errors import SparkGNNError
from sparkgnn.planner.ir import Plan
from sparkgnn.planner.serving import DEFAULT_COST, RequestCounts, ServingCostModel, compile_request
from sparkgnn.registry import Registry
from sparkgnn.serving.compgraph import build_compgraph, input_features, run_layers
from sparkgnn.serving.context import Meter, PreparedRequest, ServingContext, subgraph_stats
from sparkgnn.serving.request import Request
from sparkgnn.serving.sizes import recompute_counts

if TYPE_CHECKING:
    from sparkgnn.pe.store import PEStore

DEFAULT_FANOUTS = {1: (25,), 2: (25, 10), 3: (15, 10, 5)}
BREAKDOWN_KEYS = ("fetch_s", "compute_s", "merge_s", "bytes_fetched", "nodes_recomputed", "nodes_touched")


class ModeError(SparkGNNError, ValueError):
    """Unknown mode or an option a mode does not accept."""


MODES: Registry[type] = Registry("serving mode", ModeError)


def register_mode(name: str):
    def deco(cls):
        cls.name = name
        return MODES.register(name, cls)

    return deco


@dataclass
class Answer:
    """h: the model's output at Q (rows in request qid order); pred: argmax for logits models.
    breakdown: fetch_s, compute_s, merge_s (seconds), bytes_fetched (feature/embedding bytes read
    from G's storage), nodes_recomputed (vertices of G whose layer >= 1 value was computed),
    nodes_touched (vertices in the computation graph, queries included), plus mode extras."""

    qid: np.ndarray
    h: np.ndarray
    pred: np.ndarray | None
    breakdown: dict = field(default_factory=dict)


class Mode:
    """Base class. Subclasses take their options as keyword arguments (validated against the
    model) and implement answer(ctx, request). Every mode accepts `seed` (deterministic modes
    ignore it) so an engine can pass it whatever the mode."""

    name = ""
    # The PE store the mode reads (set by QueryEngine; None for modes that read none: full, ns).
    store: PEStore | None = None
    # How many CGP partitions one request's layers run as (reuse modes take `partitions=`).
    partitions: int = 1

    def __init__(self, model, seed: int = 0, **options):
        if options:
            raise ModeError(f"mode {self.name!r} does not take option(s) {sorted(options)}")
        self.model = model
        self.seed = int(seed)

    def answer(self, ctx: ServingContext, request: Request) -> Answer:
        meter = Meter()
        with meter.timer("plan_s"):
            prep = ctx.prepare(request)
        return self.run(ctx, prep, meter)

    def run(self, ctx: ServingContext, prep: PreparedRequest, meter: Meter) -> Answer:
        """Answer a prepared request (mode="auto" prepares once and hands it to the mode it picks)."""
        raise NotImplementedError

    def counts(self, ctx: ServingContext, prep: PreparedRequest) -> RequestCounts:
        """The request's measured per-layer sizes for this mode (planner.serving; explain())."""
        raise NotImplementedError

    def plan(self, ctx: ServingContext, request: Request, cost: ServingCostModel | None = None) -> Plan:
        """The request's plan in the planner's IR, from its measured sizes (QueryEngine.explain)."""
        return compile_request(self.counts(ctx, ctx.prepare(request)), cost or DEFAULT_COST)

    def _finish(self, prep, h, meter: Meter, cg, **extra) -> Answer:
        h = h.detach().cpu().numpy().astype(np.float32, copy=False)
        pred = h.argmax(axis=1).astype(np.int64) if self.model.output == "logits" else None
        b = prep.batch_size
        breakdown = dict(meter.seconds)
        breakdown.update(
            bytes_fetched=int(meter.bytes_fetched),
            nodes_recomputed=int(cg.sizes[1] - b) if cg.num_layers > 1 else 0,
            nodes_touched=int(cg.sizes[0]),
            edges=int(len(cg.src)),
            **extra,
        )
        return Answer(prep.request.qid.copy(), h, pred, breakdown)


def get_mode(name: str, model, **options) -> Mode:
    return MODES.lookup(name)(model, **options)


@register_mode("full")
class FullMode(Mode):
    def counts(self, ctx, prep):
        return recompute_counts(ctx, self.model, prep, build_compgraph(ctx, prep, self.model.num_rounds), self.name)

    def run(self, ctx, prep, meter):
        with meter.timer("plan_s"):
            cg = build_compgraph(ctx, prep, self.model.num_rounds)
            stats = {}
        x0 = input_features(ctx, prep, cg, meter)

        def stats_for(l, conv):
            if l not in stats:
                stats[l] = ctx.union_stats(conv, prep, cg.nodes)
            return stats[l]

        h = run_layers(self.model, x0, cg, stats_for, meter)
        return self._finish(prep, h, meter, cg)


NS_NORMS = ("full", "sampled")


@register_mode("ns")
class NSMode(Mode):
    def __init__(self, model, fanouts=None, seed: int = 0, ns_norm: str = "full", **options):
        super().__init__(model, seed=seed, **options)
        k = model.num_rounds
        if fanouts is None:
            if k not in DEFAULT_FANOUTS:
                raise ModeError(f"no default fanouts for a {k}-layer model; pass fanouts=")
            fanouts = DEFAULT_FANOUTS[k]
        fanouts = tuple(int(f) for f in fanouts)
        if len(fanouts) != k or min(fanouts) < 1:
            raise ModeError(f"fanouts {fanouts} must give one positive fanout per layer ({k})")
        if ns_norm not in NS_NORMS:
            raise ModeError(f"ns_norm must be one of {NS_NORMS}, got {ns_norm!r}")
        self.fanouts, self.ns_norm = fanouts, ns_norm

    def rng(self, request: Request) -> np.random.Generator:
        """Seeded by (seed, crc32(request_id)): the same request gets the same sample."""
        return np.random.default_rng([self.seed, zlib.crc32(request.request_id.encode())])

    def counts(self, ctx, prep):
        cg = build_compgraph(ctx, prep, self.model.num_rounds, self.fanouts, self.rng(prep.request))
        return recompute_counts(ctx, self.model, prep, cg, self.name)

    def run(self, ctx, prep, meter):
        with meter.timer("plan_s"):
            cg = build_compgraph(ctx, prep, self.model.num_rounds, self.fanouts, self.rng(prep.request))
            stats = {}
        x0 = input_features(ctx, prep, cg, meter)

        def stats_for(l, conv):
            if l not in stats:
                stats[l] = (
                    ctx.union_stats(conv, prep, cg.nodes)
                    if self.ns_norm == "full"
                    else subgraph_stats(conv, cg.src, cg.dst, cg.weight, cg.sizes[0])
                )
            return stats[l]

        h = run_layers(self.model, x0, cg, stats_for, meter)
        return self._finish(prep, h, meter, cg, fanouts=list(self.fanouts))
