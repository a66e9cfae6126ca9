"""Aggregation in destination ranges (dl/chunks.py): bounded message memory, same states."""

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch_geometric.nn import GAT, GraphSAGE

from sparkgnn.arrowvec import to_fixed_list
from sparkgnn.dl.chunks import chunked_by_dst, dst_ranges
from sparkgnn.dl.handler import build_handler
from sparkgnn.dl.model_store import register
from sparkgnn.dl.step import local_partial
from sparkgnn.models import Model


def test_ranges_cover_every_destination_once_within_the_edge_bound():
    counts = np.array([0, 3, 1, 0, 9, 2, 2, 0])  # destination 4 alone exceeds the bound
    ranges = list(dst_ranges(counts, max_edges=4))
    assert ranges[0][0] == 0 and ranges[-1][1] == len(counts)
    assert all(a[1] == b[0] and a[3] == b[2] for a, b in zip(ranges, ranges[1:], strict=False))
    assert ranges[-1][3] == counts.sum()
    for d0, d1, e0, e1 in ranges:
        assert e1 - e0 == counts[d0:d1].sum()
        assert e1 - e0 <= 4 or d1 - d0 == 1  # over the bound only for one destination with many edges


def test_one_call_when_the_edges_fit():
    calls = []

    def partial(src, dst, weight, first, num):
        calls.append((first, num))
        return torch.zeros(num, 1)

    chunked_by_dst(partial, torch.arange(5), torch.tensor([0, 1, 1, 2, 0]), None, 3, 4, 1 << 20)
    assert calls == [(0, 3)]


def _graph(num_nodes=60, num_edges=400, seed=0):
    rng = np.random.default_rng(seed)
    src = torch.from_numpy(rng.integers(0, num_nodes, num_edges))
    dst = torch.from_numpy(rng.integers(0, num_nodes - 10, num_edges))  # the last 10 receive nothing
    x = torch.from_numpy(rng.normal(size=(num_nodes, 8)).astype(np.float32))
    return x, src, dst


@pytest.mark.parametrize(
    "module",
    [
        lambda: GAT(8, 6, 2, heads=2),
        lambda: GraphSAGE(8, 6, 2, aggr="max"),
    ],
    ids=["gat", "sage_max"],
)
def test_chunked_states_equal_one_pass(module):
    torch.manual_seed(0)
    model = Model.from_pyg(module().eval(), output="embedding")
    conv = model.conv(0)
    x, src, dst = _graph()
    with torch.no_grad():
        src_all = conv.prepare_src(x, {}, False)
        dst_pay = conv.prepare_dst(x, {}) if conv.dst_width() else None
        whole = local_partial(conv, src_all, dst_pay, src, dst, None, len(x), False, chunk_bytes=1 << 40)
        chunked = local_partial(conv, src_all, dst_pay, src, dst, None, len(x), False, chunk_bytes=2_000)
    assert chunked.shape == whole.shape
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=1e-6)


def test_the_step_honours_the_chunk_size_in_its_header(tmp_path):
    torch.manual_seed(0)
    model = Model.from_pyg(GAT(8, 6, 2, heads=2).eval(), output="embedding")
    fingerprint = register(model, str(tmp_path))
    handler = build_handler(str(tmp_path), threads=1)
    x, src, dst = _graph()
    tables = {
        "own": pa.table({"h": to_fixed_list(x.numpy())}),
        "edges": pa.table({"src": src.numpy(), "dst": dst.numpy()}),
    }
    header = {"op": "layer_step", "model": fingerprint, "layer": 0, "aggregate": "edges", "emit": "none"}
    _, one = handler(header, tables)
    _, chunked = handler({**header, "message_chunk_bytes": 2_000}, tables)
    np.testing.assert_allclose(
        np.stack(chunked["own"].column("h").to_numpy(zero_copy_only=False)),
        np.stack(one["own"].column("h").to_numpy(zero_copy_only=False)),
        rtol=1e-6,
        atol=1e-6,
    )
