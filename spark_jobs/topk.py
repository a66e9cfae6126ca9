"""Top-k candidates per node: each source's k best-scored candidates by the model's decoder.

    spark-submit spark_jobs/topk.py --graph DIR --model PATH --k 10 --out DIR \
        [--sources FILE] [--candidates FILE] [--exclude-edges] [--approx] [--report JSON] [--overwrite]
    spark-submit spark_jobs/topk.py --graph DIR --model PATH --eval HELD_OUT --out DIR \
        [--num-negatives N] [--candidates FILE] [--exclude-edges] [--report JSON]
    python spark_jobs/topk.py ...                 (creates a local session)

FILE: Parquet with an `id` column (default: every vertex). Node outputs come from the batch path
(sparkgnn.infer). Exact (default): tiles of sources x candidates across Spark tasks with a
per-source top-k merge (sparkgnn.linkpred.topk). `--approx` (dot and cosine decoders): an HNSW
index per candidate shard (sparkgnn.linkpred.approx); the job then also runs the exact top-k for a
seeded sample of sources (--recall-sample, --seed) and logs recall@k. Ties rank the smaller
candidate id first. `--exclude-edges` never returns a candidate the source already has an edge to.
Output Parquet under --out: src, dst, score, rank (1 = best). A per-relation decoder (DistMult,
TransE) ranks each source's candidates once per relation: `--relation R` (repeatable; an index or
a name of the decoder's relations; default: every relation), the output then has a relation
column after src (the name when the decoder has names, else the index); --approx and --eval
refuse such a decoder.

`--eval HELD_OUT` (Parquet src, dst: held-out positive edges) writes no top-k: each positive is
ranked against every candidate (or --num-negatives sampled ones, seeded by --seed) as OGB's
evaluator ranks it (sparkgnn.linkpred.evaluate), and --out gets one row: positives, negatives,
mrr, hits@1, hits@10, hits@50. `--report JSON` also writes the recall or the metrics as JSON.
--out as for batch_inference.py. User errors: one line on stderr, exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from sparkgnn.cliargs import non_negative_int, positive_int, require_inputs, run_cli
from sparkgnn.logs import install_cli_handler
from sparkgnn.outputs import check_output

log = logging.getLogger("sparkgnn.topk")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="topk.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", required=True, help="graph directory (vertices/, edges/, graph.json)")
    parser.add_argument("--model", required=True, help="model saved with a decoder (Model.from_pyg(..., decoder=))")
    parser.add_argument("--k", type=positive_int, default=None, help="candidates kept per source (>= 1)")
    parser.add_argument("--out", required=True, help="output directory (Parquet: src, dst, score, rank)")
    parser.add_argument("--sources", default=None, help="Parquet with an id column: the sources (default: all)")
    parser.add_argument("--candidates", default=None, help="Parquet with an id column: the candidates (default: all)")
    parser.add_argument("--exclude-edges", action="store_true", help="never return a source's known neighbours")
    parser.add_argument(
        "--relation", action="append", default=None, help="per-relation decoders: rank for this relation (repeatable)"
    )
    parser.add_argument("--approx", action="store_true", help="approximate top-k through a vector index")
    parser.add_argument("--ef-search", type=positive_int, default=128, help="--approx: HNSW search list length")
    parser.add_argument(
        "--recall-sample", type=non_negative_int, default=100, help="--approx: sources checked exactly (0: none)"
    )
    parser.add_argument("--eval", default=None, help="Parquet (src, dst) of held-out edges: write MRR / hits@K")
    parser.add_argument(
        "--num-negatives", type=positive_int, default=None, help="--eval: sampled negatives per positive (default: all)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the recall sample and the sampled negatives")
    parser.add_argument("--report", default=None, help="also write the recall (--approx) or metrics (--eval) as JSON")
    parser.add_argument("--partitions", type=positive_int, default=None, help="source blocks and candidate tiles")
    parser.add_argument("--work-dir", default=None, help="where prepared graph layouts and models are cached")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier result in --out / --report")
    args = parser.parse_args(argv)
    require_inputs(
        parser,
        {
            "--graph": args.graph,
            "--model": args.model,
            "--sources": args.sources,
            "--candidates": args.candidates,
            "--eval": args.eval,
        },
    )
    if args.eval is None:
        if args.k is None:
            parser.error("--k is required (or --eval HELD_OUT to evaluate)")
        if args.num_negatives is not None:
            parser.error("--num-negatives goes with --eval")
    else:
        if args.approx:
            parser.error("--eval ranks every positive exactly; drop --approx")
        if args.num_negatives is not None and args.exclude_edges:
            parser.error("--exclude-edges filters the full ranking; sampled negatives (--num-negatives) are unfiltered")
        if args.sources is not None or args.k is not None:
            parser.error(
                "--eval takes its sources from the held-out edges and reports hits@1/10/50; drop --sources/--k"
            )
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    install_cli_handler()
    return run_cli("topk", lambda: _run(args))


def _check_report(args, inputs: dict) -> None:
    from sparkgnn import files
    from sparkgnn.errors import OutputError

    if args.report is None:
        return
    check_output(args.report, {**inputs, "--out": args.out}, overwrite=args.overwrite, flag="--report")
    if files.kind(args.report) == "dir":
        raise OutputError(f"--report {args.report} is a directory; name the JSON file to write")


def _run(args) -> int:
    from sparkgnn import files
    from sparkgnn.engine.api import input_paths
    from sparkgnn.engine.session import job_session
    from sparkgnn.graph.spark_graph import Graph
    from sparkgnn.linkpred.approx import check_approx_decoder
    from sparkgnn.linkpred.nodes import node_outputs
    from sparkgnn.linkpred.pairs import PairsError, check_known, endpoints, read_ids, read_pairs
    from sparkgnn.linkpred.payload import model_decoder
    from sparkgnn.models.model import Model

    inputs = {
        **input_paths(args.graph, args.model, args.work_dir),
        "--sources file": args.sources,
        "--candidates file": args.candidates,
        "--eval file": args.eval,
    }
    check_output(args.out, inputs, args.overwrite)
    _check_report(args, inputs)
    model = Model.load(args.model)
    try:
        decoder = model_decoder(model)
        relations = _relations(args, decoder)
        if args.approx:
            check_approx_decoder(decoder)
    except ValueError as e:
        raise PairsError(f"--model {args.model}: {e}") from None
    started = time.perf_counter()
    spark = job_session("sparkgnn-topk")
    graph = Graph.load(spark, args.graph)
    sides = {}
    for flag, path in (("--sources", args.sources), ("--candidates", args.candidates)):
        if path is not None:
            sides[flag] = read_ids(spark, path, flag)
            check_known(sides[flag], graph.vertices, f"{flag} {path}")
    held_out = None
    if args.eval is not None:
        held_out = read_pairs(spark, args.eval, "--eval")
        ends = endpoints(held_out)
        if not ends.limit(1).count():
            raise PairsError(f"--eval {args.eval} holds no edges")
        check_known(ends, graph.vertices, f"--eval {args.eval}")
    nodes = node_outputs(spark, graph, model, out=args.out, partitions=args.partitions, work_dir=args.work_dir)
    partitions = args.partitions or max(1, spark.sparkContext.defaultParallelism)
    exclude = graph.edges.select("src", "dst") if args.exclude_edges else None
    if held_out is not None:
        report = _evaluate(spark, args, nodes, decoder, held_out, sides, exclude, partitions)
    else:
        report = _topk(spark, args, nodes, decoder, sides, exclude, partitions, relations)
    report["seconds"] = round(time.perf_counter() - started, 3)
    if args.report:
        files.write_json_atomic(args.report, report, indent=2, sort_keys=True)
    return 0


def _relations(args, decoder) -> list:
    """The relations a per-relation decoder ranks for (--relation, default all; ValueError for
    one it lacks), [] for another decoder (which refuses --relation)."""
    if not decoder.relational:
        if args.relation:
            raise ValueError(f"the {decoder.kind} decoder takes no relation; drop --relation")
        return []
    if args.eval is not None:
        raise ValueError(f"--eval does not rank per relation yet; the {decoder.kind} decoder needs one per pair")
    wanted = args.relation or (list(decoder.relations) if decoder.relations else list(range(decoder.num_relations)))
    labels = [int(r) if isinstance(r, str) and r.isdigit() and decoder.relations is None else r for r in wanted]
    for label in labels:
        decoder.bind(label)  # refuses one the decoder lacks
    return list(dict.fromkeys(labels))


def _topk(spark, args, nodes, decoder, sides, exclude, partitions, relations) -> dict:
    from sparkgnn.linkpred.approx import IndexParams, approx_topk_frame, recall_at_k, sample_sources
    from sparkgnn.linkpred.topk import per_relation_topk_frame, topk_frame
    from sparkgnn.outputs import write_parquet_staged

    options = {
        "sources": sides.get("--sources"),
        "candidates": sides.get("--candidates"),
        "exclude": exclude,
        "partitions": partitions,
    }
    if relations:
        result = per_relation_topk_frame(nodes, decoder, args.k, relations, **options)
    elif args.approx:
        params = IndexParams(ef_search=args.ef_search)
        result = approx_topk_frame(nodes, decoder, args.k, params=params, **options)
    else:
        result = topk_frame(nodes, decoder, args.k, **options)
    write_parquet_staged(result, args.out)
    written = spark.read.parquet(args.out)
    rows = written.count()
    log.info("topk: wrote %d rows (k=%d%s) to %s", rows, args.k, ", approximate" if args.approx else "", args.out)
    report = {"k": args.k, "approx": bool(args.approx), "rows": rows}
    if relations:
        report["relations"] = relations
    if args.approx and args.recall_sample:
        pool = options["sources"] if options["sources"] is not None else nodes.select("id")
        sample = sample_sources(pool, args.recall_sample, args.seed).cache()
        exact = topk_frame(nodes, decoder, args.k, **{**options, "sources": sample})
        recall, checked = recall_at_k(written.join(sample.withColumnRenamed("id", "src"), on="src"), exact)
        sample.unpersist()
        log.info("topk: recall@%d of the approximate top-k = %.4f on %d sampled sources (seed %d)",
                 args.k, recall, checked, args.seed)  # fmt: skip
        report.update({f"recall@{args.k}": recall, "recall_sources": checked, "seed": args.seed})
    return report


def _evaluate(spark, args, nodes, decoder, held_out, sides, exclude, partitions) -> dict:
    from sparkgnn.linkpred.evaluate import full_counts, metrics_of, sampled_counts
    from sparkgnn.outputs import write_parquet_staged

    candidates = sides.get("--candidates")
    if args.num_negatives is None:
        counts = full_counts(nodes, held_out, decoder, candidates=candidates, exclude=exclude, partitions=partitions)
        negatives = "all candidates" + (" less known edges" if exclude is not None else "")
    else:
        pool = candidates if candidates is not None else nodes.select("id")
        counts = sampled_counts(nodes, held_out, decoder, pool, args.num_negatives, args.seed)
        negatives = f"{args.num_negatives} sampled (seed {args.seed})"
    metrics = metrics_of(counts)
    row = {"negatives": negatives, **metrics}
    write_parquet_staged(spark.createDataFrame([row]), args.out)
    log.info("topk: eval of %d held-out edges against %s: %s", metrics["positives"], negatives,
             ", ".join(f"{name} {value:.4f}" for name, value in metrics.items() if name != "positives"))  # fmt: skip
    return row


if __name__ == "__main__":
    sys.exit(main())
