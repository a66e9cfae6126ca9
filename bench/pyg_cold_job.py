"""The PyG alternative a user would write for a batch job, run cold in its own process by
bench_scale.py: read the graph's Parquet, run the trained GraphSAGE's forward, write (id, h) as
Parquet. Prints one JSON line with the phase seconds and per-layer seconds. A MemoryError or an
allocator failure is reported as the outcome, not raised: "PyG does not fit" is a result."""

from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--graph", required=True)
    parser.add_argument("--model", required=True, help="torch.save({'weights', 'in', 'hidden', 'layers'})")
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    started = time.perf_counter()
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from torch_geometric.nn import GraphSAGE

    from sparkgnn.graph import read_graph_dir

    torch.set_num_threads(args.threads)
    imported = time.perf_counter()
    result: dict = {"import_s": imported - started}
    try:
        data = read_graph_dir(args.graph)
        x = torch.from_numpy(data.x)
        edge_index = data.edge_index_torch()
        read = time.perf_counter()
        result["read_s"] = read - imported
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
