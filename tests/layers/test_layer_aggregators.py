"""Aggregator properties: single-shot result equals PyG's aggregation modules, and merging
partial states is associative and commutative for ANY split of the edges, any merge order and
grouping (the exactness property the distributed executor relies on)."""

import math
import random

import pytest
import torch
import torch_geometric.nn.aggr as A
import torch_test_graphs as graphs  # noqa: E402
from torch_geometric.utils import softmax as pyg_softmax

from sparkgnn.layers.aggregators import AGGREGATORS, get_aggregator

rel_err = graphs.rel_err
TOL = 1e-5


def _messages(case: str, e: int, f: int, g: torch.Generator) -> torch.Tensor:
    m = torch.randn(e, f, generator=g)
    if case in ("powermean2", "powermean_learn"):
        m = m.abs() * 2  # power means are meant for non-negative messages
    return m


# name -> (aggregator kwargs, message width, single-shot PyG reference or None)
def _pyg_softmax_heads(m, index, num, heads):
    logit, val = m[:, :heads], m[:, heads:].view(m.shape[0], heads, -1)
    alpha = pyg_softmax(logit, index, num_nodes=num)
    out = torch.zeros(num, heads, val.shape[-1]).index_add_(0, index, alpha.unsqueeze(-1) * val)
    return out.view(num, -1)


def _pyg_powermean_learn(m, index, num):
    agg = A.PowerMeanAggregation(learn=True, channels=m.shape[1])
    with torch.no_grad():
        agg.p.copy_(torch.linspace(0.5, 3.0, m.shape[1]))
    return agg(m, index, dim_size=num), agg.p.detach().tolist()


CASES = {
    "sum": ({}, 6, lambda m, i, n: A.SumAggregation()(m, i, dim_size=n)),
    "mean": ({}, 6, lambda m, i, n: A.MeanAggregation()(m, i, dim_size=n)),
    "max": ({}, 6, lambda m, i, n: A.MaxAggregation()(m, i, dim_size=n)),
    "min": ({}, 6, lambda m, i, n: A.MinAggregation()(m, i, dim_size=n)),
    "var": ({}, 6, lambda m, i, n: A.VarAggregation()(m, i, dim_size=n)),
    "std": ({}, 6, lambda m, i, n: A.StdAggregation()(m, i, dim_size=n)),
    "powermean2": ({"p": 2.0}, 6, lambda m, i, n: A.PowerMeanAggregation(p=2.0)(m, i, dim_size=n)),
    "powermean1": ({"p": 1.0}, 6, lambda m, i, n: A.PowerMeanAggregation(p=1.0)(m, i, dim_size=n)),
    "powermean_learn": (None, 6, None),  # p per channel, taken from a learnable PyG module
    "softmax": ({"heads": 3}, 3 + 3 * 4, lambda m, i, n: _pyg_softmax_heads(m, i, n, 3)),
}


def _setup(case, seed=0, e=600, num=80):
    g = torch.Generator().manual_seed(seed)
    kwargs, width, ref_fn = CASES[case]
    m = _messages(case, e, width, g)
    # destinations 0..num-11 only: the last 10 rows never receive a message
    index = torch.randint(0, num - 10, (e,), generator=g)
    index[:200] = 3  # one heavy destination
    if case == "powermean_learn":
        ref, p = _pyg_powermean_learn(m, index, num)
        agg = get_aggregator("powermean", p=p, transform=True)
    else:
        name = "powermean" if case.startswith("powermean") else case
        agg = get_aggregator(name, **kwargs)
        ref = ref_fn(m, index, num)
    return agg, m, index, num, ref


def _split_partials(agg, m, index, num, parts, g):
    """Random split into `parts`; each part reduces over the destinations it touches (compact
    local ids), as a partition would. Returns a list of (states, global row ids)."""
    assign = torch.randint(0, parts, (m.shape[0],), generator=g)
    out = []
    for p in range(parts):
        sel = (assign == p).nonzero().view(-1)
        if sel.numel() == 0:
            continue
        uniq, local = torch.unique(index[sel], return_inverse=True)
        out.append((agg.partial(m[sel], local, uniq.numel()), uniq))
    return out


def _merge_random_tree(agg, pieces, num, rnd: random.Random):
    """Merge (states, rows) pieces in a random order and random grouping until one remains."""
    pieces = list(pieces)
    while len(pieces) > 1:
        rnd.shuffle(pieces)
        k = rnd.randint(2, min(4, len(pieces)))
        group, pieces = pieces[:k], pieces[k:]
        rows = torch.unique(torch.cat([r for _, r in group]))
        pos = {int(r): i for i, r in enumerate(rows)}
        states = torch.cat([s for s, _ in group])
        idx = torch.tensor([pos[int(r)] for _, rr in group for r in rr], dtype=torch.long)
        pieces.append((agg.merge(states, idx, rows.numel()), rows))
    states, rows = pieces[0]
    return agg.merge(states, rows, num)


def test_registry_names():
    assert {"sum", "mean", "max", "min", "softmax", "powermean", "var", "std"} <= set(AGGREGATORS)
    for name, cls in AGGREGATORS.items():
        assert cls.name == name
    assert get_aggregator("sum").linear and get_aggregator("mean").linear
    assert not get_aggregator("max").linear and not get_aggregator("softmax", heads=2).linear
    with pytest.raises(ValueError, match="unknown aggregator"):
        get_aggregator("lstm")


@pytest.mark.parametrize("case", sorted(CASES))
def test_single_shot_matches_pyg(case):
    agg, m, index, num, ref = _setup(case)
    state = agg.partial(m, index, num)
    assert state.dtype == torch.float32
    assert state.shape == (num, agg.state_width(m.shape[1]))
    out = agg.finalize(state)
    assert rel_err(out, ref) <= TOL
    # rows nobody indexed hold the identity state
    ident = agg.identity(10, m.shape[1])
    assert torch.equal(state[-10:], ident)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("parts", [1, 2, 7, 31])
def test_merge_any_split_any_order(case, parts):
    agg, m, index, num, ref = _setup(case, seed=parts)
    single = agg.finalize(agg.partial(m, index, num))
    g = torch.Generator().manual_seed(100 + parts)
    for trial in range(3):
        pieces = _split_partials(agg, m, index, num, parts, g)
        merged = _merge_random_tree(agg, pieces, num, random.Random(trial))
        assert merged.shape == (num, agg.state_width(m.shape[1]))
        assert rel_err(agg.finalize(merged), single) <= TOL
        assert rel_err(agg.finalize(merged), ref) <= TOL


@pytest.mark.parametrize("case", sorted(CASES))
def test_merge_associative_commutative_identity(case):
    agg, m, index, num, _ = _setup(case, seed=3)
    thirds = torch.chunk(torch.randperm(m.shape[0], generator=torch.Generator().manual_seed(5)), 3)
    a, b, c = (agg.partial(m[t], index[t], num) for t in thirds)
    rows = torch.arange(num)

    def merge(*states):
        return agg.merge(torch.cat(states), rows.repeat(len(states)), num)

    left = agg.finalize(merge(merge(a, b), c))
    right = agg.finalize(merge(a, merge(b, c)))
    swapped = agg.finalize(merge(c, merge(b, a)))
    flat = agg.finalize(merge(b, c, a))
    for other in (right, swapped, flat):
        assert rel_err(other, left) <= TOL
    ident = agg.identity(num, m.shape[1])
    assert rel_err(agg.finalize(merge(a, ident)), agg.finalize(a)) <= TOL
    assert torch.equal(agg.finalize(merge(ident, ident)), agg.finalize(ident))


def test_softmax_merge_is_overflow_safe():
    agg = get_aggregator("softmax", heads=1)
    m = torch.tensor([[500.0, 1.0], [-500.0, 3.0], [100.0, 2.0]])
    idx = torch.zeros(3, dtype=torch.long)
    parts = [agg.partial(m[i : i + 1], idx[:1], 1) for i in range(3)]
    merged = agg.merge(torch.cat(parts), torch.zeros(3, dtype=torch.long), 1)
    out = agg.finalize(merged)
    assert torch.isfinite(out).all() and math.isclose(out.item(), 1.0, rel_tol=1e-6)


def test_empty_rows_finalize_like_pyg():
    m = torch.randn(4, 3)
    idx = torch.tensor([0, 0, 2, 2])
    for name, mod in [
        ("max", A.MaxAggregation()),
        ("min", A.MinAggregation()),
        ("mean", A.MeanAggregation()),
        ("var", A.VarAggregation()),
        ("std", A.StdAggregation()),
    ]:
        agg = get_aggregator(name)
        assert torch.equal(agg.finalize(agg.partial(m, idx, 4))[1], mod(m, idx, dim_size=4)[1])
    pm = get_aggregator("powermean", p=3.0)
    ref = A.PowerMeanAggregation(p=3.0)(m.abs(), idx, dim_size=4)
    assert rel_err(pm.finalize(pm.partial(m.abs(), idx, 4)), ref) <= TOL
