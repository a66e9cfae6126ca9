"""The DL step's sparse sums: own and mirror payloads are multiplied by their own CSR blocks
(A_own @ own + A_mirror @ mirror), never concatenated, and give what one product over the
concatenation [own | mirror] gives."""

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch_geometric.nn import GAT, GCN, GIN, GraphSAGE

from sparkgnn.arrowvec import to_fixed_list
from sparkgnn.dl import csr
from sparkgnn.dl.step import _sparse_sums, local_partial, run_step
from sparkgnn.models import Model
from sparkgnn.stat_keys import stat_keys

F = 7


def _payloads(seed: int, n_own: int, n_mirror: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n_own, F, generator=g), torch.randn(n_mirror, F, generator=g)


def _single_product(src, dst, scale, num_dst, src_all):
    """The previous path: one CSR product over the concatenated payloads."""
    whole = csr.by_destination(src, dst, num_dst)
    values = torch.ones(src.numel()) if scale is None else scale[whole.own.order]
    a = torch.sparse_csr_tensor(whole.own.crow, whole.own.col, values, size=(num_dst, src_all.shape[0]))
    return a @ src_all


def _dense_reference(src, dst, scale, num_dst, src_all):
    s = torch.ones(src.numel(), dtype=torch.float64) if scale is None else scale.double()
    return torch.zeros(num_dst, F, dtype=torch.float64).index_add_(0, dst, src_all.double()[src] * s[:, None]).float()


CASES = {
    # name: (n_own, n_mirror, source range of the edges)
    "mixed": (30, 40, (0, 70)),
    "no_mirror_edges": (30, 40, (0, 30)),
    "only_mirror_edges": (30, 40, (30, 70)),
    "no_mirror_rows": (30, 0, (0, 30)),
}


@pytest.mark.parametrize("scaled", [False, True], ids=["unscaled", "edge_scale"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_split_products_equal_the_single_product(case, scaled):
    csr.clear()
    n_own, n_mirror, (lo, hi) = CASES[case]
    num_dst = 25  # the last 5 destinations receive nothing
    g = torch.Generator().manual_seed(len(case))
    src = torch.randint(lo, hi, (600,), generator=g)
    dst = torch.randint(0, num_dst - 5, (600,), generator=g)
    scale = torch.rand(600, generator=g) if scaled else None
    own, mirror = _payloads(1, n_own, n_mirror)
    src_all = torch.cat([own, mirror])
    entry = csr.by_destination(src, dst, num_dst, split=n_own)
    split = _sparse_sums(entry, scale, num_dst, own, mirror)
    single = _single_product(src, dst, scale, num_dst, src_all)
    torch.testing.assert_close(split, single, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(split, _dense_reference(src, dst, scale, num_dst, src_all), rtol=1e-6, atol=1e-6)
    assert bool((split[-5:] == 0).all())
    if case == "no_mirror_rows":  # emit_partials passes no mirror at all
        torch.testing.assert_close(_sparse_sums(entry, scale, num_dst, own, None), single, rtol=1e-6, atol=1e-6)


MODELS = {
    "gcn_weighted": lambda: GCN(F, 5, 1),  # scaled by the edge weight, sums
    "sage_mean": lambda: GraphSAGE(F, 5, 1),  # sums and counts
    "gin": lambda: GIN(F, 5, 1),
    "sage_max": lambda: GraphSAGE(F, 5, 1, aggr="max"),  # message + partial: concatenates
    "gat": lambda: GAT(F, 4, 1, heads=2),  # needs the destination payload
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_local_partial_with_a_separate_mirror_equals_the_concatenated_payloads(name):
    csr.clear()
    torch.manual_seed(0)
    conv = Model.from_pyg(MODELS[name]().eval(), output="embedding").conv(0)
    n_own, n_mirror = 30, 40
    g = torch.Generator().manual_seed(2)
    src = torch.randint(0, n_own + n_mirror, (500,), generator=g)
    dst = torch.randint(0, n_own - 4, (500,), generator=g)
    weight = torch.rand(500, generator=g) if conv.uses_edge_weight else None
    own, mirror = _payloads(3, n_own, n_mirror)
    degree = {name: torch.arange(1.0, n_own + n_mirror + 1) for name in conv.required_stats}
    own_stats = {name: d[:n_own] for name, d in degree.items()}
    with torch.inference_mode():
        own_src = conv.prepare_src(own, own_stats, False)
        mirror_src = conv.prepare_src(mirror, {name: d[n_own:] for name, d in degree.items()}, False)
        dst_pay = conv.prepare_dst(own, own_stats) if conv.dst_width() else None
        apart = local_partial(conv, own_src, dst_pay, src, dst, weight, n_own, False, mirror=mirror_src)
        joined = local_partial(conv, torch.cat([own_src, mirror_src]), dst_pay, src, dst, weight, n_own, False)
    torch.testing.assert_close(apart, joined, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["gcn_weighted", "sage_mean", "gin"])
def test_the_edges_step_never_concatenates_own_and_mirror_payloads_on_the_sums_path(name, monkeypatch):
    csr.clear()
    torch.manual_seed(0)
    model = Model.from_pyg(MODELS[name]().eval(), output="embedding")
    rng = np.random.default_rng(0)
    n_own, n_mirror = 30, 40
    own = {"h": to_fixed_list(rng.normal(size=(n_own, F)).astype(np.float32))}
    for key in stat_keys([model.conv(0)]):
        own[key] = pa.array(rng.integers(1, 9, n_own).astype(np.float32))
    mirror = rng.normal(size=(n_mirror, F)).astype(np.float32)
    edges = {"src": rng.integers(0, n_own + n_mirror, 400), "dst": rng.integers(0, n_own, 400)}
    if model.conv(0).uses_edge_weight:
        edges["weight"] = rng.random(400).astype(np.float32)
    tables = {"own": pa.table(own), "mirror": pa.table({"p": to_fixed_list(mirror)}), "edges": pa.table(edges)}
    header = {"layer": 0, "aggregate": "edges", "emit": "none"}
    expected = run_step(model, header, tables)["own"]
    cat, rows = torch.cat, []

    def recording_cat(tensors, *args, **kwargs):
        out = cat(tensors, *args, **kwargs)
        rows.append(out.shape[0] if out.dim() else 0)
        return out

    csr.clear()
    monkeypatch.setattr(torch, "cat", recording_cat)
    got = run_step(model, header, tables)["own"]
    assert n_own + n_mirror not in rows
    assert got.equals(expected)
