"""decoders/per_relation.py: a {relation: decoder} container converted from a PyG ModuleDict or dict
scores each relation as that relation's PyG module does, rebuilds from its config and weights, and
refuses bad members and unknown relations in one line."""

import pytest
import torch

from sparkgnn.decoders import PerRelationDecoder, build_decoder
from sparkgnn.errors import UnsupportedModelError
from sparkgnn.models.pyg_decoders import decoder_from_pyg


class ConcatMLP(torch.nn.Module):
    def __init__(self, width: int, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.lin1, self.lin2 = torch.nn.Linear(2 * width, 5), torch.nn.Linear(5, 1)

    def forward(self, h_src, h_dst):
        return self.lin2(self.lin1(torch.cat([h_src, h_dst], dim=-1)).relu()).squeeze(-1)


class HadamardMLP(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        torch.manual_seed(7)
        self.lin = torch.nn.Linear(width, 1)

    def forward(self, h_src, h_dst):
        return self.lin(h_src * h_dst).view(-1).sigmoid()


class Dot(torch.nn.Module):
    def forward(self, h_src, h_dst):
        return (h_src * h_dst).sum(dim=-1)


def _pyg_members() -> torch.nn.ModuleDict:
    return torch.nn.ModuleDict(
        {"a__likes__b": ConcatMLP(4, 1), "b__likes__a": ConcatMLP(4, 2), "a__knows__a": HadamardMLP(4), "cites": Dot()}
    )


def test_module_dict_converts_to_members_equal_to_pyg_per_relation():
    pyg = _pyg_members()
    decoder = decoder_from_pyg(pyg)
    assert isinstance(decoder, PerRelationDecoder)
    assert decoder.relations == ("a__likes__b", "b__likes__a", "a__knows__a", "cites")
    assert [decoder.member(k).kind for k in decoder.relations] == ["mlp", "mlp", "mlp", "dot"]
    assert not decoder.inner_product  # mixed members: no vector index for the container
    h_src, h_dst = torch.randn(9, 4), torch.randn(9, 4)
    for key, module in pyg.items():
        with torch.no_grad():
            expected = module(h_src, h_dst)
        assert torch.allclose(decoder(h_src, h_dst, key), expected, rtol=1e-5, atol=1e-6)
        assert torch.allclose(decoder.member(key)(h_src, h_dst), expected, rtol=1e-5, atol=1e-6)
    # one relation per pair: each pair scored by its own relation's member
    rel = ["a__likes__b", "cites", "b__likes__a"] * 3
    with torch.no_grad():
        expected = torch.stack([pyg[r](h_src[i : i + 1], h_dst[i : i + 1])[0] for i, r in enumerate(rel)])
    assert torch.allclose(decoder(h_src, h_dst, rel), expected, rtol=1e-5, atol=1e-6)


def test_a_dict_keyed_by_edge_types_converts_and_rebuilds_from_config_and_weights():
    pyg = {("a", "likes", "b"): ConcatMLP(4, 3), ("a", "knows", "a"): Dot()}
    decoder = decoder_from_pyg(pyg)
    assert decoder.relations == ("a__likes__b", "a__knows__a")
    assert decoder.inner_product is False
    rebuilt = build_decoder(decoder.config())
    assert all(not p.any() for p in rebuilt.parameters())  # weights zero until the state_dict is loaded
    rebuilt.load_state_dict(decoder.state_dict(), strict=True)
    names = ("0.weight", "0.bias", "2.weight", "2.bias")
    assert set(decoder.state_dict()) == {f"members.a__likes__b.head.ops.{k}" for k in names}
    h_src, h_dst = torch.randn(5, 4), torch.randn(5, 4)
    for key in decoder.relations:
        assert torch.equal(rebuilt(h_src, h_dst, key), decoder(h_src, h_dst, key))
    # the approximate top-k takes a container only when every member is an inner product
    from sparkgnn.linkpred.approx import check_approx_decoder

    check_approx_decoder(
        build_decoder({"kind": "per_relation", "members": {"r": {"kind": "dot"}, "s": {"kind": "cosine"}}})
    )
    with pytest.raises(ValueError, match="the model's decoder is per_relation"):
        check_approx_decoder(decoder)


def test_unknown_relations_and_bad_members_are_refused_in_one_line():
    decoder = decoder_from_pyg(_pyg_members())
    h = torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"no member for relation b__cites__b \(it has a__likes__b, "):
        decoder(h, h, "b__cites__b")
    with pytest.raises(ValueError, match="give the relation"):
        decoder(h, h)
    with pytest.raises(ValueError, match="relation a__likes__b: the mlp decoder reads node outputs of width 4"):
        decoder.check_width(5)
    with pytest.raises(ValueError, match="search vectors are its members'"):
        decoder.search_vectors(h)
    distmult = build_decoder({"kind": "distmult", "in_dim": 4, "num_relations": 2})
    with pytest.raises(ValueError, match="member 'r' of a per_relation decoder is a distmult decoder"):
        PerRelationDecoder(members={"r": distmult})
    with pytest.raises(ValueError, match="needs members"):
        PerRelationDecoder(members={})
    with pytest.raises(ValueError, match="member key must be an edge type"):
        PerRelationDecoder(members={"a.b": build_decoder({"kind": "dot"})})
    with pytest.raises(UnsupportedModelError, match=r"decoder\['bad'\] \(Twice\): forward\(\)"):
        decoder_from_pyg({"bad": Twice()})
    with pytest.raises(UnsupportedModelError, match="a dict of decoders names its own"):
        decoder_from_pyg({"r": Dot()}, relations=["r"])


class Twice(torch.nn.Module):
    def forward(self, h_src, h_dst):
        return (2 * h_src * h_dst).sum(dim=-1)
