"""decoders/base.py: configs rebuild equal decoders; bad specs and widths are refused."""

import pytest
import torch

from sparkgnn.decoders import MLPDecoder, build_decoder
from sparkgnn.layers.nodeops import ActivationOp, LinearOp, NodeOpStack


def _mlp() -> MLPDecoder:
    lin1, lin2 = LinearOp(12, 5), LinearOp(5, 1)
    g = torch.Generator().manual_seed(0)
    for op in (lin1, lin2):
        op.weight.data = torch.randn(op.weight.shape, generator=g)
        op.bias.data = torch.randn(op.bias.shape, generator=g)
    return MLPDecoder(combine="concat", _head=NodeOpStack(ops=[lin1, ActivationOp("relu"), lin2]), final="sigmoid")


def test_config_and_state_rebuild_the_same_scores():
    decoder = _mlp()
    assert decoder.in_dim == 6
    rebuilt = build_decoder(decoder.config())
    rebuilt.load_state_dict(decoder.state_dict())
    h = torch.randn(10, 6)
    assert torch.equal(rebuilt(h, h.flip(0)), decoder(h, h.flip(0)))


def test_unknown_kind_and_width_are_refused():
    with pytest.raises(ValueError, match="unknown decoder kind 'bilinear'"):
        build_decoder({"kind": "bilinear"})
    with pytest.raises(ValueError, match="width 6 but the node outputs have width 7"):
        _mlp()(torch.randn(3, 7), torch.randn(3, 7))


def test_search_vectors_give_the_raw_score_by_inner_product():
    h_src, h_dst = torch.randn(5, 4), torch.randn(5, 4)
    for kind in ("dot", "cosine"):
        decoder = build_decoder({"kind": kind})
        inner = (decoder.search_vectors(h_src) * decoder.search_vectors(h_dst)).sum(-1)
        assert torch.allclose(inner, decoder.raw(h_src, h_dst), atol=1e-6)
    with pytest.raises(ValueError, match="not an inner product"):
        _mlp().search_vectors(h_src)
