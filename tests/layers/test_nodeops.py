"""LayerNormOp and NormalizeOp: equal to PyTorch's LayerNorm / F.normalize on each row, rebuilt from
their config (save/load), refuse a wrong width, and are row-wise (a row's result does not depend
on the other rows, so the DL step may run them on destination ranges)."""

import pytest
import torch
import torch.nn.functional as F

from sparkgnn.layers.gcn import GCNLayer
from sparkgnn.layers.nodeops import LayerNormOp, NodeOpStack, NormalizeOp, build_node_op
from sparkgnn.layers.rowwise import rows_independent


def _layernorm_pair(affine, bias):
    ref = torch.nn.LayerNorm(6, eps=1e-4, elementwise_affine=affine, bias=bias)
    op = LayerNormOp(6, eps=1e-4, affine=affine, bias=bias)
    with torch.no_grad():
        if affine:
            ref.weight.normal_()
            op.weight.copy_(ref.weight)
        if affine and bias:
            ref.bias.normal_()
            op.bias.copy_(ref.bias)
    return ref, op


@pytest.mark.parametrize(("affine", "bias"), [(True, True), (True, False), (False, False)])
def test_layernorm_equals_torch_and_rebuilds(affine, bias):
    torch.manual_seed(0)
    ref, op = _layernorm_pair(affine, bias)
    x = torch.randn(50, 6) * 3 + 1
    assert torch.equal(op(x), ref(x))
    rebuilt = build_node_op(op.config())
    rebuilt.load_state_dict(op.state_dict())
    assert rebuilt.config() == op.config() and torch.equal(rebuilt(x), ref(x))
    with pytest.raises(ValueError, match="layernorm expects width 6, got 5"):
        op.out_dim(5)


@pytest.mark.parametrize("p", [2.0, 1.0, 3.5])
def test_normalize_equals_torch_and_rebuilds(p):
    x = torch.randn(40, 7)
    x[3] = 0.0  # a zero row divides by eps, as F.normalize does
    op = NormalizeOp(p=p, eps=1e-12)
    assert torch.equal(op(x), F.normalize(x, p=p, dim=-1))
    assert torch.equal(build_node_op(op.config())(x), op(x))
    with pytest.raises(ValueError, match="p > 0"):
        NormalizeOp(p=0.0)


def test_new_ops_are_row_wise():
    _, layernorm = _layernorm_pair(True, True)
    post = NodeOpStack(ops=[layernorm, NormalizeOp()])
    assert rows_independent(GCNLayer(6, 6), post)
    x = torch.randn(30, 6)
    whole = post(x)
    assert torch.equal(torch.cat([post(x[:11]), post(x[11:])]), whole)
