"""The modes that reuse the PE store: EXACT equals FULL (every layer type, k in {2, 3}, Cora and
a skewed graph with weights and self loops, any partitioning); HE and SRPE equal independent
references built from the model's layers; SRPE with gamma=1 equals FULL where the paper's
"recompute with the query edges" is exact (SAGE/GIN/GAT, k=2); bad set-ups fail clearly."""

import numpy as np
import pytest
from serving_refs import two_layer_with_layer1

from sparkgnn.models import Model
from sparkgnn.pe.local import precompute_local
from sparkgnn.serving import ModeError, QueryEngine
from sparkgnn.serving.policies import candidates
from sparkgnn.serving.stored import StoreMismatch

KINDS = ["sage", "gin", "gcn", "gat"]


def rel(a, b):
    return float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


def engines(setup, **modes):
    wl, pyg, model, store, full = setup
    return {
        name: QueryEngine(wl.graph_G, model, mode=mode, store=store, context=full.context, **opts)
        for name, (mode, opts) in modes.items()
    }


@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize("kind", KINDS + ["gatv2", "resgated", "le", "graphconv", "sage_project", "sgconv", "lgconv"])
@pytest.mark.parametrize("which", ["cora", "skewed"])
def test_exact_equals_full(which, kind, layers, reuse_setup, request):
    setup = reuse_setup(request, which, kind, layers)
    wl, full = setup[0], setup[4]
    e = engines(setup, exact=("exact", {}), exact_p4=("exact", {"partitions": 4}))
    for r in wl.requests:
        ref = full.answer(r)
        for name, engine in e.items():
            a = engine.answer(r)
            assert rel(a.h, ref.h) < 1e-5, (which, kind, layers, name, r.request_id)
            np.testing.assert_array_equal(a.qid, r.qid)
            np.testing.assert_array_equal(a.pred, ref.pred)
        # EXACT recomputes a fraction of what FULL touches
        assert a.breakdown["nodes_recomputed"] < ref.breakdown["nodes_touched"]


@pytest.mark.parametrize("kind", ["sage", "gin", "gat"])
def test_srpe_gamma_one_equals_full_for_two_layers(kind, reuse_setup, request):
    """k=2: recomputing every candidate from its stored state + its query edges IS its exact
    layer-1 value (no degree normalisation involved), so SRPE(1) == FULL."""
    setup = reuse_setup(request, "skewed", kind, 2)
    wl, full = setup[0], setup[4]
    srpe = engines(setup, s=("srpe", {"gamma": 1.0}))["s"]
    for r in wl.requests:
        assert rel(srpe.answer(r).h, full.answer(r).h) < 1e-5


@pytest.mark.parametrize("kind", ["sage", "gcn"])
@pytest.mark.parametrize("gamma, policy", [(0.0, "qer"), (0.3, "qer"), (0.5, "random"), (1.0, "is")])
def test_he_and_srpe_equal_their_reference(kind, gamma, policy, reuse_setup, request):
    """HE/SRPE = layer 2 on the union graph whose layer-1 inputs are exact for queries (and, for
    SAGE, for the recomputed candidates) and stored for everything else."""
    setup = reuse_setup(request, "cora", kind, 2)
    wl, pyg, model, store, full = setup
    G = wl.graph_G
    e = engines(setup, s=("srpe", {"gamma": gamma, "policy": policy}), he=("he", {}))
    for r in wl.requests:
        a = e["s"].answer(r)
        cands = candidates(e["s"].context.prepare(r))
        assert a.breakdown["candidates"] == len(cands)
        assert a.breakdown["recomputed_per_layer"] == [int(np.ceil(gamma * len(cands) - 1e-9)), 0]
        ref_he, _, _ = two_layer_with_layer1(model, G, r, np.empty(0, np.int64))
        assert rel(e["he"].answer(r).h, ref_he) < 1e-5
        if gamma == 0.0:
            assert rel(a.h, ref_he) < 1e-5


def test_srpe_candidates_use_exact_layer1_values(reuse_setup, request):
    """SAGE k=2: SRPE's answer = the reference with exactly its chosen rows exact at layer 1."""
    setup = reuse_setup(request, "cora", "sage", 2)
    wl, pyg, model, store, full = setup
    G = wl.graph_G
    srpe = engines(setup, s=("srpe", {"gamma": 0.4, "policy": "qer"}))["s"]
    for r in wl.requests:
        prep = srpe.context.prepare(r)
        works, _ = srpe.mode.works(srpe.context, prep, None)
        chosen = works[0].targets[works[0].from_state]
        assert len(chosen) > 0
        ref, _, _ = two_layer_with_layer1(model, G, r, chosen)
        assert rel(srpe.answer(r).h, ref) < 1e-5


def test_partitions_exchange_bytes_and_agree(reuse_setup, request):
    setup = reuse_setup(request, "skewed", "gcn", 3)
    wl = setup[0]
    e = engines(setup, p1=("srpe", {"gamma": 0.5}), p3=("srpe", {"gamma": 0.5, "partitions": 3}))
    for r in wl.requests:
        a1, a3 = e["p1"].answer(r), e["p3"].answer(r)
        assert rel(a3.h, a1.h) < 1e-5
        assert a1.breakdown["partial_bytes"] == 0 and a3.breakdown["partial_bytes"] > 0
        assert a3.breakdown["allgather_bytes"] > 0
        assert a1.breakdown["bytes_fetched"] == a3.breakdown["bytes_fetched"]


def test_reuse_modes_need_a_store(cora_workload):
    G = cora_workload.graph_G
    from serving_testkit import pyg_model

    model = Model.from_pyg(pyg_model("sage", G.feature_dim, 2))
    with pytest.raises(ModeError, match="pass store="):
        QueryEngine(G, model, mode="exact").answer(cora_workload.requests[0])
    with pytest.raises(ModeError, match="gamma"):
        QueryEngine(G, model, mode="srpe", gamma=1.5)
    with pytest.raises(ModeError, match="unknown SRPE policy"):
        QueryEngine(G, model, mode="srpe", policy="best")
    with pytest.raises(ModeError, match="partitions"):
        QueryEngine(G, model, mode="he", partitions=0)


def test_states_required_for_srpe_and_exact(cora_workload, tmp_path):
    G = cora_workload.graph_G
    from serving_testkit import pyg_model

    model = Model.from_pyg(pyg_model("sage", G.feature_dim, 2))
    store = precompute_local(G, model, str(tmp_path), states=False)
    r = cora_workload.requests[0]
    QueryEngine(G, model, mode="he", store=store).answer(r)  # HE needs no states
    with pytest.raises(StoreMismatch, match="without partial aggregation states"):
        QueryEngine(G, model, mode="exact", store=store).answer(r)


@pytest.mark.parametrize("aggr", ["max", "sum"])
def test_exact_with_max_recomputes_from_scratch(aggr, skewed_workload, tmp_path):
    """max cannot remove a message: changed vertices are recomputed from all in-neighbours'
    stored values (and still equal FULL); sum takes the delta and recomputes none from scratch."""
    import torch_geometric.nn as gnn
    from serving_testkit import randomize

    wl = skewed_workload
    G = wl.graph_G
    model = Model.from_pyg(randomize(gnn.GraphSAGE(G.feature_dim, 16, 3, out_channels=4, aggr=aggr), 5))
    store = precompute_local(G, model, str(tmp_path))
    full = QueryEngine(G, model, mode="full")
    exact = QueryEngine(G, model, mode="exact", store=store, context=full.context)
    scratch = 0
    for r in wl.requests:
        a, ref = exact.answer(r), full.answer(r)
        assert rel(a.h, ref.h) < 1e-5
        scratch += a.breakdown["recomputed_from_scratch"]
    assert (scratch > 0) == (aggr == "max")
