"""A user's workflow, step 1: train a 2-layer GraphSAGE on Cora in plain PyTorch Geometric, then
hand it to sparkgnn with Model.from_pyg(...).save(...). Also records PyG's own test accuracy and
predictions so the demo can compare them with the Spark output.

    python examples/train_cora_sage.py --graph data/cora --model-out data/models/cora_sage
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch
from torch_geometric.nn import GraphSAGE

from sparkgnn.graph import read_graph_dir
from sparkgnn.models import Model


def train(data, hidden: int, epochs: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    x = torch.from_numpy(data.x)
    edge_index = data.edge_index_torch()
    y = torch.from_numpy(data.y)
    train_mask = torch.from_numpy(data.mask("train"))
    model = GraphSAGE(x.shape[1], hidden, num_layers=2, out_channels=int(y.max()) + 1, dropout=0.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for _ in range(epochs):
        model.train()
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x, edge_index)[train_mask], y[train_mask])
        loss.backward()
        optimizer.step()
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", required=True)
    parser.add_argument("--model-out", required=True)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    data = read_graph_dir(args.graph)
    model = train(data, args.hidden, args.epochs, args.seed)
    with torch.no_grad():
        pred = model(torch.from_numpy(data.x), data.edge_index_torch()).argmax(dim=1).numpy()
    test = data.mask("test")
    accuracy = float((pred[test] == data.y[test]).mean())
    Model.from_pyg(model).save(args.model_out)
    report = {"pyg_test_accuracy": accuracy, "test_nodes": int(test.sum())}
    with open(os.path.join(args.model_out, "pyg_reference.json"), "w") as fh:
        json.dump(report, fh)
    np.save(os.path.join(args.model_out, "pyg_pred.npy"), np.stack([data.ids, pred]))
    print(f"trained GraphSAGE in PyG: test accuracy {accuracy:.4f} on {int(test.sum())} nodes -> {args.model_out}")


if __name__ == "__main__":
    main()
