"""The sums path of aggregate=edges runs sums, state, finalize, update and post on destination row
ranges (VERTEX_CHUNK_BYTES) and gives, bit for bit, what one pass over the whole partition gives;
layers whose update or post is not row-wise keep the whole-partition pass.

Widths are multiples of 16 floats: every row then starts 64-byte aligned both in a range's own
buffers and inside a whole-partition tensor, and the dense products (whose kernels depend on the
rows' alignment) give the same bits. Other widths agree within float tolerance (tested too)."""

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch_geometric.nn import GAT, GCN, GIN, GraphSAGE

from sparkgnn.arrowvec import to_fixed_list
from sparkgnn.dl import csr, step
from sparkgnn.dl.step import rows_independent, run_step, vertex_chunk_rows
from sparkgnn.layers.sage import SAGELayer
from sparkgnn.models import Model
from sparkgnn.stat_keys import stat_keys

F = 16
N_OWN, N_MIRROR, E = 40, 30, 500
WHOLE = 1 << 40  # vertex_chunk_bytes that holds any test partition: one pass


def _with_running_stats(module):
    """Non-trivial BatchNorm running statistics, so an eval batch norm is not the identity."""
    g = torch.Generator().manual_seed(5)
    for m in module.modules():
        if isinstance(m, torch.nn.BatchNorm1d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g))
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return module


MODELS = {
    "gcn_weighted": lambda: GCN(F, 32, 1),  # edge weights scale the sums, gcn_degree statistic
    "sage_mean": lambda: GraphSAGE(F, 32, 1),  # sums and counts
    "gin": lambda: GIN(F, 32, 1),
    # node-wise post ops after layer 0: batch norm (eval, running statistics) and relu
    "sage_post_ops": lambda: _with_running_stats(GraphSAGE(F, 32, 2, out_channels=16, norm="batch_norm")),
    "gin_post_ops": lambda: _with_running_stats(GIN(F, 32, 2, out_channels=16, norm="batch_norm")),
}


def _model(name: str) -> Model:
    torch.manual_seed(0)
    return Model.from_pyg(MODELS[name]().eval(), output="embedding")


def _tables(model: Model, mirror: bool, empty_dsts: int, seed: int = 0, pre: bool = False) -> dict:
    conv = model.conv(0)
    rng = np.random.default_rng(seed)
    own = {"h": to_fixed_list(rng.normal(size=(N_OWN, F)).astype(np.float32))}
    for key in stat_keys([conv]):  # gcn_degree_w: this GCN's edge weights count
        own[key] = pa.array(rng.integers(1, 9, N_OWN).astype(np.float32))
    n_src = N_OWN + (N_MIRROR if mirror else 0)
    # destinations N_OWN - empty_dsts .. N_OWN - 1 and a few in the middle receive no edge
    dst = rng.integers(0, N_OWN - empty_dsts, E)
    dst = np.where(np.isin(dst, [3, 4, 17]), 5, dst)
    edges = {"src": rng.integers(0, n_src, E), "dst": dst}
    if conv.uses_edge_weight:
        edges["weight"] = rng.random(E).astype(np.float32)
    tables = {"own": pa.table(own), "edges": pa.table(edges)}
    if mirror:
        tables["mirror"] = pa.table(
            {"p": to_fixed_list(rng.normal(size=(N_MIRROR, conv.src_width(pre))).astype(np.float32))}
        )
    return tables


def _run(model, tables, chunk_bytes: int, with_state: bool, pre: bool = False) -> dict:
    header = {"layer": 0, "aggregate": "edges", "emit": "none", "vertex_chunk_bytes": chunk_bytes}
    if with_state:
        header["with_state"] = True
    if pre:
        header["pre_transform"] = True
    return run_step(model, header, tables)


def _rows_per_call(model, monkeypatch) -> list:
    """Record the rows of every update call of layer 0."""
    conv, calls = model.conv(0), []
    update = conv.update

    def recording(h_dst, agg, stats, pre):
        calls.append(h_dst.shape[0])
        return update(h_dst, agg, stats, pre)

    monkeypatch.setattr(conv, "update", recording)
    return calls


def _row_bytes(model, pre: bool = False) -> int:
    return (1 << 40) // vertex_chunk_rows(model, 0, pre, 1 << 40)


@pytest.mark.parametrize("with_state", [False, True], ids=["no_state", "with_state"])
@pytest.mark.parametrize("mirror", [False, True], ids=["own_only", "mirror"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_row_ranges_equal_one_pass_bit_for_bit(name, mirror, with_state, monkeypatch):
    model = _model(name)
    assert rows_independent(model, 0)
    tables = _tables(model, mirror, empty_dsts=6)
    csr.clear()
    whole = _run(model, tables, WHOLE, with_state)
    calls = _rows_per_call(model, monkeypatch)
    monkeypatch.setattr(step, "VERTEX_CHUNK_MIN_ROWS", 16)  # ranges of 8 rows and more (step.py)
    # (chunk bytes, rows per call): the floor; 21 rows a range; all rows in one range
    for chunk_bytes, sizes in (
        (1, [13, 13, 14]),
        (21 * _row_bytes(model) + 3, [20, 20]),
        (N_OWN * _row_bytes(model), [N_OWN]),
    ):
        calls.clear()
        got = _run(model, tables, chunk_bytes, with_state)
        assert calls == sizes
        assert sorted(got) == sorted(whole)
        for table in whole:
            assert got[table].equals(whole[table]), (table, sizes)
    if with_state and model.conv(0).self_loops == "none":  # GCN gives every node a self loop
        state = np.stack(whole["state"].column("s").to_numpy(zero_copy_only=False))
        assert (state[-6:] == 0).all()  # destinations without edges: the identity state


@pytest.mark.parametrize("name", sorted(MODELS))
def test_single_row_ranges_are_within_tolerance(name, monkeypatch):
    """On ranges of a few rows the dense products pick another kernel (VERTEX_CHUNK_MIN_ROWS):
    close, not necessarily the same bits."""
    model = _model(name)
    tables = _tables(model, mirror=True, empty_dsts=3)
    csr.clear()
    whole = _run(model, tables, WHOLE, True)
    monkeypatch.setattr(step, "VERTEX_CHUNK_MIN_ROWS", 1)
    calls = _rows_per_call(model, monkeypatch)
    got = _run(model, tables, 1, True)
    assert calls == [1] * N_OWN
    for table in whole:
        torch.testing.assert_close(_matrix(got[table]), _matrix(whole[table]), rtol=1e-5, atol=1e-6)


def _matrix(table: pa.Table) -> torch.Tensor:
    return torch.from_numpy(np.stack(table.column(0).to_numpy(zero_copy_only=False)))


def test_ranges_are_balanced_with_no_small_tail():
    for n, rows in ((40, 16), (100, 16), (1000, 7), (5, 16), (16, 16), (17, 16)):
        ranges = step._row_ranges(n, rows)
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
        sizes = [r1 - r0 for r0, r1 in ranges]
        assert max(sizes) <= rows and max(sizes) - min(sizes) <= 1
        if n >= rows:
            assert min(sizes) >= rows // 2


@pytest.mark.parametrize("name", ["gcn_weighted", "gin", "sage_mean"])
def test_row_ranges_with_pre_transform(name, monkeypatch):
    model = _model(name)
    tables = _tables(model, mirror=True, empty_dsts=2, pre=True)
    csr.clear()
    whole = _run(model, tables, WHOLE, True, pre=True)
    monkeypatch.setattr(step, "VERTEX_CHUNK_MIN_ROWS", 16)
    calls = _rows_per_call(model, monkeypatch)
    got = _run(model, tables, 1, True, pre=True)
    assert calls == [13, 13, 14]
    for table in whole:
        assert got[table].equals(whole[table])


def test_the_state_is_kept_only_when_asked(monkeypatch):
    model = _model("sage_mean")
    tables = _tables(model, mirror=True, empty_dsts=0)
    monkeypatch.setattr(step, "VERTEX_CHUNK_MIN_ROWS", 16)
    assert "state" not in _run(model, tables, 1, with_state=False)
    assert _run(model, tables, 1, with_state=True)["state"].num_rows == N_OWN


def test_every_supported_layer_is_row_wise():
    for name in sorted(MODELS):
        model = _model(name)
        assert all(rows_independent(model, layer) for layer in range(model.num_rounds)), name
    torch.manual_seed(0)
    assert rows_independent(Model.from_pyg(GAT(F, 4, 2, heads=2).eval(), output="embedding"), 0)


def test_a_post_op_that_is_not_row_wise_keeps_the_whole_partition(monkeypatch):
    model = _model("sage_post_ops")
    tables = _tables(model, mirror=True, empty_dsts=3)
    csr.clear()
    whole = _run(model, tables, WHOLE, False)
    model.post_list()[0].ops[0].row_wise = False  # e.g. a norm over all rows
    assert not rows_independent(model, 0)
    calls = _rows_per_call(model, monkeypatch)
    monkeypatch.setattr(step, "VERTEX_CHUNK_MIN_ROWS", 1)  # would be 40 ranges if chunked
    got = _run(model, tables, 1, False)
    assert calls == [N_OWN]
    assert got["own"].equals(whole["own"])


def test_an_unchecked_layer_class_keeps_the_whole_partition(monkeypatch):
    class GlobalNormSAGE(SAGELayer):
        """Normalises by a statistic over all destination rows: not row-wise."""

        def update(self, h_dst, agg, stats, pre_transform):
            out = super().update(h_dst, agg, stats, pre_transform)
            return out / out.abs().max()

    model = _model("sage_mean")
    base = model.conv(0)
    conv = GlobalNormSAGE(F, base.out_dim)
    conv.load_state_dict(base.state_dict())
    model.convs[0] = conv
    assert not rows_independent(model, 0)
    tables = _tables(model, mirror=True, empty_dsts=3)
    calls = _rows_per_call(model, monkeypatch)
    monkeypatch.setattr(step, "VERTEX_CHUNK_MIN_ROWS", 1)  # would be 40 ranges if chunked
    got = _run(model, tables, 1, False)
    assert calls == [N_OWN]
    h = torch.from_numpy(np.stack(got["own"].column("h").to_numpy(zero_copy_only=False)))
    assert float(h.abs().max()) == 1.0  # normalised over the whole partition, not per row
