"""The modes that reuse the PE store: EXACT equals FULL (every layer type, k in {2, 3}, Cora and
a skewed graph with weights and self loops, any partitioning); HE and SRPE equal independent
references built from the model's layers; SRPE with gamma=1 equals FULL where the paper's
"recompute with the query edges" is exact (SAGE/GIN/GAT, k=2); with edge attributes in G and in
the requests (GINE, GAT with edge_dim) FULL equals PyG, EXACT equals FULL, and HE / SRPE equal it
on requests that change no vertex of G; bad set-ups fail clearly."""

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


@pytest.mark.parametrize("kind", KINDS + ["gatv2", "resgated", "le", "graphconv", "sage_project", "sgconv", "lgconv"])
@pytest.mark.parametrize("which", ["cora", "skewed"])
def test_he_on_one_partition_equals_he_through_the_layer_works(which, kind, reuse_setup, request):
    """HE on one partition runs the queries-only path (LayerExecutor.run_queries); on two partitions
    it runs the layer works every reuse mode runs (plans.he_works through the partition kernel).
    Same answers and the same counts in the breakdown, for every layer type, on Cora and on the
    skewed graph (weights, self loops, queries without in-edges)."""
    setup = reuse_setup(request, which, kind, 2)
    e = engines(setup, one=("he", {}), two=("he", {"partitions": 2}))
    for r in setup[0].requests:
        a, b = e["one"].answer(r), e["two"].answer(r)
        assert rel(a.h, b.h.astype(np.float64)) < 1e-5, (which, kind, r.request_id)
        np.testing.assert_array_equal(a.qid, r.qid)
        for key in ("nodes_touched", "edges", "nodes_recomputed", "recomputed_per_layer"):
            assert a.breakdown[key] == b.breakdown[key], (key, which, kind, r.request_id)


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


@pytest.mark.parametrize(
    ("kind", "which", "layers"), [("residual", "cora", 2), ("jk_cat", "skewed", 2), ("jk_max", "skewed", 3)]
)
def test_skip_connection_models_are_served_from_their_stored_rows(kind, which, layers, reuse_setup, request):
    """Residual and JumpingKnowledge models (the store keeps each round's row with its carried
    columns): FULL equals the PyG module on G + Q, EXACT (1 and 3 partitions) equals FULL, and
    for k = 2 HE and SRPE equal their references (stored rows for what they do not recompute)."""
    import torch
    from serving_refs import union_edges

    setup = reuse_setup(request, which, kind, layers)
    wl, pyg, model, store, full = setup
    G = wl.graph_G
    e = engines(setup, exact=("exact", {}), exact_p3=("exact", {"partitions": 3}), he=("he", {}),
                srpe=("srpe", {"gamma": 0.4, "policy": "qer"}))  # fmt: skip
    for r in wl.requests:
        ref = full.answer(r)
        src, dst, _ = union_edges(G, r)
        with torch.no_grad():
            pyg_h = pyg(torch.from_numpy(np.concatenate([G.x, r.x])), torch.stack([src, dst]))[G.num_nodes :]
        assert rel(ref.h, pyg_h.numpy()) < 1e-5, (kind, r.request_id)
        for name in ("exact", "exact_p3"):
            assert rel(e[name].answer(r).h, ref.h) < 1e-5, (kind, name, r.request_id)
        if layers != 2:
            continue
        ref_he, _, _ = two_layer_with_layer1(model, G, r, np.empty(0, np.int64))
        assert rel(e["he"].answer(r).h, ref_he) < 1e-5, (kind, r.request_id)
        works, _ = e["srpe"].mode.works(e["srpe"].context, e["srpe"].context.prepare(r), None)
        chosen = works[0].targets[works[0].from_state]
        ref_srpe, _, _ = two_layer_with_layer1(model, G, r, chosen)
        assert rel(e["srpe"].answer(r).h, ref_srpe) < 1e-5, (kind, r.request_id)


@pytest.mark.parametrize(("kind", "which"), [("chebconv", "skewed"), ("chebconv_rw", "cora")])
def test_chebconv_exact_follows_the_out_degrees_a_request_changes(kind, which, reuse_setup, request):
    """ChebConv normalises by its sources' OUT-degree: a request edge leaving a vertex of G
    changes the coefficient of every out-edge of that vertex. FULL equals the PyG module on
    G + Q + the request edges, and EXACT (1 and 3 partitions), which recomputes those
    out-neighbours, equals FULL."""
    import torch
    from serving_refs import union_edges

    setup = reuse_setup(request, which, kind, 2)
    wl, pyg, model, store, full = setup
    G = wl.graph_G
    e = engines(setup, exact=("exact", {}), exact_p3=("exact", {"partitions": 3}))
    leaving = 0
    for r in wl.requests:
        leaving += int(G.id_index.lookup(r.src)[1].sum())  # request edges out of a vertex of G
        ref = full.answer(r)
        src, dst, _ = union_edges(G, r)
        with torch.no_grad():
            pyg_h = pyg(torch.from_numpy(np.concatenate([G.x, r.x])), torch.stack([src, dst]))[G.num_nodes :]
        assert rel(ref.h, pyg_h.numpy()) < 1e-5, (kind, r.request_id)
        for name, engine in e.items():
            assert rel(engine.answer(r).h, ref.h) < 1e-5, (kind, name, r.request_id)
    assert leaving > 0


class _EdgeFeatureNet:
    """GINE -> GAT(edge_dim) and GAT(edge_dim) -> GINE, written as PyG's tutorials write them."""

    @staticmethod
    def build(f: int, d: int, gat_first: bool):
        import torch
        import torch_geometric.nn as gnn

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                gine = gnn.GINEConv(torch.nn.Sequential(torch.nn.Linear(f if not gat_first else 8, 8)), edge_dim=d)
                gat = gnn.GATConv(f if gat_first else 8, 4, heads=2, edge_dim=d)
                self.conv1, self.conv2 = (gat, gine) if gat_first else (gine, gat)

            def forward(self, x, edge_index, edge_attr):
                x = self.conv1(x, edge_index, edge_attr).relu()
                return self.conv2(x, edge_index, edge_attr)

        torch.manual_seed(5)
        return Net().eval()


def _attr_requests(graph, d: int, seed: int, into_g: bool):
    """Three requests of 3 queries each; edges G -> Q and Q -> Q (and Q -> G with `into_g`, one
    of them into a G vertex that also feeds a query), every edge with its attribute row."""
    from sparkgnn.serving.request import Request

    rng = np.random.default_rng(seed)
    out = []
    for i in range(3):
        q = graph.ids.max() + 1 + 10 * i + np.arange(3)
        g = rng.choice(graph.ids, 6, replace=False)
        src = np.concatenate([g[:4], q[:2]] + ([q[:2]] if into_g else []))
        dst = np.concatenate([q[[0, 1, 2, 2]], q[1:]] + ([g[[0, 4]]] if into_g else []))  # g0: in and out
        attr = rng.normal(size=(len(src), d)).astype(np.float32)
        x = rng.normal(size=(3, graph.feature_dim)).astype(np.float32)
        out.append(Request(f"r{i}", q, x, src, dst, attr))
    return out


@pytest.mark.parametrize("gat_first", [False, True])
def test_edge_attributes_in_requests_serve_exactly(gat_first, tmp_path):
    import dataclasses

    import torch
    from serving_testkit import skewed_graph

    from sparkgnn.serving.request import RequestError

    base = skewed_graph()
    rng = np.random.default_rng(1)
    graph = dataclasses.replace(base, edge_attr=rng.normal(size=(base.num_edges, 3)).astype(np.float32))
    net = _EdgeFeatureNet.build(graph.feature_dim, 3, gat_first)
    model = Model.from_pyg(net)
    store = precompute_local(graph, model, str(tmp_path / "store"))
    full = QueryEngine(graph, model, mode="full")
    exact = [QueryEngine(graph, model, mode="exact", store=store, context=full.context, partitions=p) for p in (1, 3)]
    for r in _attr_requests(graph, 3, seed=2, into_g=True):
        # FULL is PyG's forward on G + Q + the request edges with their attributes
        ids = np.concatenate([graph.ids, r.qid])
        pos = {int(v): i for i, v in enumerate(ids)}
        src = np.concatenate([graph.edge_src, [pos[int(v)] for v in r.src]])
        dst = np.concatenate([graph.edge_dst, [pos[int(v)] for v in r.dst]])
        with torch.no_grad():
            want = net(
                torch.from_numpy(np.concatenate([graph.x, r.x])),
                torch.from_numpy(np.stack([src, dst])),
                torch.from_numpy(np.concatenate([graph.edge_attr, r.edge_attr])),
            )[graph.num_nodes :].numpy()
        ref = full.answer(r)
        assert rel(ref.h, want) < 1e-5
        for engine in exact:
            assert rel(engine.answer(r).h, ref.h) < 1e-5, (gat_first, engine.mode.partitions, r.request_id)
    # requests that change no vertex of G: HE and SRPE reuse exact PEs
    reuse = [
        QueryEngine(graph, model, mode=m, store=store, context=full.context, **o)
        for m, o in (("he", {}), ("srpe", {"gamma": 1.0}))
    ]
    for r in _attr_requests(graph, 3, seed=3, into_g=False):
        ref = full.answer(r)
        for engine in reuse:
            assert rel(engine.answer(r).h, ref.h) < 1e-5, (gat_first, engine.mode_name, r.request_id)
    bare = dataclasses.replace(r, edge_attr=None)
    with pytest.raises(RequestError, match=r"read edge attributes of width 3, the request's edges carry none"):
        full.answer(bare)
    with pytest.raises(RequestError, match=r"edge_attr has width 2, the graph's edge attributes have width 3"):
        full.answer(dataclasses.replace(r, edge_attr=r.edge_attr[:, :2]))
    with pytest.raises(ValueError, match=r"read edge features \(edge_attr, width 3\) but graph .* has none"):
        QueryEngine(base, model, mode="full")
