"""Shared by the model-class examples in this folder: Cora from the copy sparkgnn ships (no
download), a short PyG training loop, and the hand-over to sparkgnn: Model.from_pyg(model), a check
that the converted model equals the PyG model's eval forward on Cora, and model.save(dir).

Each example defines its model class exactly as PyG's tutorials do and calls `run` with it; every
one is used the same way (`usage`): train and convert it, then run the saved model with Spark.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from sparkgnn.datasets import load_cora
from sparkgnn.models import Model

log = logging.getLogger("examples.models")


def train(model: torch.nn.Module, data, epochs: int, lr: float = 0.01) -> torch.nn.Module:
    """Full-batch training on Cora's train split (cross-entropy; log_softmax outputs are fine too:
    nll of log-probabilities equals cross-entropy of logits up to the log_softmax it applies)."""
    x, edge_index = torch.from_numpy(data.x), data.edge_index_torch()
    y, train_mask = torch.from_numpy(data.y), torch.from_numpy(data.mask("train"))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=5e-4)
    for _ in range(epochs):
        model.train()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x, edge_index)[train_mask], y[train_mask])
        loss.backward()
        optimizer.step()
    return model.eval()


def usage(build: Callable[[int, int], torch.nn.Module]) -> str:
    """How the example defining `build` is used: the command that trains and saves it, then the
    batch inference job that runs the saved model on Cora."""
    name = os.path.splitext(os.path.basename(inspect.getfile(build)))[0]
    return (
        f"python examples/models/{name}.py --model-out models/{name}\n"
        f"spark-submit spark_jobs/batch_inference.py --graph data/cora --model models/{name} --out out/{name}"
    )


def run(build: Callable[[int, int], torch.nn.Module], description: str, argv: list[str] | None = None) -> Model:
    """Parse --model-out/--epochs/--seed, train `build(features, classes)` on Cora, convert it,
    check it against PyG, save it and return the converted Model."""
    parser = argparse.ArgumentParser(
        description=description, epilog=usage(build), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-out", required=True, help="directory the converted model is saved to")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    torch.manual_seed(args.seed)
    data = load_cora()
    model = train(build(data.feature_dim, data.num_classes), data, args.epochs)
    x, edge_index = torch.from_numpy(data.x), data.edge_index_torch()
    with torch.no_grad():
        expected = model(x, edge_index)
    test = torch.from_numpy(data.mask("test"))
    accuracy = float((expected.argmax(dim=1)[test] == torch.from_numpy(data.y)[test]).float().mean())

    converted = Model.from_pyg(model)
    actual = converted(x, edge_index, parts=3)
    error = float((actual - expected).abs().max() / expected.abs().max())
    if error > 1e-5:
        raise SystemExit(f"the converted model differs from PyG's forward: relative error {error:.2e}")
    converted.save(args.model_out)
    log.info(
        "%s: PyG test accuracy %.4f; converted (output=%r, relative error %.1e vs PyG) -> %s",
        type(model).__name__,
        accuracy,
        converted.output,
        error,
        args.model_out,
    )
    return converted
