"""Shared by the model-class examples in this folder: Cora from the copy sparkgnn ships (no
download), a short PyG training loop, and the hand-over to sparkgnn: Model.from_pyg(model), a check
that the converted model equals the PyG model's eval forward on Cora, and model.save(dir).

Each example defines its model class exactly as PyG's tutorials do and calls `run` with it; every
one is used the same way (`usage`): train and convert it, then run the saved model with Spark. A
model whose convs read edge features passes `edge_dim`: Cora's edges then carry seeded synthetic
attributes (`edge_features`; Cora has none), fed to training and the check, and `--graph-out`
writes that graph for the batch job.
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


def edge_features(data, edge_dim: int, seed: int = 0) -> torch.Tensor:
    """Seeded synthetic [E, edge_dim] edge attributes for Cora's edges (Cora has none)."""
    return torch.randn(data.num_edges, edge_dim, generator=torch.Generator().manual_seed(seed))


def train(model: torch.nn.Module, data, epochs: int, lr: float = 0.01, edge_attr=None) -> torch.nn.Module:
    """Full-batch training on Cora's train split (cross-entropy; log_softmax outputs are fine too:
    nll of log-probabilities equals cross-entropy of logits up to the log_softmax it applies)."""
    x, edge_index = torch.from_numpy(data.x), data.edge_index_torch()
    y, train_mask = torch.from_numpy(data.y), torch.from_numpy(data.mask("train"))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=5e-4)
    for _ in range(epochs):
        model.train()
        optimizer.zero_grad()
        out = model(x, edge_index) if edge_attr is None else model(x, edge_index, edge_attr)
        loss = F.cross_entropy(out[train_mask], y[train_mask])
        loss.backward()
        optimizer.step()
    return model.eval()


def usage(build: Callable[[int, int], torch.nn.Module]) -> str:
    """How the example defining `build` is used: the command that trains and saves it, then the
    batch inference job that runs the saved model on Cora."""
    name = os.path.splitext(os.path.basename(inspect.getfile(build)))[0]
    graph = "data/cora"
    extra = ""
    if "edge_attr" in inspect.signature(build(8, 2).forward).parameters:  # the model reads edge features
        graph, extra = f"data/{name}", f" --graph-out data/{name}"
    return (
        f"python examples/models/{name}.py --model-out models/{name}{extra}\n"
        f"spark-submit spark_jobs/batch_inference.py --graph {graph} --model models/{name} --out out/{name}"
    )


def run(
    build: Callable[[int, int], torch.nn.Module], description: str, argv: list[str] | None = None, edge_dim: int = 0
) -> Model:
    """Parse --model-out/--epochs/--seed, train `build(features, classes)` on Cora, convert it,
    check it against PyG, save it and return the converted Model. `edge_dim` > 0: the model reads
    edge features (module doc; --graph-out writes Cora with them)."""
    parser = argparse.ArgumentParser(
        description=description, epilog=usage(build), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-out", required=True, help="directory the converted model is saved to")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    if edge_dim:
        parser.add_argument("--graph-out", help="also write Cora with the synthetic edge features here (for --graph)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    torch.manual_seed(args.seed)
    data = load_cora()
    edge_attr = edge_features(data, edge_dim, args.seed) if edge_dim else None
    model = train(build(data.feature_dim, data.num_classes), data, args.epochs, edge_attr=edge_attr)
    x, edge_index = torch.from_numpy(data.x), data.edge_index_torch()
    with torch.no_grad():
        expected = model(x, edge_index) if edge_attr is None else model(x, edge_index, edge_attr)
    test = torch.from_numpy(data.mask("test"))
    accuracy = float((expected.argmax(dim=1)[test] == torch.from_numpy(data.y)[test]).float().mean())

    converted = Model.from_pyg(model)
    actual = converted(x, edge_index, parts=3, edge_attr=edge_attr)
    error = float((actual - expected).abs().max() / expected.abs().max())
    if error > 1e-5:
        raise SystemExit(f"the converted model differs from PyG's forward: relative error {error:.2e}")
    converted.save(args.model_out)
    if edge_attr is not None and args.graph_out:
        from dataclasses import replace

        from sparkgnn.graph import write_graph_dir

        write_graph_dir(replace(data, edge_attr=edge_attr.numpy(), name="cora_edge_attr"), args.graph_out)
    log.info(
        "%s: PyG test accuracy %.4f; converted (output=%r, relative error %.1e vs PyG) -> %s",
        type(model).__name__,
        accuracy,
        converted.output,
        error,
        args.model_out,
    )
    return converted
