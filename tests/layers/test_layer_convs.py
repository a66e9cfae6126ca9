"""Each supported conv, converted from PyG, equals the PyG conv's eval forward when its
aggregation is split over 1, 2 or 7 random partitions and merged, in both payload modes
(raw and transform-then-propagate), on the corner-case synthetic graph and on Cora."""

import pytest
import torch
import torch_geometric.nn as gnn
import torch_geometric.nn.aggr as A
import torch_test_graphs as graphs  # noqa: E402

from sparkgnn.layers import MergeableConv, propagate
from sparkgnn.models import Model

rel_err = graphs.rel_err
TOL = 1e-5
PARTS = (1, 2, 7)


_randomize = graphs.randomize


def _powermean():
    return A.PowerMeanAggregation(p=2.0)


def _powermean_learn():
    agg = A.PowerMeanAggregation(learn=True, p=1.5)
    return agg


def _softmax_aggr():
    return A.SoftmaxAggregation(t=0.7)


CONVS = {
    "gcn": lambda f: gcn_conv(f),
    "gcn_noloops": lambda f: gnn.GCNConv(f, 8, add_self_loops=False),
    "gcn_nonorm": lambda f: gnn.GCNConv(f, 8, normalize=False, bias=False),
    "sage_mean": lambda f: gnn.SAGEConv(f, 8),
    "sage_max": lambda f: gnn.SAGEConv(f, 8, aggr="max"),
    "sage_sum_norm_noroot": lambda f: gnn.SAGEConv(f, 8, aggr="sum", normalize=True, root_weight=False),
    "sage_min_nobias": lambda f: gnn.SAGEConv(f, 8, aggr="min", bias=False),
    "sage_powermean": lambda f: gnn.SAGEConv(f, 8, aggr=_powermean()),
    "sage_powermean_learn": lambda f: gnn.SAGEConv(f, 8, aggr=_powermean_learn()),
    "sage_var": lambda f: gnn.SAGEConv(f, 8, aggr=A.VarAggregation()),
    "sage_std": lambda f: gnn.SAGEConv(f, 8, aggr="std"),
    "sage_softmax": lambda f: gnn.SAGEConv(f, 8, aggr=_softmax_aggr()),
    "gin_seq_bn": lambda f: gnn.GINConv(
        torch.nn.Sequential(
            torch.nn.Linear(f, 16),
            torch.nn.BatchNorm1d(16),
            torch.nn.ReLU(),
            torch.nn.Dropout(0.5),
            torch.nn.Linear(16, 8),
        ),
        eps=0.25,
        train_eps=True,
    ),
    "gin_mlp": lambda f: gnn.GINConv(gnn.MLP([f, 16, 8], norm="batch_norm", dropout=0.3)),
    "gin_bn_first": lambda f: gnn.GINConv(
        torch.nn.Sequential(torch.nn.BatchNorm1d(f), torch.nn.Linear(f, 8), torch.nn.ELU(0.7))
    ),
    "gat_concat": lambda f: gnn.GATConv(f, 4, heads=3, dropout=0.5),
    "gat_mean": lambda f: gnn.GATConv(f, 5, heads=2, concat=False, negative_slope=0.1),
    "gat_residual_noloops": lambda f: gnn.GATConv(f, 4, heads=2, residual=True, add_self_loops=False, bias=False),
    "gat_bipartite_lins": lambda f: gnn.GATConv((f, f), 4, heads=2),
    "gatv2_concat": lambda f: gnn.GATv2Conv(f, 4, heads=3, dropout=0.5),
    "gatv2_mean_shared_residual": lambda f: gnn.GATv2Conv(
        f, 5, heads=2, concat=False, share_weights=True, residual=True, negative_slope=0.1
    ),
    "gatv2_noloops_nobias_fill": lambda f: gnn.GATv2Conv(
        f, 4, heads=2, add_self_loops=False, bias=False, fill_value=0.5
    ),
    "gatv2_bipartite_lins": lambda f: gnn.GATv2Conv((f, f), 4, heads=2),
    "resgated": lambda f: gnn.ResGatedGraphConv(f, 8),
    "resgated_tanh_noroot_nobias": lambda f: gnn.ResGatedGraphConv(
        f, 8, act=torch.nn.Tanh(), root_weight=False, bias=False
    ),
    "le": lambda f: gnn.LEConv(f, 8),
    "le_nobias": lambda f: gnn.LEConv(f, 8, bias=False),
    "graphconv_add": lambda f: gnn.GraphConv(f, 8),
    "graphconv_mean": lambda f: gnn.GraphConv(f, 8, aggr="mean"),
    "graphconv_max_nobias": lambda f: gnn.GraphConv(f, 8, aggr="max", bias=False),
    "graphconv_std": lambda f: gnn.GraphConv(f, 8, aggr="std"),
    "sage_project": lambda f: gnn.SAGEConv(f, 8, project=True),
    "sage_project_max_norm_noroot": lambda f: gnn.SAGEConv(
        f, 8, aggr="max", project=True, normalize=True, root_weight=False
    ),
    "sage_project_sum_nobias": lambda f: gnn.SAGEConv(f, 8, aggr="sum", project=True, bias=False),
    "lgconv": lambda f: _after_linear(f, gnn.LGConv()),
    "lgconv_nonorm": lambda f: _after_linear(f, gnn.LGConv(normalize=False)),
    "sgconv_k1": lambda f: gnn.SGConv(f, 8, K=1),
    "sgconv_k3": lambda f: gnn.SGConv(f, 8, K=3),
    "sgconv_k2_wide_noloops_nobias": lambda f: gnn.SGConv(f, f + 5, K=2, add_self_loops=False, bias=False),
    "tagconv": lambda f: gnn.TAGConv(f, 8),
    "tagconv_k1_nonorm_nobias": lambda f: gnn.TAGConv(f, 8, K=1, normalize=False, bias=False),
    "appnp": lambda f: _after_linear(f, gnn.APPNP(K=4, alpha=0.15, dropout=0.5)),
    "chebconv_sym_k3": lambda f: gnn.ChebConv(f, 8, K=3),
    "chebconv_rw_k2_nobias": lambda f: gnn.ChebConv(f, 8, K=2, normalization="rw", bias=False),
    "edgeconv_max": lambda f: gnn.EdgeConv(
        torch.nn.Sequential(torch.nn.Linear(2 * f, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    ),
    "edgeconv_mean_mlp": lambda f: gnn.EdgeConv(gnn.MLP([2 * f, 16, 8], norm="batch_norm"), aggr="mean"),
    "edgeconv_add": lambda f: gnn.EdgeConv(torch.nn.Linear(2 * f, 8), aggr="add"),
    "transformer_concat": lambda f: gnn.TransformerConv(f, 4, heads=3, dropout=0.5),
    "transformer_mean_beta": lambda f: gnn.TransformerConv(f, 5, heads=2, concat=False, beta=True),
    "transformer_concat_beta": lambda f: gnn.TransformerConv(f, 4, heads=2, beta=True),
    "transformer_noroot_nobias": lambda f: gnn.TransformerConv(f, 4, heads=2, root_weight=False, bias=False),
}


def _after_linear(f, conv, weighted=False):
    """A conv without in_channels (LGConv) after a Linear(f, f) that gives it its width; the
    model reads edge weights when `weighted`."""
    if weighted:
        return gnn.Sequential("x, edge_index, w", [(torch.nn.Linear(f, f), "x -> x"), (conv, "x, edge_index, w -> x")])
    return gnn.Sequential("x, edge_index", [(torch.nn.Linear(f, f), "x -> x"), (conv, "x, edge_index -> x")])


def gcn_conv(f):
    return gnn.GCNConv(f, 8)


@pytest.fixture(scope="module", params=sorted(CONVS))
def conv_case(request):
    return request.param


def _check(case, graph, weighted):
    torch.manual_seed(0)
    pyg = _randomize(CONVS[case](graph.num_features), seed=len(case))
    x = graph.x
    if "powermean" in case:
        x = x.abs()  # power means of negative inputs are clamped away (PyG semantics)
    w = graph.edge_weight if weighted else None
    with torch.no_grad():
        ref = pyg(x, graph.edge_index, w) if weighted else pyg(x, graph.edge_index)
    model = Model.from_pyg(pyg, output="embedding")
    conv = model.conv(0)
    assert isinstance(conv, MergeableConv)
    modes = [False, True] if conv.can_pre_transform else [False]
    for pre in modes:
        for parts in PARTS:
            out = model(x, graph.edge_index, w, parts=parts, seed=parts, pre_transform=pre)
            err = rel_err(out, ref)
            assert err <= TOL, (case, graph.name, pre, parts, err)


def test_conv_equals_pyg(conv_case, graph):
    _check(conv_case, graph, weighted=False)


@pytest.mark.parametrize("case", ["gcn", "gcn_noloops", "gcn_nonorm"])
def test_gcn_with_edge_weights_equals_pyg(case, graph):
    _check(case, graph, weighted=True)


@pytest.mark.parametrize("case", ["le", "le_nobias"])
def test_le_with_edge_weights_equals_pyg(case, graph):
    """LEConv's sum of e_ji (a_j - b_i): weights scale the destination term per edge too."""
    _check(case, graph, weighted=True)


def test_le_without_edge_weights_ignores_them(synthetic):
    """A LEConv converted with use_edge_weight=False (its model feeds it none) equals PyG's
    unweighted forward even when the graph carries weights."""
    from sparkgnn.models.pyg_convs import conv_layer

    pyg = _randomize(gnn.LEConv(synthetic.num_features, 8), seed=2)
    conv = conv_layer(pyg, "le", use_edge_weight=False)
    with torch.no_grad():
        ref = pyg(synthetic.x, synthetic.edge_index)
    out = propagate(conv, synthetic.x, synthetic.edge_index[0], synthetic.edge_index[1], synthetic.edge_weight, parts=3)
    assert rel_err(out, ref) <= TOL


@pytest.mark.parametrize(
    "case", ["graphconv_add", "graphconv_max_nobias", "sgconv_k3", "sgconv_k2_wide_noloops_nobias"]
)
def test_weighted_propagations_equal_pyg(case, graph):
    """GraphConv scales messages by e_ji; SGConv's gcn_norm counts weights in the degree."""
    _check(case, graph, weighted=True)


@pytest.mark.parametrize("case", ["tagconv", "tagconv_k1_nonorm_nobias"])
def test_tagconv_with_edge_weights_equals_pyg(case, graph):
    """TAGConv's gcn_norm (no self loops) counts the weights in the in-degree; without
    normalisation they scale each message."""
    _check(case, graph, weighted=True)


@pytest.mark.parametrize("options", [{}, {"add_self_loops": False}, {"normalize": False}])
def test_appnp_with_edge_weights_equals_pyg(options, synthetic):
    """Each loop / normalisation option, weighted, on the corner-case graph (Cora's width would
    make every hop carry 2 x 1433 floats for nothing more)."""
    graph = synthetic
    torch.manual_seed(0)
    f = graph.num_features
    pyg = _randomize(_after_linear(f, gnn.APPNP(K=3, alpha=0.2, **options), weighted=True), seed=4)
    with torch.no_grad():
        ref = pyg(graph.x, graph.edge_index, graph.edge_weight)
    model = Model.from_pyg(pyg, output="embedding")
    assert model.conv(0).uses_edge_weight
    for parts in PARTS:
        out = model(graph.x, graph.edge_index, graph.edge_weight, parts=parts, seed=parts)
        assert rel_err(out, ref) <= TOL, (options, graph.name, parts)


@pytest.mark.parametrize("normalization", ["sym", "rw"])
@pytest.mark.parametrize("K", [2, 4])
@pytest.mark.parametrize("weighted", [False, True])
def test_chebconv_equals_pyg_split_over_partitions(normalization, K, weighted, synthetic):
    """ChebConv (lambda_max None: 2) over the out-degree Laplacian without self loops, as K - 1
    rounds, on the corner-case graph (self loops, parallel edges, isolated vertices, weights)."""
    graph = synthetic
    f = graph.num_features
    conv = _randomize(gnn.ChebConv(f, 6, K=K, normalization=normalization), seed=K)
    pyg = gnn.Sequential("x, edge_index, w", [(conv, "x, edge_index, w -> x")]) if weighted else conv
    w = graph.edge_weight if weighted else None
    with torch.no_grad():
        ref = conv(graph.x, graph.edge_index, w)
    model = Model.from_pyg(pyg, output="embedding")
    assert (model.num_layers, model.num_rounds) == (1, K - 1)
    assert model.conv(0).required_stats == ("laplacian_degree",) and model.conv(0).self_loops == "remove"
    for parts in (1, 3, 8):
        out = model(graph.x, graph.edge_index, w, parts=parts, seed=parts)
        assert rel_err(out, ref) <= TOL, (normalization, K, weighted, parts)


def test_chebconv_refuses_a_negative_edge_weight_when_it_runs(synthetic):
    """PyG's lambda_max is 2 x the Laplacian's largest entry, which a negative weight can make an
    off-diagonal one (a global maximum): the layer refuses rather than assume 2."""
    f = synthetic.num_features
    conv = _randomize(gnn.ChebConv(f, 4, K=2), seed=1)
    model = Model.from_pyg(gnn.Sequential("x, edge_index, w", [(conv, "x, edge_index, w -> x")]), output="embedding")
    w = synthetic.edge_weight.clone()
    w[0] = -0.5
    with pytest.raises(ValueError, match="negative edge weight.*lambda_max"):
        model(synthetic.x, synthetic.edge_index, w, parts=2)


def test_tag_and_appnp_rounds_carry_their_columns_per_vertex():
    """K rounds each; only the propagated x travels to the edges, the running sum (TAGConv) or
    x_0 (APPNP) rides in the rows; every round rebuilds from its config (model batching)."""
    from sparkgnn.layers import CONVS, build_conv

    tag = Model.from_pyg(_randomize(gnn.TAGConv(10, 4, K=3)), output="embedding")
    assert (tag.num_layers, tag.num_rounds) == (1, 3)
    assert [(c.in_dim, c.out_dim, c.src_width(False)) for c in tag.conv_list()] == [
        (10, 14, 10),
        (14, 14, 10),
        (14, 4, 10),
    ]
    appnp = Model.from_pyg(_randomize(_after_linear(10, gnn.APPNP(K=2, alpha=0.1))), output="embedding")
    assert [(c.in_dim, c.out_dim, c.src_width(False)) for c in appnp.conv_list()] == [(10, 20, 10), (20, 10, 10)]
    cheb = Model.from_pyg(_randomize(gnn.ChebConv(10, 4, K=3)), output="embedding")
    assert [(c.in_dim, c.out_dim, c.src_width(False)) for c in cheb.conv_list()] == [(10, 24, 10), (24, 4, 10)]
    for conv in tag.conv_list() + appnp.conv_list() + cheb.conv_list():
        assert CONVS.get(conv.kind) is type(conv)
        assert build_conv(conv.config()).config() == conv.config()


def test_first_hop_payload_is_shared_with_a_weightless_gcn_round():
    """A first hop ships the rows times deg^-1/2 exactly as LGConv-style GCN rounds do, so a
    bundle may share that payload; later hops ship a slice of their rows (another key)."""
    from sparkgnn.layers.signatures import payload_key

    appnp = Model.from_pyg(_randomize(_after_linear(10, gnn.APPNP(K=2, alpha=0.1, add_self_loops=False))))
    lg = Model.from_pyg(_randomize(_after_linear(10, gnn.LGConv())))
    first, second = appnp.conv_list()
    assert payload_key(first, False) == payload_key(lg.conv(0), False)
    assert payload_key(second, False) != payload_key(first, False)


@pytest.mark.parametrize("normalize", [True, False])
def test_lgconv_with_edge_weights_equals_pyg(normalize, graph):
    torch.manual_seed(0)
    f = graph.num_features
    pyg = _randomize(_after_linear(f, gnn.LGConv(normalize=normalize), weighted=True), seed=3)
    with torch.no_grad():
        ref = pyg(graph.x, graph.edge_index, graph.edge_weight)
    model = Model.from_pyg(pyg, output="embedding")
    assert model.conv(0).uses_edge_weight
    for parts in PARTS:
        out = model(graph.x, graph.edge_index, graph.edge_weight, parts=parts, seed=parts)
        assert rel_err(out, ref) <= TOL, (normalize, graph.name, parts)


def test_sgconv_runs_as_k_gcn_rounds_with_the_weight_where_rows_are_narrower():
    narrow = Model.from_pyg(_randomize(gnn.SGConv(10, 4, K=3)), output="embedding")
    assert (narrow.num_layers, narrow.num_rounds) == (1, 3)
    assert [c.kind for c in narrow.conv_list()] == ["gcn"] * 3
    assert [(c.in_dim, c.out_dim) for c in narrow.conv_list()] == [(10, 4), (4, 4), (4, 4)]
    wide = Model.from_pyg(_randomize(gnn.SGConv(4, 10, K=2)), output="embedding")
    assert [(c.in_dim, c.out_dim) for c in wide.conv_list()] == [(4, 4), (4, 10)]
    # lin's bias is added once, by the last round
    assert [c.bias is not None for c in narrow.conv_list()] == [False, False, True]


def test_new_kinds_round_trip_through_save_and_load(synthetic, tmp_path):
    """GraphConv, SAGEConv(project=True), LGConv, SGConv, TAGConv, APPNP, EdgeConv and
    TransformerConv rebuild from their JSON spec and state_dict (multi-hop rounds included) and
    give the same rows."""
    f = synthetic.num_features
    cases = ("graphconv_max_nobias", "sage_project", "lgconv", "sgconv_k3", "sgconv_k2_wide_noloops_nobias")
    cases += ("tagconv", "appnp", "edgeconv_mean_mlp", "transformer_concat_beta")
    for case in cases:
        model = Model.from_pyg(_randomize(CONVS[case](f), seed=5), output="embedding")
        model.save(tmp_path / case)
        loaded = Model.load(tmp_path / case)
        assert loaded.describe() == model.describe(), case
        assert loaded.fingerprint() == model.fingerprint(), case
        a = model(synthetic.x, synthetic.edge_index, parts=3)
        b = loaded(synthetic.x, synthetic.edge_index, parts=3)
        assert torch.equal(a, b), case


def test_contract_widths(synthetic):
    """Declared widths are the widths the contract functions actually produce."""
    f = synthetic.num_features
    ei = synthetic.edge_index
    for case, make in sorted(CONVS.items()):
        model = Model.from_pyg(_randomize(make(f)), output="embedding")
        conv = model.conv(0)
        from sparkgnn.layers.base import compute_stats

        stats = compute_stats(conv, ei[0], ei[1], synthetic.edge_weight, synthetic.num_nodes)
        assert set(stats) == set(conv.required_stats)
        for pre in (False, True):
            xs = conv.prepare_src(synthetic.x, stats, pre)
            assert xs.shape == (synthetic.num_nodes, conv.src_width(pre)), case
            xd = conv.prepare_dst(synthetic.x, stats)
            if conv.needs_dst_in_message:
                assert xd.shape == (synthetic.num_nodes, conv.dst_width()), case
            else:
                assert xd is None and conv.dst_width() == 0, case
            e = 10
            m = conv.message(xs[:e], None if xd is None else xd[:e], torch.ones(e), pre)
            assert m.shape == (e, conv.msg_width(pre)), case
            st = conv.aggregator.partial(m, torch.zeros(e, dtype=torch.long), 1)
            assert st.shape == (1, conv.state_width(pre)), case
        if not conv.can_pre_transform:
            assert conv.src_width(True) == conv.src_width(False)


def test_pre_transform_flags():
    f = 10
    flags = {case: Model.from_pyg(make(f)).conv(0).can_pre_transform for case, make in CONVS.items()}
    assert flags["gcn"] and flags["sage_mean"] and flags["gat_concat"] and flags["gin_mlp"]
    # the linear map precedes the (destination-reading) message either way: both modes exact
    assert flags["gatv2_concat"] and flags["resgated"] and flags["le"]
    for case in (
        "sage_max",
        "sage_min_nobias",
        "sage_powermean",
        "sage_var",
        "sage_std",
        "sage_softmax",
        "gin_bn_first",
        "graphconv_max_nobias",
        "graphconv_std",
        "sage_project_max_norm_noroot",
        "lgconv",  # weightless: nothing to transform
    ):
        assert not flags[case], case
    for case in ("graphconv_add", "graphconv_mean", "sage_project", "sgconv_k1", "sgconv_k3"):
        assert flags[case], case
    # key / value before the message either way; hops and EdgeConv's nn ship x
    assert flags["transformer_concat"] and not flags["tagconv"] and not flags["appnp"]
    assert not flags["edgeconv_max"]


def test_propagate_without_edges():
    conv = Model.from_pyg(_randomize(gnn.SAGEConv(4, 3, aggr="max"))).conv(0)
    x = torch.randn(5, 4)
    empty = torch.empty(0, dtype=torch.long)
    out = propagate(conv, x, empty, empty, parts=3)
    ref = conv.update(x, torch.zeros(5, 4), {}, False)
    assert torch.allclose(out, ref)
