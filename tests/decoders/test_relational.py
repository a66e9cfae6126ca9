"""decoders/relational.py: DistMult and TransE rebuild from their configs, score by index or name,
bind to one relation, and refuse relations they do not have; the other kinds refuse a relation."""

import pytest
import torch

from sparkgnn.decoders import DotDecoder, build_decoder
from sparkgnn.decoders.relational import DistMultDecoder, TransEDecoder


def _decoder(kind: str):
    cls = DistMultDecoder if kind == "distmult" else TransEDecoder
    decoder = cls(in_dim=4, num_relations=3, relations=["a", "b", "c"])
    decoder.rel_emb.data = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    return decoder


@pytest.mark.parametrize("kind", ["distmult", "transe"])
def test_config_rebuilds_and_formula_holds(kind):
    decoder = _decoder(kind)
    rebuilt = build_decoder(decoder.config())
    rebuilt.load_state_dict(decoder.state_dict())
    h_src, h_dst = torch.randn(6, 4), torch.randn(6, 4)
    rel = torch.tensor([0, 1, 2, 2, 1, 0])
    rows = decoder.rel_emb[rel]
    expected = (h_src * rows * h_dst).sum(-1) if kind == "distmult" else -(h_src + rows - h_dst).norm(p=2, dim=-1)
    assert torch.allclose(rebuilt(h_src, h_dst, rel), expected, atol=1e-6)
    assert torch.equal(decoder(h_src, h_dst, ["a", "b", "c", "c", "b", "a"]), decoder(h_src, h_dst, rel))
    bound = decoder.bind("b")
    assert bound.config()["relation"] == 1 and torch.equal(bound(h_src, h_dst), decoder(h_src, h_dst, [1] * 6))


def test_bad_relations_and_options_are_refused():
    decoder = _decoder("distmult")
    with pytest.raises(ValueError, match="unknown relation 'd'"):
        decoder.bind("d")
    with pytest.raises(ValueError, match="relation 3 is out of range"):
        decoder(torch.zeros(1, 4), torch.zeros(1, 4), [3])
    with pytest.raises(ValueError, match="norm p must be 1 or 2"):
        TransEDecoder(in_dim=4, num_relations=1, p=3)
    with pytest.raises(ValueError, match="needs num_relations >= 1"):
        DistMultDecoder(in_dim=4, num_relations=0)
    with pytest.raises(ValueError, match="the dot decoder takes no relation"):
        DotDecoder()(torch.zeros(1, 4), torch.zeros(1, 4), [0])
