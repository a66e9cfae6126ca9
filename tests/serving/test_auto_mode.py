"""mode="auto": per request the cheaper exact plan (EXACT or FULL) by the planner's estimate.
Answers equal FULL whatever it picks; it picks what its estimates say (FULL on Cora with GCN at
the default constants, EXACT when EXACT's estimate is lower); explain() shows the chosen plan;
the sketch's pre-run sizes track the modes' measured ones."""

import numpy as np
import pytest

from sparkgnn.planner.serving import DEFAULT_COST, ServingCostModel
from sparkgnn.serving import ModeError, QueryEngine
from sparkgnn.serving.sketch import EXACT_PLANS, sketch_exact, sketch_full


def rel(a, b):
    return float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


def auto_engine(setup, **options):
    wl, _pyg, model, store, full = setup
    return QueryEngine(wl.graph_G, model, mode="auto", store=store, context=full.context, **options)


@pytest.mark.parametrize(
    "which,kind,layers",
    [("cora", "gcn", 2), ("cora", "sage", 2), ("skewed", "gcn", 2), ("skewed", "sage", 2), ("skewed", "gcn", 3)],
)
def test_auto_answers_equal_full(which, kind, layers, reuse_setup, request):
    setup = reuse_setup(request, which, kind, layers)
    wl, full = setup[0], setup[4]
    for cost in (DEFAULT_COST, ServingCostModel(recompute_edge_float_s=1.0)):  # the second forces EXACT
        auto = auto_engine(setup, cost=cost)
        for r in wl.requests:
            a, ref = auto.answer(r), full.answer(r)
            assert rel(a.h, ref.h) < 1e-5, (which, kind, layers, r.request_id, a.breakdown["auto_choice"])
            np.testing.assert_array_equal(a.qid, r.qid)
            np.testing.assert_array_equal(a.pred, ref.pred)
            est = a.breakdown["auto_estimates_ms"]
            assert a.breakdown["auto_choice"] == min(est, key=est.get)


def test_auto_picks_full_for_gcn_on_cora(reuse_setup, request):
    """Cora (2.7K vertices, 1433-d): FULL's 2-hop graph is small and EXACT runs GCN raw (1433
    floats per message, every changed in-edge twice): the serving bench measured FULL 14.5 ms
    vs EXACT 55 ms at B=512, and the estimate ranks them the same way."""
    setup = reuse_setup(request, "cora", "gcn", 2)
    auto = auto_engine(setup)
    for r in setup[0].requests:
        if r.batch_size >= 64:
            a = auto.answer(r)
            assert a.breakdown["auto_choice"] == "full", a.breakdown["auto_estimates_ms"]


def test_auto_picks_exact_where_its_estimate_is_lower(reuse_setup, request):
    setup = reuse_setup(request, "skewed", "sage", 2)
    dear_full = ServingCostModel(recompute_edge_float_s=1e-6)
    auto = auto_engine(setup, cost=dear_full)
    for r in setup[0].requests:
        a = auto.answer(r)
        assert a.breakdown["auto_choice"] == "exact"
        assert a.breakdown["auto_estimates_ms"]["exact"] < a.breakdown["auto_estimates_ms"]["full"]


def test_explain_names_the_chosen_plan_and_operators(reuse_setup, request):
    setup = reuse_setup(request, "cora", "gcn", 2)
    wl, full = setup[0], setup[4]
    r = wl.requests[-1]
    auto = auto_engine(setup)
    text = auto.explain(r)
    chosen = auto.answer(r).breakdown["auto_choice"]
    assert f"mode={chosen}" in text and f"{chosen} " in text and "(chosen)" in text
    assert "exact" in text and "full" in text
    for name in ("SplitRequest", "LocalAggregate", "ApplyVertex"):
        assert name in text
    plan = auto.plan(r)
    assert plan.strategy == chosen and set(plan.graph_stats["serving"]["candidates"]) == {"exact", "full"}
    # every mode explains a request from its measured sizes
    for mode, ops in (("exact", ("SelectRecompute", "LoadPE", "Merge")), ("he", ("LoadPE",)), ("full", ("Scan",))):
        e = QueryEngine(wl.graph_G, setup[2], mode=mode, store=setup[3], context=full.context)
        text = e.explain(r)
        assert f"mode={mode}" in text and "(sizes measured)" in text
        for name in ops:
            assert name in text


@pytest.mark.parametrize("which,kind", [("cora", "gcn"), ("cora", "sage"), ("skewed", "gcn"), ("skewed", "sage")])
def test_sketch_tracks_measured_sizes(which, kind, reuse_setup, request):
    """FULL's 2-layer message count is exact in the sketch (Q's and H1's in-edges are counted);
    EXACT's is extrapolated, within a factor 2 on these graphs (module doc of sketch.py)."""
    setup = reuse_setup(request, which, kind, 2)
    wl, _pyg, model, store, full = setup
    ctx = full.context
    exact = QueryEngine(wl.graph_G, model, mode="exact", store=store, context=ctx)
    for r in wl.requests:
        prep = ctx.prepare(r)
        for sketch, engine in ((sketch_full, full), (sketch_exact, exact)):
            est = sketch(ctx, prep, model)
            got = engine.mode.counts(ctx, prep)
            e_est = sum(c.edges + c.old_edges for c in est.layers)
            e_got = sum(c.edges + c.old_edges for c in got.layers)
            if sketch is sketch_full:
                assert e_est == e_got
            else:
                assert e_got / 2 <= e_est <= 2 * e_got, (e_est, e_got)
            assert est.estimated and not got.estimated


@pytest.mark.parametrize(("which", "kind"), [("skewed", "chebconv"), ("cora", "chebconv_rw")])
def test_sketch_counts_the_sources_whose_out_degree_a_request_changes(which, kind, reuse_setup, request):
    """ChebConv normalises by its sources' OUT-degree: every G source of a request edge (all of H1,
    the queries' in-neighbours) changes its degree, so EXACT recomputes each of them at layer k-1
    and sends changed messages along all their out-edges (plans.py S_l). The sketch counts them for
    certain, so its layer k-1 target count is the measured one, and its messages stay within a
    factor 4 of the measured ones (the 2-hop targets of the deeper layers are left out)."""
    setup = reuse_setup(request, which, kind, 2)
    wl, _pyg, model, store, full = setup
    ctx = full.context
    exact = QueryEngine(wl.graph_G, model, mode="exact", store=store, context=ctx)
    k = model.num_rounds
    for r in wl.requests:
        prep = ctx.prepare(r)
        est, got = sketch_exact(ctx, prep, model), exact.mode.counts(ctx, prep)
        assert est.layers[k - 2].targets == got.layers[k - 2].targets, r.request_id
        e_est = sum(c.edges + c.old_edges for c in est.layers)
        e_got = sum(c.edges + c.old_edges for c in got.layers)
        assert e_got / 4 <= e_est <= 4 * e_got, (r.request_id, e_est, e_got)


def test_auto_refusals(reuse_setup, request):
    wl, _pyg, model, _store, full = reuse_setup(request, "cora", "sage", 2)
    with pytest.raises(ModeError, match="store="):
        QueryEngine(wl.graph_G, model, mode="auto", context=full.context).answer(wl.requests[0])
    with pytest.raises(ModeError, match="unknown exact serving plan"):
        QueryEngine(wl.graph_G, model, mode="auto", context=full.context, candidates=("he",))
    assert {"exact", "full"} <= set(EXACT_PLANS)
