"""README.md's ```python blocks run as written against a tiny graph: a block that calls an API that
does not exist, or with a signature it no longer has, fails here; one that uses a deprecated call
form fails too (the README shows the current forms).

Each block runs in a fresh directory holding what its placeholders name: `data/cora` and `GRAPH`
(a small synthetic graph directory), `STORE` (that graph's PE store with states), `UPDATES` and
`updates.parquet` (an update of it), and the names `spark`, `pyg_module`, `model` and `graph`."""

import os
import re
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch_geometric.nn import GraphSAGE

from sparkgnn.datasets.synthetic import synthetic_graph
from sparkgnn.graph.writer import write_graph_dir
from sparkgnn.models import Model
from sparkgnn.pe.local import precompute_local

README = os.path.join(os.path.dirname(__file__), "..", "README.md")
DIM = 8


def python_blocks() -> list[str]:
    with open(README, encoding="utf-8") as f:
        return re.findall(r"^```python\n(.*?)^```", f.read(), flags=re.S | re.M)


def test_the_readme_has_python_examples():
    blocks = python_blocks()
    assert len(blocks) >= 3 and any("infer(" in b for b in blocks) and any("refresh(" in b for b in blocks)


@pytest.fixture(scope="module")
def tiny():
    graph = synthetic_graph(120, 480, DIM, num_classes=3, seed=3)
    torch.manual_seed(0)
    pyg_module = GraphSAGE(DIM, 8, 2, out_channels=3).eval()
    return graph, pyg_module, Model.from_pyg(pyg_module)


def _placeholders(directory, graph, model) -> None:
    write_graph_dir(graph, os.path.join(directory, "data", "cora"))
    write_graph_dir(graph, os.path.join(directory, "GRAPH"))
    precompute_local(graph, model, os.path.join(directory, "STORE"))
    ids = graph.ids
    update = pa.table({"kind": ["edge_insert", "edge_insert"], "src": ids[[1, 2]], "dst": ids[[7, 9]]})
    os.makedirs(os.path.join(directory, "UPDATES"))
    pq.write_table(update, os.path.join(directory, "UPDATES", "part-0.parquet"))
    pq.write_table(update, os.path.join(directory, "updates.parquet"))


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_python_block_runs(index, spark, tiny, tmp_path, monkeypatch):
    graph, pyg_module, model = tiny
    monkeypatch.chdir(tmp_path)  # a path the code rewrite below does not know stays in tmp_path
    _placeholders(str(tmp_path), graph, model)
    # the block's relative paths, made absolute: Spark resolves a relative path against the JVM's
    # working directory, not this process's
    code = re.sub(
        r'"(data/cora|out/pred|models/sage|models/lp|GRAPH2?|STORE|UPDATES|updates\.parquet)"',
        lambda m: repr(str(tmp_path / m.group(1))),
        python_blocks()[index],
    )
    namespace = {"spark": spark, "pyg_module": pyg_module, "model": model, "graph": graph}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        exec(compile(code, f"README.md python block {index}", "exec"), namespace)  # noqa: S102
    ours = [str(w.message) for w in caught if "sparkgnn" in str(w.filename) or "deprecated" in str(w.message)]
    assert not [m for m in ours if "will stop working" in m or "will be removed" in m], ours
    if "predictions" in namespace:  # the infer block: the documented result
        table = namespace["predictions"].toArrow()
        assert table.column_names == ["id", "h", "pred"] and table.num_rows == graph.num_nodes
    if "store" in namespace:  # the refresh blocks: the updated graph's version of the store
        assert namespace["report"].graph_fingerprint != namespace["report"].previous_graph_fingerprint
        assert os.path.isdir(tmp_path / "GRAPH2")
