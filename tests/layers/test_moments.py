"""The normalized-moments aggregator (OMEGA §6.2): ((1/|N|) sum_u (m_u - mbar)^n)^(1/n), run as two
mergeable passes (the mean, then centred power sums) over the same random partitioning, and as two
Model rounds. PyG has no such aggregation: the reference is tests/moments_reference.py (a per-node
numpy loop in float64, with the float32 tolerance of a root explained there)."""

import numpy as np
import pytest
import torch
from moments_reference import assert_close, assert_moments_close, moments_reference

from sparkgnn.layers.aggregators import AGGREGATORS, get_aggregator
from sparkgnn.layers.base import aggregate_state, propagate
from sparkgnn.layers.phases import PassRound, expand_passes
from sparkgnn.layers.sage import SAGELayer
from sparkgnn.models.model import Model
from sparkgnn.planner.errors import PlanError
from sparkgnn.planner.inputs import parse_layer


def corner_graph(seed=0, n=60, e=500, f=5):
    """Random edges into nodes 0..n-6 (n-5..n-1 isolated: no in-edges), 40 duplicated edges, and
    node n-6 with exactly one in-edge. Features with a non-zero mean and a skew, so centring
    matters and odd moments are not ~0."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (e,), generator=g)
    dst = torch.randint(0, n - 6, (e,), generator=g)
    dup = torch.randint(0, e, (40,), generator=g)
    src = torch.cat([src, src[dup], torch.tensor([3])])
    dst = torch.cat([dst, dst[dup], torch.tensor([n - 6])])
    x = torch.randn(n, f, generator=g).exp() * 2 - 1
    return x, src, dst


def identity_sage(f: int, orders) -> SAGELayer:
    """A SAGE layer whose output IS the aggregate: lin_l = [I I ...] blocks picked apart by the
    identity, no root term, no bias."""
    k = len(orders) if isinstance(orders, list) else 1
    conv = SAGELayer(f, f * k, aggr="moments", aggr_options={"n": orders}, root_weight=False, bias=False)
    with torch.no_grad():
        conv.weight_l.copy_(torch.eye(f * k))
    return conv


@pytest.mark.parametrize("parts", [1, 3, 8])
@pytest.mark.parametrize("n", [2, 3, 4, [2, 3]])
def test_aggregate_equals_reference(n, parts):
    x, src, dst = corner_graph()
    conv = identity_sage(x.shape[1], n)
    out = propagate(conv, x, src, dst, parts=parts, seed=11 * parts).detach().numpy()
    assert_moments_close(out, x.numpy(), src.numpy(), dst.numpy(), n, f"n={n} parts={parts}")
    assert (out[-5:] == 0).all()  # isolated: no in-edges
    assert (out[-6] == 0).all()  # one neighbour: it is its own mean


@pytest.mark.parametrize("parts", [1, 3, 8])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_sage_moments_layer_equals_reference(n, parts):
    x, src, dst = corner_graph(seed=1)
    f, out_dim = x.shape[1], 7
    torch.manual_seed(n)
    conv = SAGELayer(f, out_dim, aggr="moments", aggr_options={"n": n})
    for p in conv.parameters():
        torch.nn.init.normal_(p)
    agg, _ = moments_reference(x.numpy(), src.numpy(), dst.numpy(), n)
    w_l, b, w_r = (t.detach().numpy().astype(np.float64) for t in (conv.weight_l, conv.bias_l, conv.weight_r))
    expected = agg @ w_l.T + b + x.numpy().astype(np.float64) @ w_r.T
    # the agg's own slack, through lin_l (|W| row sums)
    _, slack = moments_reference(x.numpy(), src.numpy(), dst.numpy(), n)
    out = conv(x, torch.stack([src, dst]), parts=parts, seed=parts).detach().numpy()
    assert_close(out, expected, slack @ np.abs(w_l).T, f"n={n} parts={parts}")
    assert not conv.can_pre_transform  # moments are not linear in the messages


def test_partition_independence_any_seed():
    """Two passes over one partitioning: every split and merge order gives the single-shot value
    within float32 summation order."""
    x, src, dst = corner_graph(seed=2)
    conv = identity_sage(x.shape[1], [2, 3])
    whole = propagate(conv, x, src, dst, parts=1).detach()
    for seed in range(6):
        split = propagate(conv, x, src, dst, parts=1 + seed * 3, seed=seed).detach()
        torch.testing.assert_close(split, whole, rtol=1e-4, atol=1e-4)


def test_aggregate_state_finalizes_to_propagate():
    x, src, dst = corner_graph(seed=3)
    conv = identity_sage(x.shape[1], 3)
    state = aggregate_state(conv, x, src, dst)
    assert state.shape == (x.shape[0], conv.aggregator.state_width(x.shape[1]))
    direct = conv.update(x, conv.aggregator.finalize(state), {}, False)
    torch.testing.assert_close(direct, propagate(conv, x, src, dst, parts=1), rtol=0, atol=0)


def test_aggregator_interface():
    agg = get_aggregator("moments", n=[2, 3])
    assert AGGREGATORS.lookup("moments") is type(agg)
    assert agg.phases == 2 and not agg.linear and not agg.invertible and not agg.from_sums
    assert agg.phase(0).name == "mean" and agg.phase(1).name == "rawmoment"
    assert agg.state_width(4) == 2 * 4 + 1 and agg.out_width(4) == 8
    assert get_aggregator("moments", **agg.config()).config() == {"n": [2, 3]}
    assert get_aggregator("moments", n=4).config() == {"n": 4}
    m = torch.randn(5, 4)
    with pytest.raises(NotImplementedError, match="two passes"):
        agg.partial(m, torch.zeros(5, dtype=torch.long), 1)
    with pytest.raises(ValueError, match="no pass 2"):
        agg.phase(2)
    with pytest.raises(ValueError, match="destination means"):
        agg.phase_message(1, m, None)
    for bad in (1, 0, 2.5, True, [], [2, 1], "2"):
        with pytest.raises(ValueError):
            get_aggregator("moments", n=bad)
    # one-pass aggregators are their own only pass
    mean = get_aggregator("mean")
    assert mean.phases == 1 and mean.phase(0) is mean


def test_rawmoment_signed_root_and_merge():
    """rawmoment alone: the moment about zero; odd orders keep the sign; states add."""
    agg = get_aggregator("rawmoment", n=3)
    m = torch.tensor([[-2.0], [-1.0], [0.5], [4.0]])
    index = torch.tensor([0, 0, 1, 2])
    whole = agg.partial(m, index, 4)
    split = agg.merge(
        torch.cat([agg.partial(m[:2], index[:2], 4), agg.partial(m[2:], index[2:], 4)]),
        torch.tensor([0, 1, 2, 3, 0, 1, 2, 3]),
        4,
    )
    torch.testing.assert_close(split, whole)
    out = agg.finalize(whole).view(-1)
    torch.testing.assert_close(out, torch.tensor([-(4.5 ** (1 / 3)), 0.5, 4.0, 0.0]))


def _spec(layers, posts):
    return {
        "format": "sparkgnn.Model",
        "version": 1,
        "output": "embedding",
        "in_dim": layers[0]["in_dim"],
        "pre": [],
        "convs": layers,
        "post": posts,
    }


def _moments_model(f=5, hidden=6, out=4, seed=0) -> Model:
    layers = [
        {"kind": "sage", "in_dim": f, "out_dim": hidden, "aggr": "moments", "aggr_options": {"n": [2, 3]}},
        {"kind": "sage", "in_dim": hidden, "out_dim": hidden, "aggr": "mean"},
        {"kind": "sage", "in_dim": hidden, "out_dim": out, "aggr": "moments", "aggr_options": {"n": 4}},
    ]
    model = Model(_spec(layers, [[{"op": "activation", "name": "relu"}], [], []]))
    g = torch.Generator().manual_seed(seed)
    model.load_state_dict({k: torch.randn(v.shape, generator=g) * 0.5 for k, v in model.state_dict().items()})
    return model


def test_model_expands_into_rounds():
    model = _moments_model()
    assert model.num_layers == len(model.layers) == 3 and model.num_rounds == 5  # 2 + 1 + 2 rounds
    assert [type(c).__name__ for c in model.conv_list()] == [
        "PassRound",
        "PassRound",
        "SAGELayer",
        "PassRound",
        "PassRound",
    ]
    assert [c["kind"] for c in model.describe()["convs"]] == ["sage", "sage", "sage"]
    info = model.plan_info()
    assert [i["aggregator"] for i in info] == ["mean", "rawmoment", "mean", "mean", "rawmoment"]
    assert all(i["phases"] == 1 for i in info) and [i["index"] for i in info] == list(range(5))
    # round A carries [h | mean]; round B gets the mean as its destination payload (the AllGather)
    assert info[0]["out_dim"] == 5 + 5 and not info[0]["needs_dst_in_message"] and info[0]["message_scaled"]
    assert info[1]["in_dim"] == 10 and info[1]["needs_dst_in_message"] and info[1]["dst_width"] == 5
    assert info[1]["out_dim"] == 6 and not info[1]["message_scaled"]
    for position, layer in enumerate(info):
        parse_layer(layer, position)  # the planner accepts every round
    # the weights are registered once, under the last round
    names = list(model.state_dict())
    assert all(k.startswith(("convs.1.layer.", "convs.2.", "convs.4.layer.")) for k in names), names
    assert len(model.post_list()[0]) == 0 and len(model.post_list()[1]) == 1


def test_planner_refuses_an_unexpanded_multi_pass_layer():
    conv = SAGELayer(4, 3, aggr="moments", aggr_options={"n": 3})
    with pytest.raises(PlanError, match="2 passes"):
        parse_layer({"index": 0, **conv.plan_info()}, 0)


@pytest.mark.parametrize("parts", [1, 3, 8])
def test_model_forward_through_rounds_equals_layers(parts):
    """Model.forward (the expanded rounds, each its own propagate) equals running each spec layer
    with the two-pass propagate, and the numpy reference."""
    x, src, dst = corner_graph(seed=4)
    model = _moments_model()
    edge_index = torch.stack([src, dst])
    rounds = model(x, edge_index, parts=parts, seed=parts)
    h = x
    for layer, post in zip(model.layers, model.describe()["post"], strict=True):
        h = propagate(layer, h, src, dst, parts=parts, seed=parts + 1)
        h = torch.relu(h) if post else h
    torch.testing.assert_close(rounds, h, rtol=1e-4, atol=1e-4)
    # independent numpy chain
    h_np = x.numpy().astype(np.float64)
    for layer, post in zip(model.layers, model.describe()["post"], strict=True):
        w_l, b, w_r = (t.detach().numpy().astype(np.float64) for t in (layer.weight_l, layer.bias_l, layer.weight_r))
        if layer.aggr == "moments":
            agg, _ = moments_reference(h_np, src.numpy(), dst.numpy(), layer.aggr_options["n"])
        else:
            agg = np.zeros_like(h_np)
            np.add.at(agg, dst.numpy(), h_np[src.numpy()])
            agg /= np.maximum(np.bincount(dst.numpy(), minlength=len(h_np)), 1)[:, None]
        h_np = agg @ w_l.T + b + h_np @ w_r.T
        h_np = np.maximum(h_np, 0) if post else h_np
    np.testing.assert_allclose(rounds.numpy(), h_np, rtol=1e-3, atol=1e-3 * np.abs(h_np).max())


def test_save_load_round_trip(tmp_path):
    x, src, dst = corner_graph(seed=5)
    model = _moments_model(seed=3)
    model.save(tmp_path / "m")
    loaded = Model.load(tmp_path / "m")
    assert loaded.fingerprint() == model.fingerprint()
    assert loaded.describe() == model.describe() and loaded.num_rounds == model.num_rounds
    edge_index = torch.stack([src, dst])
    torch.testing.assert_close(loaded(x, edge_index, parts=3), model(x, edge_index, parts=3), rtol=0, atol=0)


def test_expand_passes_leaves_one_pass_layers_alone():
    conv = SAGELayer(4, 3, aggr="max")
    assert expand_passes(conv) == [conv]
    rounds = expand_passes(SAGELayer(4, 3, aggr="moments"))
    assert [type(r) for r in rounds] == [PassRound, PassRound]
    assert rounds[0].wrapped is rounds[1].wrapped and rounds[0].kind == "sage.moments[1/2]"
