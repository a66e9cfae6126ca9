"""models/pyg_relational.py: PyG's DistMult and TransE decoders (rgcn_link_pred.py's way, or on the
pair's outputs) convert to per-relation decoders equal to them (1e-5); they save with the model
and score named relations; other three-input decoders are refused in one line."""

import pytest
import torch
from torch.nn import Parameter
from torch_geometric.nn import GraphSAGE
from torch_test_graphs import rel_err

from sparkgnn import Model
from sparkgnn.decoders import DistMultDecoder, TransEDecoder
from sparkgnn.errors import UnsupportedModelError
from sparkgnn.models.pyg_decoders import decoder_from_pyg

WIDTH, RELATIONS = 16, 5


class DistMult(torch.nn.Module):  # PyG's examples/rgcn_link_pred.py DistMultDecoder
    def __init__(self):
        super().__init__()
        self.rel_emb = Parameter(torch.empty(RELATIONS, WIDTH))
        torch.nn.init.xavier_uniform_(self.rel_emb)

    def forward(self, z, edge_index, edge_type):
        z_src, z_dst = z[edge_index[0]], z[edge_index[1]]
        rel = self.rel_emb[edge_type]
        return torch.sum(z_src * rel * z_dst, dim=1)


class TransE(torch.nn.Module):
    def __init__(self, p: float):
        super().__init__()
        self.rel = torch.nn.Embedding(RELATIONS, WIDTH)
        self.p = p

    def forward(self, z, edge_index, edge_type):
        src, dst = edge_index
        return -((z[src] + self.rel(edge_type)) - z[dst]).norm(p=self.p, dim=-1)


class PairDistMultSigmoid(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rel_emb = Parameter(torch.randn(RELATIONS, WIDTH))

    def forward(self, h_src, h_dst, edge_type):
        return torch.sigmoid((h_src * self.rel_emb[edge_type] * h_dst).sum(-1))


class Scaled(torch.nn.Module):  # not DistMult: a factor the walk does not know
    def __init__(self):
        super().__init__()
        self.rel_emb = Parameter(torch.randn(RELATIONS, WIDTH))

    def forward(self, z, edge_index, edge_type):
        return torch.sum(z[edge_index[0]] * self.rel_emb[edge_type] * z[edge_index[1]] * 2.0, dim=1)


class TwoSidedRel(torch.nn.Module):  # not TransE: the relation added to both sides
    def __init__(self):
        super().__init__()
        self.rel_emb = Parameter(torch.randn(RELATIONS, WIDTH))

    def forward(self, h_src, h_dst, edge_type):
        rel = self.rel_emb[edge_type]
        return -(h_src + rel - (h_dst + rel)).norm(p=2, dim=-1)


def _probe():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(60, WIDTH, generator=g)
    edge_index = torch.randint(0, 60, (2, 300), generator=g)
    return z, edge_index, torch.randint(0, RELATIONS, (300,), generator=g)


@pytest.mark.parametrize(
    ("module", "kind", "pyg_form"),
    [
        (DistMult(), DistMultDecoder, True),
        (TransE(1.0), TransEDecoder, True),
        (TransE(2.0), TransEDecoder, True),
        (PairDistMultSigmoid(), DistMultDecoder, False),
    ],
    ids=["distmult", "transe-l1", "transe-l2", "pair-distmult-sigmoid"],
)
def test_relational_decoder_equals_pyg(module, kind, pyg_form):
    z, edge_index, edge_type = _probe()
    decoder = decoder_from_pyg(module)
    assert isinstance(decoder, kind) and decoder.num_relations == RELATIONS
    h_src, h_dst = z[edge_index[0]], z[edge_index[1]]
    with torch.no_grad():
        expected = module(z, edge_index, edge_type) if pyg_form else module(h_src, h_dst, edge_type)
    assert rel_err(decoder(h_src, h_dst, edge_type), expected) < 1e-5
    # bound to one relation it scores (h_src, h_dst) alone, as the top-k tiles call it
    bound = decoder.bind(3)
    assert rel_err(bound(h_src, h_dst), decoder(h_src, h_dst, torch.full((300,), 3))) < 1e-6


def test_relational_decoder_saves_with_the_model_and_scores_named_relations(tmp_path, synthetic):
    encoder = GraphSAGE(synthetic.num_features, 32, num_layers=2, out_channels=WIDTH).eval()
    module = DistMult()
    names = ["cites", "writes", "reviews", "funds", "likes"]
    model = Model.from_pyg(encoder, output="embedding", decoder=module, relations=names)
    model.save(tmp_path / "m")
    loaded = Model.load(tmp_path / "m")
    assert loaded.fingerprint() == model.fingerprint()
    h = loaded(synthetic.x, synthetic.edge_index)
    src, dst = synthetic.edge_index[:, :40]
    edge_type = torch.arange(40) % RELATIONS
    with torch.no_grad():
        expected = module(encoder(synthetic.x, synthetic.edge_index), torch.stack([src, dst]), edge_type)
    assert rel_err(loaded.score(h[src], h[dst], [names[int(t)] for t in edge_type]), expected) < 1e-5
    with pytest.raises(ValueError, match="unknown relation 'follows'"):
        loaded.score(h[src[:1]], h[dst[:1]], ["follows"])
    with pytest.raises(ValueError, match="relation 5 is out of range"):
        loaded.score(h[src[:1]], h[dst[:1]], [5])
    with pytest.raises(ValueError, match="give one per pair"):
        loaded.score(h[src[:1]], h[dst[:1]])


@pytest.mark.parametrize(
    ("module", "words"),
    [(Scaled(), "not a step of a DistMult"), (TwoSidedRel(), "not a step of a DistMult")],
    ids=["scaled", "relation-on-both-sides"],
)
def test_other_three_input_decoders_are_refused_in_one_line(module, words):
    with pytest.raises(UnsupportedModelError) as info:
        decoder_from_pyg(module)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_relation_names_must_fit_the_table():
    with pytest.raises(UnsupportedModelError, match="relations must be 5 distinct"):
        decoder_from_pyg(DistMult(), relations=["a", "b"])
