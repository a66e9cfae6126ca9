"""decoders/mlp.py: a concatenating MLP's per-node projections score every pair as `raw` does (within
float32 rounding), pair by pair and broadcast over sources x candidates; other heads have none."""

import pytest
import torch

from sparkgnn.decoders import MLPDecoder
from sparkgnn.layers.nodeops import ActivationOp, LinearOp, NodeOpStack


def _randomised(*ops):
    g = torch.Generator().manual_seed(0)
    for op in ops:
        if isinstance(op, LinearOp):
            op.weight.data = torch.randn(op.weight.shape, generator=g)
            if op.bias is not None:
                op.bias.data = torch.randn(op.bias.shape, generator=g)
    return NodeOpStack(ops=list(ops))


@pytest.mark.parametrize(
    ("head", "reduce"),
    [
        (lambda: _randomised(LinearOp(16, 6), ActivationOp("relu"), LinearOp(6, 1)), "squeeze"),
        (lambda: _randomised(LinearOp(16, 6, bias=False), ActivationOp("tanh")), "sum"),
        (lambda: _randomised(LinearOp(16, 1)), "squeeze"),
    ],
)
def test_projections_score_like_the_concatenation(head, reduce):
    decoder = MLPDecoder(combine="concat", _head=head(), reduce=reduce)
    g = torch.Generator().manual_seed(1)
    h_src, h_dst = torch.randn(50, 8, generator=g), torch.randn(50, 8, generator=g)
    with torch.no_grad():
        src_side, _ = decoder.project(h_src)
        _, dst_side = decoder.project(h_dst)
        by_pair = decoder.raw_projected(src_side, dst_side)
        assert by_pair.shape == (50,)
        torch.testing.assert_close(by_pair, decoder.raw(h_src, h_dst), rtol=1e-5, atol=1e-5)
        every = decoder.raw_projected(src_side[:7, None, :], dst_side[None, :, :])  # 7 sources x 50 candidates
        expected = decoder.raw(h_src[:7].repeat_interleave(50, 0), h_dst.repeat(7, 1)).reshape(7, 50)
        torch.testing.assert_close(every, expected, rtol=1e-5, atol=1e-5)


def test_other_heads_have_no_projections():
    g = torch.Generator().manual_seed(2)
    h = torch.randn(4, 8, generator=g)
    for combine in ("hadamard", "diff"):
        decoder = MLPDecoder(combine=combine, _head=_randomised(LinearOp(8, 1)))
        assert decoder.project(h) is None
    relu_first = NodeOpStack(ops=[ActivationOp("relu")])
    no_linear_first = MLPDecoder(combine="concat", in_dim=8, _head=relu_first, reduce="sum")
    assert no_linear_first.project(h) is None
    with pytest.raises(ValueError, match="has no per-node projections"):
        super(MLPDecoder, no_linear_first).raw_projected(h, h)
