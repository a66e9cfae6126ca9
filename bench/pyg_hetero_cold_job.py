"""The PyG alternative a user would write for a typed batch job, run cold in its own process by
bench_hetero.py: read the typed graph's Parquet into a HeteroData, run the trained to_hetero
GraphSAGE's forward, write (id, h) per node type as Parquet (OUT/<type>.parquet). A type without
features is fed `torch.ones(n, 1)`, as the sparkgnn job feeds it. Prints one JSON line with the
phase seconds and per-layer seconds (the input Linears: from the forward's start to the first
conv; layer 1: from there to the first second-layer conv; layer 2: the rest). A MemoryError or
an allocator failure is reported as the outcome, not raised: "PyG does not fit" is a result.

`Net` and `build_model` make the (untrained, seeded) model bench_hetero.py saves for both sides."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

#: What a type without features is fed: one constant column (the job's rule, engine/typed.py).
FEATURELESS_WIDTH = 1


class Net(torch.nn.Module):
    """A per-type input Linear to one width (a relation's conv reads one width on both sides),
    then two SAGE convs (mean) with relus, as PyG's to_hetero examples write it."""

    def __init__(self, hidden: int, out: int):
        from torch_geometric.nn import Linear, SAGEConv

        super().__init__()
        self.lin = Linear(-1, hidden)
        self.conv1 = SAGEConv((-1, -1), hidden)
        self.conv2 = SAGEConv((-1, -1), out)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(self.lin(x).relu(), edge_index).relu(), edge_index)


def build_model(metadata, widths: dict[str, int], hidden: int, out: int, *, seed: int = 0) -> torch.nn.Module:
    """to_hetero(Net) for `metadata` (aggr "sum"), its lazy parameters made on a two-row graph of
    the same metadata and feature widths (the weights depend on the seed only)."""
    from torch_geometric.data import HeteroData
    from torch_geometric.nn import to_hetero

    torch.manual_seed(seed)
    module = to_hetero(Net(hidden, out), metadata, aggr="sum")
    tiny = HeteroData()
    for t in metadata[0]:
        tiny[t].x = torch.zeros(2, widths[t])
    for et in metadata[1]:
        tiny[et].edge_index = torch.tensor([[0, 1], [1, 0]])
    with torch.no_grad():
        module(tiny.x_dict, tiny.edge_index_dict)
    return module.eval().requires_grad_(False)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--graph", required=True, help="typed graph directory")
    parser.add_argument("--model", required=True, help="torch.save({'weights', 'hidden', 'out', 'widths'})")
    parser.add_argument("--out", required=True, help="folder for <type>.parquet")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--float64", action="store_true", help="run the forward in float64 (the reference for the float32 runs)"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparkgnn.graph import read_typed_graph_dir

    torch.set_num_threads(args.threads)
    imported = time.perf_counter()
    result: dict = {"import_s": imported - started}
    try:
        graph = read_typed_graph_dir(args.graph)
        data = graph.to_pyg()
        for t in data.node_types:
            if "x" not in data[t]:
                data[t].x = torch.ones(data[t].num_nodes, FEATURELESS_WIDTH)
        read = time.perf_counter()
        result["read_s"] = read - imported
        state = torch.load(args.model, weights_only=True)
        module = build_model(data.metadata(), state["widths"], state["hidden"], state["out"])
        module.load_state_dict(state["weights"])
        if args.float64:
            module = module.double()
            for t in data.node_types:
                data[t].x = data[t].x.double()
        starts: dict[str, list[float]] = {"conv1.": [], "conv2.": []}
        for name, sub in module.named_modules():
            for prefix, seen in starts.items():
                if name.startswith(prefix):
                    sub.register_forward_pre_hook(lambda *_, seen=seen: seen.append(time.perf_counter()))
        result["model_s"] = time.perf_counter() - read
        t = time.perf_counter()
        with torch.no_grad():
            out = module(data.x_dict, data.edge_index_dict)
        end = time.perf_counter()
        first, second = min(starts["conv1."]), min(starts["conv2."])
        result["input_projection_s"] = first - t
        result["layer_s"] = [second - first, end - second]
        t = time.perf_counter()
        os.makedirs(args.out, exist_ok=True)
        for node_type, h in out.items():
            flat = pa.array(h.numpy().reshape(-1))
            ids = np.asarray(graph.nodes[node_type].ids)
            table = pa.table({"id": ids, "h": pa.FixedSizeListArray.from_arrays(flat, h.shape[1])})
            pq.write_table(table, os.path.join(args.out, f"{node_type}.parquet"))
        result["write_s"] = time.perf_counter() - t
        result["ok"] = True
    except (MemoryError, RuntimeError) as exc:
        result.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:200]}")
    result["total_s"] = time.perf_counter() - started
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
