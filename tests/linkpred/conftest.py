"""A small graph and a SAGE encoder with decoders, saved once per module that asks (Spark tests)."""

import os
import sys

import pytest
import torch
from linkpred_helpers import RELATIONS, ConcatMLP, DistMult, Dot

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "spark_jobs"))


@pytest.fixture(scope="module")
def linkpred_case(tmp_path_factory):
    """(root, graph dir, GraphData, PyG encoder, {name: (PyG decoder, saved model dir)})."""
    from torch_geometric.nn import GraphSAGE

    from sparkgnn import Model
    from sparkgnn.datasets.synthetic import synthetic_graph
    from sparkgnn.graph import write_graph_dir

    root = tmp_path_factory.mktemp("linkpred")
    data = synthetic_graph(240, 1200, 8, num_classes=3, seed=4)
    write_graph_dir(data, str(root / "graph"))
    torch.manual_seed(0)
    encoder = GraphSAGE(8, 16, num_layers=2, out_channels=6).eval()
    models = {}
    for name, decoder in (("mlp", ConcatMLP(6).eval()), ("dot", Dot())):
        path = str(root / f"model_{name}")
        Model.from_pyg(encoder, output="embedding", decoder=decoder).save(path)
        models[name] = (decoder, path)
    distmult = DistMult(len(RELATIONS), 6)
    path = str(root / "model_distmult")
    Model.from_pyg(encoder, output="embedding", decoder=distmult, relations=RELATIONS).save(path)
    models["distmult"] = (distmult, path)
    return root, str(root / "graph"), data, encoder, models
