"""The PyG alternative a user would write for link prediction, run cold in its own process by
bench_linkpred.py: read the graph's Parquet, run the trained GraphSAGE encoder's forward, then
  --mode score: read the (src, dst) pairs Parquet, decode every pair in chunks, write (src, dst, score);
  --mode topk:  brute-force top-k of the --sources over every node (torch.topk over blocks of a
                matrix product: a dot decoder), write (src, dst, score, rank).
Prints one JSON line with the phase seconds. A MemoryError or an allocator failure is reported as
the outcome, not raised: "PyG does not fit" is a result. The decoder modules are defined here so
that bench_linkpred.py converts the very classes this script rebuilds from their state dicts."""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

SCORE_CHUNK = 1 << 20  # pairs decoded at once
TOPK_BLOCK = 2048  # sources scored against every candidate at once


class DotDecoder(torch.nn.Module):
    """PyG's link-prediction `decode`: the dot product of the two node outputs."""

    def forward(self, h_src: torch.Tensor, h_dst: torch.Tensor) -> torch.Tensor:
        return (h_src * h_dst).sum(dim=-1)


class ConcatMLPDecoder(torch.nn.Module):
    """An MLP on [h_src, h_dst] (width -> hidden -> 1), as PyG's link-prediction examples write one."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.lin1, self.lin2 = torch.nn.Linear(2 * width, hidden), torch.nn.Linear(hidden, 1)

    def forward(self, h_src: torch.Tensor, h_dst: torch.Tensor) -> torch.Tensor:
        return self.lin2(self.lin1(torch.cat([h_src, h_dst], dim=-1)).relu()).squeeze(-1)


def build_decoder(state: dict) -> torch.nn.Module:
    """The decoder module of a state saved by bench_linkpred.make_models ('decoder': 'dot' or 'mlp')."""
    if state["decoder"] == "dot":
        return DotDecoder()
    module = ConcatMLPDecoder(state["hidden"], state["decoder_hidden"])
    module.load_state_dict(state["decoder_weights"])
    return module.eval()


def index_probe(z: torch.Tensor, queries: torch.Tensor, k: int, shards: int = 2) -> dict:
    """Seconds to build one of topk.py --approx's HNSW shards (every `shards`-th node: its default
    two shards on two cores) and to search it for every query, one thread as in a Spark task: what
    its approximate top-k costs per shard, split into the fixed build and the per-source search."""
    from sparkgnn.linkpred.approx import IndexParams, ShardIndex

    vectors = z[::shards].numpy()
    started = time.perf_counter()
    index = ShardIndex(vectors, IndexParams())
    built = time.perf_counter()
    index.search(queries.numpy(), k)
    return {
        "index_shard_size": len(vectors),
        "index_build_s": built - started,
        "index_query_s": time.perf_counter() - built,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--graph", required=True)
    parser.add_argument("--model", required=True, help="torch.save of bench_linkpred.make_models")
    parser.add_argument("--mode", choices=["score", "topk"], required=True)
    parser.add_argument("--pairs", help="--mode score: Parquet (src, dst)")
    parser.add_argument("--sources", help="--mode topk: Parquet with an id column")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--index-probe", action="store_true", help="--mode topk: also time one HNSW shard as topk.py --approx builds it"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from torch_geometric.nn import GraphSAGE

    from sparkgnn.graph import read_graph_dir

    torch.set_num_threads(args.threads)
    mark = time.perf_counter()
    result: dict = {"import_s": mark - started}
    try:
        data = read_graph_dir(args.graph)
        x, edge_index = torch.from_numpy(data.x), data.edge_index_torch()
        state = torch.load(args.model, weights_only=True)
        encoder = GraphSAGE(state["in"], state["hidden"], state["layers"]).eval()
        encoder.load_state_dict(state["weights"])
        decoder = build_decoder(state)
        ids = np.asarray(data.ids, np.int64)
        order = np.argsort(ids, kind="stable")
        result["read_graph_s"], mark = time.perf_counter() - mark, time.perf_counter()
        with torch.no_grad():
            z = encoder(x, edge_index)
        result["encode_s"], mark = time.perf_counter() - mark, time.perf_counter()

        def rows(wanted: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(order[np.searchsorted(ids, wanted, sorter=order)])

        if args.mode == "score":
            pairs = pq.read_table(args.pairs, columns=["src", "dst"])
            src, dst = pairs.column("src").to_numpy(), pairs.column("dst").to_numpy()
            s_rows, d_rows = rows(src), rows(dst)
            result["read_pairs_s"], mark = time.perf_counter() - mark, time.perf_counter()
            scores = torch.empty(len(src))
            with torch.no_grad():
                for at in range(0, len(src), SCORE_CHUNK):
                    part = slice(at, at + SCORE_CHUNK)
                    scores[part] = decoder(z[s_rows[part]], z[d_rows[part]])
            result["decode_s"], mark = time.perf_counter() - mark, time.perf_counter()
            pq.write_table(pa.table({"src": src, "dst": dst, "score": scores.numpy()}), args.out)
            result["pairs"] = len(src)
        else:
            if state["decoder"] != "dot":
                raise ValueError("--mode topk brute-forces a dot decoder")
            sources = np.sort(pq.read_table(args.sources, columns=["id"]).column("id").to_numpy())
            s_rows = rows(sources)
            result["read_sources_s"], mark = time.perf_counter() - mark, time.perf_counter()
            top_s, top_i = [], []
            with torch.no_grad():
                for at in range(0, len(sources), TOPK_BLOCK):
                    values, where = torch.topk(z[s_rows[at : at + TOPK_BLOCK]] @ z.T, args.k, dim=1)
                    top_s.append(values)
                    top_i.append(where)
            values, where = torch.cat(top_s), torch.cat(top_i)
            result["topk_s"], mark = time.perf_counter() - mark, time.perf_counter()
            pq.write_table(
                pa.table(
                    {
                        "src": np.repeat(sources, args.k),
                        "dst": ids[where.numpy().reshape(-1)],
                        "score": values.numpy().reshape(-1),
                        "rank": np.tile(np.arange(1, args.k + 1, dtype=np.int32), len(sources)),
                    }
                ),
                args.out,
            )
            result["sources"] = len(sources)
        result["write_s"] = time.perf_counter() - mark
        if args.mode == "topk" and args.index_probe:
            result.update(index_probe(z, z[s_rows], args.k))
        result["ok"] = True
    except (MemoryError, RuntimeError) as exc:
        result.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:200]}")
    result["total_s"] = time.perf_counter() - started
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
