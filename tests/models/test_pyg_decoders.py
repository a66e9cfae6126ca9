"""models/pyg_decoders.py: PyG decoder modules traced into sparkgnn decoders equal them (float32, 1e-5)."""

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import MLP
from torch_test_graphs import randomize, rel_err

from sparkgnn.decoders import CosineDecoder, DotDecoder, MLPDecoder
from sparkgnn.errors import UnsupportedModelError
from sparkgnn.models.pyg_decoders import decoder_from_pyg

WIDTH = 16


class Dot(torch.nn.Module):
    def forward(self, h_src, h_dst):
        return (h_src * h_dst).sum(dim=-1)


class DotSigmoid(torch.nn.Module):
    def forward(self, h_src, h_dst, sigmoid=True):
        score = (h_src * h_dst).sum(-1)
        return score.sigmoid() if sigmoid else score


class Cosine(torch.nn.Module):
    def forward(self, h_src, h_dst):
        return F.cosine_similarity(h_src, h_dst, dim=-1)


class ConcatMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = MLP([2 * WIDTH, 32, 1], norm=None)

    def forward(self, h_src, h_dst):
        return self.mlp(torch.cat([h_src, h_dst], dim=-1)).squeeze(-1)


class HadamardMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1 = torch.nn.Linear(WIDTH, 8)
        self.lin2 = torch.nn.Linear(8, 1)

    def forward(self, h_src, h_dst):
        h = self.lin1(h_src * h_dst).relu()
        h = F.dropout(h, p=0.5, training=self.training)
        return self.lin2(h).view(-1)


class DiffMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Sequential(torch.nn.Linear(WIDTH, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def forward(self, h_src, h_dst):
        return torch.sigmoid(self.lin(h_src - h_dst).squeeze(-1))


class OneSided(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, h_src, h_dst):
        return (self.lin(h_src) * h_dst).sum(-1)


class NoReduction(torch.nn.Module):
    def forward(self, h_src, h_dst):
        return h_src * h_dst


@pytest.mark.parametrize(
    ("module", "kind"),
    [
        (Dot(), DotDecoder),
        (DotSigmoid(), DotDecoder),
        (Cosine(), CosineDecoder),
        (ConcatMLP(), MLPDecoder),
        (HadamardMLP(), MLPDecoder),
        (DiffMLP(), MLPDecoder),
    ],
    ids=["dot", "dot-sigmoid", "cosine", "mlp-concat", "mlp-hadamard", "mlp-diff"],
)
def test_traced_decoder_equals_pyg(module, kind):
    module = randomize(module, seed=3)
    g = torch.Generator().manual_seed(1)
    h_src, h_dst = torch.randn(200, WIDTH, generator=g), torch.randn(200, WIDTH, generator=g)
    decoder = decoder_from_pyg(module)
    assert isinstance(decoder, kind)
    with torch.no_grad():
        expected = module(h_src, h_dst)
    got = decoder(h_src, h_dst)
    assert got.shape == (200,)
    assert rel_err(got, expected) < 1e-5


def test_mlp_decoder_knows_its_width():
    assert decoder_from_pyg(ConcatMLP()).in_dim == WIDTH
    assert decoder_from_pyg(HadamardMLP()).in_dim == WIDTH
    assert decoder_from_pyg(Dot()).in_dim is None


@pytest.mark.parametrize(
    ("module", "words"),
    [(OneSided(), "no transform of one side alone"), (NoReduction(), "one score per pair")],
    ids=["one-sided", "no-reduction"],
)
def test_unsupported_decoders_are_refused_in_one_line(module, words):
    with pytest.raises(UnsupportedModelError) as info:
        decoder_from_pyg(module)
    message = str(info.value)
    assert words in message and "\n" not in message
