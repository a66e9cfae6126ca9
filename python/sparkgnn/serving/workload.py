"""The serving workload of OMEGA section 8.1: hold out a random 25% of the test vertices as the
query pool, serve the rest of the graph (G), and send requests of B pool vertices as NEW nodes.

WHY this shape: the model and the PE store are built on G, so a query vertex is genuinely unseen
(no stored embedding, no edge in G) while its label is known for scoring. Each request carries
its vertices' features and every edge between them and G (both directions) and among the
request's own queries, with the edges' attributes when the graph's edges carry them (G keeps its
edges' attributes too, so models that read edge_attr run on the workload). Edges from a query to
pool vertices OUTSIDE the request are dropped: those vertices are not in G and not in the
request, so the edge names nothing the engine can see (the same choice OMEGA makes by removing
the held-out nodes "and their connected edges").
Queries are drawn without replacement within a request; different requests may share queries
(each request is answered on G alone, independently).

CLI: python -m sparkgnn.serving.workload --graph DIR --out DIR --batch-sizes 64,256 --requests N
     --seed S [--overwrite] ->  <out>/graph/ (G), <out>/requests/<request_id>.parquet,
     <out>/labels.parquet, <out>/workload.json.  --requests is the number of requests PER batch
     size. An --out that already holds something is refused unless --overwrite.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sparkgnn.cliargs import int_list, non_negative_int, positive_int, run_cli
from sparkgnn.errors import SparkGNNError
from sparkgnn.graph import GraphData, read_graph_dir, write_graph_dir
from sparkgnn.logs import install_cli_handler
from sparkgnn.serving.request import Request, write_requests

POOL_FRACTION = 0.25
BATCH_SIZES = (64, 128, 256, 512, 1024)


class WorkloadError(SparkGNNError, ValueError):
    """The graph cannot produce the requested workload (no test split, pool too small)."""


@dataclass
class Workload:
    graph_G: GraphData
    requests: list
    labels: dict  # query id -> label (every pool vertex)
    pool: np.ndarray  # original ids of the held-out pool

    def label_array(self, qid: np.ndarray) -> np.ndarray:
        return np.array([self.labels[int(q)] for q in qid], dtype=np.int64)


def split_pool(data: GraphData, seed: int, fraction: float = POOL_FRACTION) -> np.ndarray:
    """Dense indices of a random (seeded) `fraction` of the test vertices, sorted."""
    if data.split is None:
        raise WorkloadError(f"graph {data.name!r} has no split column: the query pool is drawn from its test vertices")
    test = np.flatnonzero(data.mask("test"))
    size = int(round(fraction * len(test)))
    if size == 0:
        raise WorkloadError(f"graph {data.name!r} has {len(test)} test vertices: a {fraction:.0%} pool would be empty")
    rng = np.random.default_rng([int(seed), 0])
    return np.sort(rng.choice(test, size=size, replace=False))


def remove_vertices(data: GraphData, drop: np.ndarray, name: str | None = None) -> GraphData:
    """The graph without the dense vertices `drop` and every edge touching them (the kept edges
    keep their weights and attributes)."""
    keep = np.ones(data.num_nodes, bool)
    keep[drop] = False
    new_index = np.cumsum(keep) - 1
    e_keep = keep[data.edge_src] & keep[data.edge_dst]

    def sub(a):
        return None if a is None else a[keep]

    return GraphData(
        data.ids[keep],
        data.x[keep],
        new_index[data.edge_src[e_keep]],
        new_index[data.edge_dst[e_keep]],
        weight=None if data.weight is None else data.weight[e_keep],
        edge_attr=None if data.edge_attr is None else data.edge_attr[e_keep],
        y=sub(data.y),
        split=sub(data.split),
        name=name or f"{data.name}-G",
    )


def check_sizes(batch_sizes, num_requests) -> None:
    """Refuse what would silently produce empty requests (a batch size or request count < 1)."""
    sizes = list(batch_sizes)
    if not sizes:
        raise WorkloadError("no batch sizes: give at least one (e.g. 64,256)")
    bad = [b for b in sizes if int(b) != b or int(b) < 1]
    if bad:
        raise WorkloadError(f"batch sizes must be integers >= 1 (a request needs a query node), got {bad}")
    if int(num_requests) != num_requests or int(num_requests) < 1:
        raise WorkloadError(f"the number of requests per batch size must be an integer >= 1, got {num_requests}")


def make_workload(data: GraphData, batch_sizes=BATCH_SIZES, num_requests: int = 10, seed: int = 0) -> Workload:
    """num_requests requests per batch size (see module doc). Deterministic for a seed."""
    check_sizes(batch_sizes, num_requests)
    if data.y is None:
        raise WorkloadError(f"graph {data.name!r} has no labels")
    pool = split_pool(data, seed)
    G = remove_vertices(data, pool)
    in_pool = np.zeros(data.num_nodes, bool)
    in_pool[pool] = True
    # edges touching the pool, found once; each request then filters this short list
    touch = in_pool[data.edge_src] | in_pool[data.edge_dst]
    p_src, p_dst = data.edge_src[touch], data.edge_dst[touch]
    p_attr = None if data.edge_attr is None else data.edge_attr[touch]
    rng = np.random.default_rng([int(seed), 1])
    requests = []
    for b in batch_sizes:
        b = int(b)
        if b > len(pool):
            raise WorkloadError(
                f"batch size {b} exceeds the query pool ({len(pool)} vertices = "
                f"{POOL_FRACTION:.0%} of the test split of {data.name!r})"
            )
        for i in range(int(num_requests)):
            q = np.sort(rng.choice(pool, size=b, replace=False))
            in_req = np.isin(p_src, q), np.isin(p_dst, q)
            # keep an edge if it touches the request and its other end is in G or the request
            ok = (in_req[0] | ~in_pool[p_src]) & (in_req[1] | ~in_pool[p_dst]) & (in_req[0] | in_req[1])
            attr = None if p_attr is None else p_attr[ok]
            src, dst = data.ids[p_src[ok]], data.ids[p_dst[ok]]
            requests.append(Request(f"b{b}-{i:05d}", data.ids[q], data.x[q], src, dst, attr))
    labels = dict(zip(data.ids[pool].tolist(), data.y[pool].tolist(), strict=True))
    return Workload(G, requests, labels, data.ids[pool])


def write_workload(
    workload: Workload, out: str, meta: dict | None = None, overwrite: bool = False, inputs: dict | None = None
) -> dict:
    """Write graph/, requests/, labels.parquet and workload.json under `out`. An `out` that holds
    anything is refused unless `overwrite` (it would mix two workloads' request files, or replace
    an earlier one without being asked), as is an `out` overlapping one of `inputs` ({flag: path});
    the workload is written into a hidden sibling and swapped into place (sparkgnn.outputs), so a
    failure part-way (full disk) leaves the previous `out` as it was and no half workload."""
    from sparkgnn.outputs import check_output, discard, staging_path, swap_into_place

    check_output(out, inputs or {}, overwrite=overwrite)
    staged = staging_path(os.path.abspath(out))
    try:
        doc = _write_files(workload, staged, meta)
        swap_into_place(staged, os.path.abspath(out), job="serving.workload")
    except BaseException:
        discard(staged)
        raise
    return doc


def _write_files(workload: Workload, out: str, meta: dict | None) -> dict:
    os.makedirs(out, exist_ok=True)
    write_graph_dir(workload.graph_G, os.path.join(out, "graph"))
    req_dir = os.path.join(out, "requests")
    os.makedirs(req_dir, exist_ok=True)
    for r in workload.requests:
        write_requests(os.path.join(req_dir, f"{r.request_id}.parquet"), [r])
    ids = np.fromiter(workload.labels.keys(), np.int64, len(workload.labels))
    ys = np.fromiter(workload.labels.values(), np.int64, len(workload.labels))
    pq.write_table(pa.table({"id": ids, "y": ys}), os.path.join(out, "labels.parquet"))
    doc = {
        "pool_size": int(len(workload.pool)),
        "num_requests": len(workload.requests),
        "graph_G": workload.graph_G.meta(),
        **(meta or {}),
    }
    with open(os.path.join(out, "workload.json"), "w") as f:
        json.dump(doc, f, indent=2)
    return doc


def read_labels(path: str) -> dict:
    t = pq.read_table(path)
    return dict(zip(t.column("id").to_numpy().tolist(), t.column("y").to_numpy().tolist(), strict=True))


PROG = "python -m sparkgnn.serving.workload"


def build_parser() -> argparse.ArgumentParser:
    """Numbers are parsed by argparse types (sparkgnn.cliargs), so `--requests -1` or
    `--batch-sizes x` is a usage error naming the flag, not an empty workload or a traceback."""
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    ap.add_argument("--graph", required=True, help="graph directory (with labels and a split)")
    ap.add_argument("--out", required=True, help="workload folder to create")
    ap.add_argument(
        "--batch-sizes",
        type=int_list(1),
        default=list(BATCH_SIZES),
        help="comma separated query counts per request, each >= 1 (default 64,128,256,512,1024)",
    )
    ap.add_argument("--requests", type=positive_int, default=10, help="requests per batch size (>= 1)")
    ap.add_argument("--seed", type=non_negative_int, default=0)
    ap.add_argument(
        "--overwrite", action="store_true", help="replace --out when it already holds something (an earlier workload)"
    )
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    install_cli_handler()  # library progress lines (sparkgnn loggers) on stdout
    return run_cli(PROG, lambda: _run(args))


def _run(args) -> int:
    from sparkgnn.outputs import check_output

    check_output(args.out, {"--graph": args.graph}, overwrite=args.overwrite)  # before the work
    data = read_graph_dir(args.graph)
    wl = make_workload(data, args.batch_sizes, args.requests, args.seed)
    doc = write_workload(
        wl,
        args.out,
        {
            "source": os.path.abspath(args.graph),
            "seed": args.seed,
            "batch_sizes": args.batch_sizes,
            "requests_per_size": args.requests,
            "source_fingerprint": data.fingerprint,
        },
        overwrite=args.overwrite,
        inputs={"--graph": args.graph},
    )
    print(f"G: {wl.graph_G.summary()}\npool {doc['pool_size']} vertices, {doc['num_requests']} requests -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
