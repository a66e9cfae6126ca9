"""Runs a PyG full-graph forward in a child process, optionally under an address-space cap, and
prints one JSON line. Why a child: RLIMIT_AS must bind PyG alone, not the bench driver or Spark.
`--adj csr` gives the convs the transposed adjacency as a torch sparse CSR tensor (PyG's fast
path, pyg_cold_job.csr_adj_t), built before the cap and the clock like a user's preprocessing."""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--graph", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--cap-bytes", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--adj", choices=("edge_index", "csr"), default="edge_index")
    args = parser.parse_args()
    import warnings

    import numpy as np  # noqa: F401
    import torch

    torch.set_num_threads(args.threads)
    from torch_geometric.nn import GraphSAGE

    from sparkgnn.graph import read_graph_dir

    data = read_graph_dir(args.graph)
    x = torch.from_numpy(data.x)
    edge_index = data.edge_index_torch()
    if args.adj == "csr":
        from pyg_cold_job import csr_adj_t

        warnings.filterwarnings("ignore", message=".*[Ss]parse.*")  # torch's beta notice on CSR tensors
        edge_index = csr_adj_t(edge_index, x.shape[0])
    state = torch.load(args.model, weights_only=True)
    module = GraphSAGE(state["in"], state["hidden"], state["layers"]).eval()
    module.load_state_dict(state["weights"])
    with torch.no_grad():  # start the OpenMP thread pool before the cap: only data allocations should hit it
        torch.ones(256, 256) @ torch.ones(256, 256)
    if args.cap_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (args.cap_bytes, args.cap_bytes))
    try:
        started = time.perf_counter()
        with torch.no_grad():
            module(x, edge_index)
        print(json.dumps({"ok": True, "adj": args.adj, "seconds": time.perf_counter() - started}))
    except (MemoryError, RuntimeError) as exc:
        print(json.dumps({"ok": False, "adj": args.adj, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
