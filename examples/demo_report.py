"""A user's workflow, step 3: score the Spark output against the labels and against PyG's own run.

python examples/demo_report.py --graph data/cora --model data/models/cora_sage --out out/cora_pred
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import pyarrow.parquet as pq

from sparkgnn.graph import read_graph_dir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    data = read_graph_dir(args.graph)
    table = pq.read_table(args.out, columns=["id", "pred"])
    ids = table.column("id").to_numpy()
    pred = table.column("pred").to_numpy()
    order = data.index_of(ids)
    spark_pred = np.full(data.num_nodes, -1, dtype=np.int64)
    spark_pred[order] = pred
    test = data.mask("test")
    accuracy = float((spark_pred[test] == data.y[test]).mean())
    with open(os.path.join(args.model, "pyg_reference.json")) as fh:
        reference = json.load(fh)
    pyg_ids, pyg_pred = np.load(os.path.join(args.model, "pyg_pred.npy"))
    agree = float((spark_pred[data.index_of(pyg_ids)] == pyg_pred).mean())
    print(
        f"test accuracy   sparkgnn on Spark: {accuracy:.4f}   PyTorch Geometric: {reference['pyg_test_accuracy']:.4f}"
    )
    print(f"predictions identical to PyG on {agree * 100:.2f}% of {len(pyg_ids)} nodes")
    print(f"outputs: {os.path.abspath(args.out)} (Parquet: id, h, pred)")
    if abs(accuracy - reference["pyg_test_accuracy"]) > 1e-9 or agree < 1.0:
        print("MISMATCH between Spark output and PyG", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
