"""examples/models/: each script's model class trains one epoch on Cora, converts with
Model.from_pyg, equals PyG's forward (the script's `run` refuses a difference above 1e-5) and
saves a model that loads back; then the saved models run through the batch inference job
(spark_jobs/batch_inference.py, every Cora model batched in one job, the edge-feature model on
the graph its script writes) and equal the converted models, hence PyG. So the examples cannot rot."""

import importlib.util
import os
import sys

import numpy as np
import pytest
import torch

from sparkgnn.models import Model

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples", "models")
SCRIPTS = ["gcn_cora", "sage_cora", "gat_cora", "residual_cora", "jk_cora", "appnp_cora", "feast_cora", "gine_cora"]


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_every_example_script_is_tested():
    scripts = sorted(f[:-3] for f in os.listdir(EXAMPLES) if f.endswith(".py") and f != "cora_common.py")
    assert scripts == sorted(SCRIPTS)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """name -> (converted Model, saved model dir, the graph dir its script wrote or None): every
    example trained one epoch and converted once for this module."""
    root = tmp_path_factory.mktemp("examples")
    sys.path.insert(0, EXAMPLES)  # the scripts import cora_common from their folder
    try:
        done = {}
        torch.set_num_threads(1)
        for name in SCRIPTS:
            spec = importlib.util.spec_from_file_location(f"example_{name}", os.path.join(EXAMPLES, f"{name}.py"))
            assert spec is not None and spec.loader is not None
            script = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(script)
            out, graph = root / name, root / f"{name}-graph"
            argv = ["--model-out", str(out), "--epochs", "1"]
            if getattr(script, "EDGE_DIM", 0):  # a model reading edge features: its graph too
                argv += ["--graph-out", str(graph)]
            model = script.run(script.build, name, argv)
            done[name] = (model, str(out), str(graph) if graph.exists() else None)
        return done
    finally:
        sys.path.remove(EXAMPLES)


@pytest.mark.parametrize("name", SCRIPTS)
def test_example_converts_and_saves(name, converted):
    model, out, _ = converted[name]
    assert model.output == "logits"
    assert model.spec["source"].startswith(f"example_{name}.")  # the script's own class, traced
    assert Model.load(out).describe() == model.describe()


def test_examples_run_through_the_batch_job_equal_to_pyg(spark, converted, tmp_path):
    """The saved models through spark_jobs/batch_inference.py (the script spark-submit runs; here
    on the suite's session): each output equals the converted model's forward, which each script
    checked against PyG's."""
    import pyarrow.parquet as pq

    from sparkgnn.datasets import load_cora
    from sparkgnn.graph import read_graph_dir, write_graph_dir

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "spark_jobs"))
    try:
        from batch_inference import main
    finally:
        sys.path.pop(0)

    cora = str(tmp_path / "cora")
    write_graph_dir(load_cora(), cora)
    by_graph: dict[str, list[str]] = {}
    for name, (_, _, graph) in converted.items():
        by_graph.setdefault(graph or cora, []).append(name)
    for graph, names in by_graph.items():
        out = tmp_path / f"out-{len(names)}-{names[0]}"
        models = [arg for name in names for arg in ("--model", converted[name][1])]
        argv = ["--graph", graph, *models, "--out", str(out), "--work-dir", str(tmp_path / "work"), "--partitions", "1"]
        assert main(argv) == 0
        data = read_graph_dir(graph)
        x, edge_index = torch.from_numpy(data.x), data.edge_index_torch()
        edge_attr = None if data.edge_attr is None else torch.from_numpy(data.edge_attr)
        for name in names:
            table = pq.read_table(out / name if len(names) > 1 else out)
            order = np.argsort(table.column("id").to_numpy())
            actual = np.stack(table.column("h").to_numpy(zero_copy_only=False))[order]
            with torch.no_grad():
                expected = converted[name][0](x, edge_index, edge_attr=edge_attr).numpy()
            expected = expected[np.argsort(data.ids)]  # rows in id order, as `actual`
            error = np.abs(actual - expected).max() / np.abs(expected).max()
            assert error <= 1e-5, (name, error)
