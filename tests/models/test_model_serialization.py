"""save/load round trip, fingerprints, and clear ModelLoadErrors for missing, corrupt, tampered
or mismatched files."""

import hashlib
import json
import subprocess
import sys

import pytest
import torch
import torch_geometric.nn as gnn

from sparkgnn.errors import ModelLoadError
from sparkgnn.models import Model
from sparkgnn.models.serialization import MANIFEST, WEIGHTS


def _randomize(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(module.named_parameters()) + list(module.named_buffers()):
            if p.is_floating_point():
                p.copy_(
                    torch.rand(p.shape, generator=g) + 0.5
                    if name.endswith("running_var")
                    else torch.randn(p.shape, generator=g) * 0.3
                )
    return module.eval()


MODELS = {
    "gcn": lambda f: gnn.GCN(f, 16, 2, out_channels=5),
    "sage_powermean_bn": lambda f: gnn.GraphSAGE(
        f, 16, 3, aggr=gnn.aggr.PowerMeanAggregation(learn=True), norm="batch_norm"
    ),
    "gin": lambda f: gnn.GIN(f, 16, 2, out_channels=5, train_eps=True),
    "gatv2_resgated_le_seq": lambda f: gnn.Sequential(
        "x, edge_index, edge_weight",
        [
            (gnn.GATv2Conv(f, 4, heads=2, share_weights=True, residual=True), "x, edge_index -> x"),
            torch.nn.ReLU(),
            (gnn.ResGatedGraphConv(8, 8, act=torch.nn.Tanh()), "x, edge_index -> x"),
            (gnn.LEConv(8, 3), "x, edge_index, edge_weight -> x"),
        ],
    ),
    "gat_seq_head": lambda f: gnn.Sequential(
        "x, edge_index",
        [
            (gnn.GATConv(f, 4, heads=3, residual=True), "x, edge_index -> x"),
            torch.nn.ELU(),
            (gnn.SAGEConv(12, 8, aggr="softmax"), "x, edge_index -> x"),
            torch.nn.Linear(8, 3),
        ],
    ),
}


@pytest.fixture(params=sorted(MODELS))
def model(request, synthetic):
    return Model.from_pyg(_randomize(MODELS[request.param](synthetic.num_features)))


def test_round_trip(model, synthetic, tmp_path):
    model.save(tmp_path / "m")
    loaded = Model.load(tmp_path / "m")
    assert loaded.spec == model.spec
    assert json.loads(json.dumps(model.spec)) == model.spec  # JSON-able
    assert loaded.fingerprint() == model.fingerprint()
    assert loaded.plan_info() == model.plan_info()
    a = model(synthetic.x, synthetic.edge_index, parts=3)
    b = loaded(synthetic.x, synthetic.edge_index, parts=3)
    assert torch.equal(a, b)
    assert not loaded.training
    # load also accepts the manifest path itself
    assert Model.load(tmp_path / "m" / MANIFEST).fingerprint() == model.fingerprint()


def test_fingerprint_stable_across_processes(synthetic, tmp_path):
    model = Model.from_pyg(_randomize(MODELS["gat_seq_head"](synthetic.num_features)))
    model.save(tmp_path / "m")
    # a worker loads and fingerprints without torch_geometric or pyspark
    code = (
        "import sys; from sparkgnn.models import Model; "
        "fp = Model.load(sys.argv[1]).fingerprint(); "
        "assert not [m for m in sys.modules if m.startswith(('torch_geometric', 'pyspark'))]; "
        "print(fp)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "m")], check=True, capture_output=True, text=True, timeout=120
    ).stdout.strip()
    assert out == model.fingerprint()
    assert len(out) == 64 and int(out, 16) >= 0


def test_fingerprint_same_for_same_weights_and_changes_with_any_weight(synthetic):
    f = synthetic.num_features
    pyg = _randomize(MODELS["gin"](f))
    a, b = Model.from_pyg(pyg), Model.from_pyg(pyg)
    assert a.fingerprint() == b.fingerprint()
    for name in b.state_dict():
        c = Model.from_pyg(pyg)
        with torch.no_grad():
            c.state_dict()[name].view(-1)[0] += 1e-3
        assert c.fingerprint() != a.fingerprint(), name
    # the spec is part of it too: same weights, other output mode
    assert Model.from_pyg(pyg, output="embedding").fingerprint() != a.fingerprint()


def _saved(tmp_path, synthetic):
    model = Model.from_pyg(_randomize(MODELS["gcn"](synthetic.num_features)))
    path = tmp_path / "m"
    model.save(path)
    return model, path


def test_missing_files(tmp_path, synthetic):
    with pytest.raises(ModelLoadError, match="missing"):
        Model.load(tmp_path / "nowhere")
    _, path = _saved(tmp_path, synthetic)
    (path / WEIGHTS).unlink()
    with pytest.raises(ModelLoadError, match="missing"):
        Model.load(path)


def test_tampered_weights_rejected(tmp_path, synthetic):
    model, path = _saved(tmp_path, synthetic)
    state = torch.load(path / WEIGHTS, weights_only=True)
    state["convs.0.weight"][0, 0] += 1.0
    torch.save(state, path / WEIGHTS)
    with pytest.raises(ModelLoadError, match="checksum"):
        Model.load(path)


def test_corrupt_weights_rejected_even_with_matching_checksum(tmp_path, synthetic):
    _, path = _saved(tmp_path, synthetic)
    garbage = b"not a torch archive"
    (path / WEIGHTS).write_bytes(garbage)
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["weights_sha256"] = hashlib.sha256(garbage).hexdigest()
    (path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ModelLoadError, match="cannot read weights"):
        Model.load(path)


def _edit_spec(path, fn):
    manifest = json.loads((path / MANIFEST).read_text())
    fn(manifest["spec"])
    (path / MANIFEST).write_text(json.dumps(manifest))


def test_spec_shape_mismatch_rejected(tmp_path, synthetic):
    _, path = _saved(tmp_path, synthetic)

    def widen(spec):
        spec["convs"][0]["out_dim"] = 17
        spec["convs"][1]["in_dim"] = 17

    _edit_spec(path, widen)
    with pytest.raises(ModelLoadError, match="do not match the spec"):
        Model.load(path)


def test_spec_option_mismatch_rejected(tmp_path, synthetic):
    """An edit that keeps all tensor shapes (normalize off) is caught by the fingerprint."""
    _, path = _saved(tmp_path, synthetic)

    def no_norm(spec):
        spec["convs"][0].update(normalize=False, add_self_loops=False)

    _edit_spec(path, no_norm)
    with pytest.raises(ModelLoadError, match="fingerprint"):
        Model.load(path)


def test_invalid_spec_rejected(tmp_path, synthetic):
    _, path = _saved(tmp_path, synthetic)
    _edit_spec(path, lambda spec: spec["convs"][0].update(kind="lstm"))
    with pytest.raises(ModelLoadError, match="invalid model spec"):
        Model.load(path)
    (path / MANIFEST).write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        Model.load(path)


def test_weights_file_name_cannot_escape(tmp_path, synthetic):
    _, path = _saved(tmp_path, synthetic)
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["weights_file"] = "../elsewhere.pt"
    (path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ModelLoadError, match="plain file name"):
        Model.load(path)
