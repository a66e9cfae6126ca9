"""The PyG alternative a user would write for a batch job, run cold in its own process by
bench_scale.py: read the graph's Parquet, run the trained GraphSAGE's forward, write (id, h) as
Parquet. Prints one JSON line with the phase seconds and per-layer seconds. A MemoryError or an
allocator failure is reported as the outcome, not raised: "PyG does not fit" is a result.

`--adj` picks how the convs get the graph: `edge_index` (gather + scatter per edge, PyG's
default) or `csr`, the transposed adjacency as a torch sparse CSR tensor (`adj_t`, PyG's
documented memory-efficient path: one sparse-dense product per layer, no compiled extension).
The CSR is built once after the read (`adj_s`, part of the job, as a user would build it) and
keeps duplicate edges, so every aggregation equals the edge_index path's."""

from __future__ import annotations

import argparse
import json
import sys
import time

ADJ_CHOICES = ("edge_index", "csr")


def csr_adj_t(edge_index, num_nodes: int):
    """The transposed adjacency of `edge_index` ([src; dst], flow source -> target) as a torch
    sparse CSR tensor: row = destination, column = source, one entry per edge (duplicates kept,
    not summed, so mean/max aggregations count every edge as the edge_index path does)."""
    import torch

    src, dst = edge_index[0], edge_index[1]
    order = torch.argsort(dst, stable=True)
    crow = torch.zeros(num_nodes + 1, dtype=torch.int64)
    crow[1:] = torch.cumsum(torch.bincount(dst, minlength=num_nodes), 0)
    values = torch.ones(src.numel(), dtype=torch.float32)
    return torch.sparse_csr_tensor(crow, src[order], values, size=(num_nodes, num_nodes), check_invariants=False)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--graph", required=True)
    parser.add_argument("--model", required=True, help="torch.save({'weights', 'in', 'hidden', 'layers'})")
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--adj", choices=ADJ_CHOICES, default="edge_index", help="how the convs get the graph")
    args = parser.parse_args()
    started = time.perf_counter()
    import warnings

    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from torch_geometric.nn import GraphSAGE

    from sparkgnn.graph import read_graph_dir

    warnings.filterwarnings("ignore", message=".*[Ss]parse.*")  # torch's beta notice on CSR tensors
    torch.set_num_threads(args.threads)
    imported = time.perf_counter()
    result: dict = {"adj": args.adj, "import_s": imported - started}
    try:
        data = read_graph_dir(args.graph)
        x = torch.from_numpy(data.x)
        edge_index = data.edge_index_torch()
        read = time.perf_counter()
        result["read_s"] = read - imported
        if args.adj == "csr":
            edge_index = csr_adj_t(edge_index, x.shape[0])
            result["adj_s"] = time.perf_counter() - read
        state = torch.load(args.model, weights_only=True)
        module = GraphSAGE(state["in"], state["hidden"], state["layers"]).eval()
        module.load_state_dict(state["weights"])
        layers = []
        h = x
        with torch.no_grad():
            for index, conv in enumerate(module.convs):
                t = time.perf_counter()
                h = conv(h, edge_index)
                if index < len(module.convs) - 1:
                    h = module.act(h)
                layers.append(time.perf_counter() - t)
        result["layer_s"] = layers
        t = time.perf_counter()
        flat = pa.array(h.numpy().reshape(-1))
        table = pa.table({"id": data.ids, "h": pa.FixedSizeListArray.from_arrays(flat, h.shape[1])})
        pq.write_table(table, args.out)
        result["write_s"] = time.perf_counter() - t
        result["ok"] = True
    except (MemoryError, RuntimeError) as exc:
        result.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:200]}")
    result["total_s"] = time.perf_counter() - started
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
