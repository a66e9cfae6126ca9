"""Model.from_pyg(encoder, decoder=...): the decoder is saved with the model (JSON + weights_only
tensors), is part of its fingerprint, scores pairs like PyG, and must read the encoder's width."""

import pytest
import torch
from test_pyg_decoders import WIDTH, ConcatMLP, Dot
from torch_geometric.nn import GraphSAGE
from torch_test_graphs import randomize, rel_err

from sparkgnn import Model
from sparkgnn.errors import UnsupportedModelError


def test_decoder_saves_loads_and_scores_like_pyg(tmp_path, synthetic):
    encoder = randomize(GraphSAGE(synthetic.num_features, 32, num_layers=2, out_channels=WIDTH), seed=1)
    decoder = randomize(ConcatMLP(), seed=2)
    model = Model.from_pyg(encoder, output="embedding", decoder=decoder)
    assert model.spec["decoder"]["kind"] == "mlp"
    model.save(tmp_path / "m")
    loaded = Model.load(tmp_path / "m")
    assert loaded.fingerprint() == model.fingerprint() != Model.from_pyg(encoder, output="embedding").fingerprint()
    with torch.no_grad():
        z = encoder(synthetic.x, synthetic.edge_index)
        src, dst = synthetic.edge_index
        expected = decoder(z[src], z[dst])
    h = loaded(synthetic.x, synthetic.edge_index)
    assert rel_err(loaded.score(h[src], h[dst]), expected) < 1e-5


def test_decoder_width_must_match_the_encoder(synthetic):
    encoder = GraphSAGE(synthetic.num_features, 32, num_layers=2, out_channels=WIDTH + 1)
    with pytest.raises(UnsupportedModelError, match=f"width {WIDTH} but the model's outputs .* width {WIDTH + 1}"):
        Model.from_pyg(encoder, output="embedding", decoder=ConcatMLP())
    # a parameter-free dot product reads any width
    assert Model.from_pyg(encoder, output="embedding", decoder=Dot()).decoder.kind == "dot"
    with pytest.raises(ValueError, match="has no decoder"):
        Model.from_pyg(encoder).score(torch.zeros(1, 3), torch.zeros(1, 3))
