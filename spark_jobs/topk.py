"""Top-k candidates per node: each source's k best-scored candidates by the model's decoder.

    spark-submit spark_jobs/topk.py --graph DIR --model PATH --k 10 --out DIR \
        [--sources FILE] [--candidates FILE] [--exclude-edges] [--approx | --device cuda] [--report JSON]
        [--overwrite]
    spark-submit spark_jobs/topk.py --graph DIR --model PATH --eval HELD_OUT --out DIR \
        [--num-negatives N] [--candidates FILE] [--exclude-edges] [--report JSON]
    python spark_jobs/topk.py ...                 (creates a local session)

FILE: Parquet with an `id` column (default: every vertex). Node outputs come from the batch path
(sparkgnn.infer). Exact (default): tiles of sources x candidates across Spark tasks with a
per-source top-k merge (sparkgnn.linkpred.topk); `--device cuda` scores and selects each task's tiles
on its GPU (a local session without one is refused before anything runs). `--approx` (dot and cosine decoders): an HNSW
index per candidate shard (sparkgnn.linkpred.approx), built only where that costs less than exact
scoring unless `--index always` (else the answer is exact); the job then also runs the exact top-k
for a seeded sample of sources (--recall-sample, --seed) and logs recall@k. Ties rank the smaller
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

Typed graph and typed model: each relation (edge type; `--relation` as a key, a relation name
only one edge type has, or an index; default: the per-relation decoder's rows, or every relation
between output types) ranks sources of its source type against candidates of its destination
type. `--candidates TYPE` keeps the relations into TYPE (a type the graph lacks, or one another
named relation does not point to, is refused); `--candidates FILE` and `--sources FILE` hold ids
of those types. The output gains a relation column (the edge type key); `--exclude-edges` leaves
out the relation's own edges; `--approx` works as above, recall per relation. `--eval` reads a
relation column and writes one row per relation (sparkgnn.linkpred.typed).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from sparkgnn.cliargs import device_name, non_negative_int, positive_int, require_inputs, run_cli
from sparkgnn.layers.hetero import edge_key
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
    parser.add_argument(
        "--device",
        type=device_name,
        default="cpu",
        help="where the exact top-k scores its tiles: cpu, cuda or cuda:i (each task's GPU)",
    )
    parser.add_argument("--ef-search", type=positive_int, default=128, help="--approx: HNSW search list length")
    parser.add_argument(
        "--index",
        choices=("auto", "always"),
        default="auto",
        help="--approx: build the index only where it beats exact scoring (auto), or always",
    )
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
            "--candidates": None if _typed_graph(args.graph) else args.candidates,  # typed: a type or a file
            "--eval": args.eval,
        },
    )
    if args.device != "cpu" and (args.approx or args.eval is not None):
        parser.error(f"--device {args.device} scores the exact top-k; --approx and --eval run on the CPU")
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


def check_local_device(spark, device: str) -> None:
    """A local session's tasks run on this machine: a CUDA device it lacks is refused here, in one
    line, before anything runs (a cluster's executors answer for themselves, tiles.resolve_device)."""
    from sparkgnn.linkpred.pairs import PairsError
    from sparkgnn.linkpred.tiles import resolve_device

    if device != "cpu" and spark.sparkContext.master.startswith("local"):
        try:
            resolve_device(device)
        except ValueError as e:
            raise PairsError(f"--device {device}: {e}; nothing was written") from None


def _typed_graph(path: str) -> bool:
    from sparkgnn.graph.typed_io import is_typed_graph_dir

    try:
        return is_typed_graph_dir(path)
    except (OSError, ValueError):
        return False


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
    from sparkgnn.engine.typed import is_typed_source
    from sparkgnn.graph.spark_graph import Graph
    from sparkgnn.linkpred.approx import check_approx_decoder
    from sparkgnn.linkpred.nodes import node_outputs
    from sparkgnn.linkpred.pairs import PairsError, check_known, endpoints, read_ids, read_pairs
    from sparkgnn.linkpred.payload import model_decoder
    from sparkgnn.linkpred.topk import broadcast_scope
    from sparkgnn.models.model import Model

    inputs = {
        **input_paths(args.graph, args.model, args.work_dir),
        "--sources file": args.sources,
        "--candidates file": args.candidates,
        "--eval file": args.eval,
    }
    check_output(args.out, inputs, args.overwrite)
    _check_report(args, inputs)
    if is_typed_source(args.graph) or is_typed_source(args.model):
        return _run_typed(args)
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
    check_local_device(spark, args.device)
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
    with broadcast_scope():  # the candidates' broadcast goes once the output is written
        if held_out is not None:
            report = _evaluate(spark, args, nodes, decoder, held_out, sides, exclude, partitions)
        else:
            report = _topk(spark, args, nodes, decoder, sides, exclude, partitions, relations)
    report["seconds"] = round(time.perf_counter() - started, 3)
    if args.report:
        files.write_json_atomic(args.report, report, indent=2, sort_keys=True)
    return 0


def _run_typed(args) -> int:
    """Typed graph and typed model: per relation (edge type), sources of its source type ranked
    against candidates of its destination type (sparkgnn.linkpred.typed)."""
    from sparkgnn import files
    from sparkgnn.engine.session import job_session
    from sparkgnn.linkpred.approx import check_approx_decoder
    from sparkgnn.linkpred.pairs import PairsError, read_ids, read_pairs
    from sparkgnn.linkpred.topk import broadcast_scope
    from sparkgnn.linkpred.typed import (
        by_relation,
        check_typed_known,
        load_typed_graph,
        load_typed_model,
        pair_relations,
        relation_decoder,
        typed_node_outputs,
    )

    model = load_typed_model(args.graph, args.model)
    if args.approx:
        try:
            check_approx_decoder(model.decoder)
        except ValueError as e:
            raise PairsError(f"--model {args.model}: {e}") from None
    if args.eval is not None and args.relation:
        raise PairsError("--eval takes each held-out edge's relation from its relation column; drop --relation")
    started = time.perf_counter()
    spark = job_session("sparkgnn-topk")
    check_local_device(spark, args.device)
    graph = load_typed_graph(spark, args.graph, model)
    node_types, edge_types = graph.metadata()
    cand_type, cand_ids = None, None
    if args.candidates is not None:
        if args.candidates in node_types:
            cand_type = args.candidates
        elif files.exists(args.candidates):
            cand_ids = read_ids(spark, args.candidates, "--candidates")
        else:
            raise PairsError(
                f"--candidates {args.candidates} is neither a node type of graph {args.graph} "
                f"(it has {', '.join(node_types)}) nor a file; nothing was written"
            )
    held_out = None
    if args.eval is not None:
        held_out = read_pairs(spark, args.eval, "--eval", relation=True)
        if not held_out.limit(1).count():
            raise PairsError(f"--eval {args.eval} holds no edges")
        parts = by_relation(held_out, pair_relations(held_out, edge_types, f"--eval {args.eval}"))
        check_typed_known(graph, parts, f"--eval {args.eval}")
        relations = list(parts)
    else:
        relations = _typed_relations(args, model, edge_types, cand_type)
    try:
        decoders = {e: relation_decoder(model, e) for e in relations}
    except ValueError as e:
        raise PairsError(f"--model {args.model}: {e}; nothing was written") from None
    if cand_type is not None:
        wrong = [edge_key(e) for e in relations if e[2] != cand_type]
        if wrong:
            raise PairsError(
                f"--candidates {cand_type}: relation(s) {', '.join(wrong)} rank candidates of another type; "
                "nothing was written"
            )
    sources = None
    if args.sources is not None:
        sources = read_ids(spark, args.sources, "--sources")
    for flag, frame, side in (("--sources", sources, 0), ("--candidates", cand_ids, 2)):
        if frame is not None:
            for e in relations:
                _check_typed_ids(frame, graph.vertices[e[side]], f"{flag} {getattr(args, flag[2:])}", e[side])
    nodes = typed_node_outputs(
        spark,
        graph,
        model,
        types=sorted({t for e in relations for t in (e[0], e[2])}),
        out=args.out,
        partitions=args.partitions,
        work_dir=args.work_dir,
    )
    partitions = args.partitions or max(1, spark.sparkContext.defaultParallelism)
    common = {"candidates": cand_ids, "partitions": partitions}
    excludes = {e: graph.edges[e].select("src", "dst") if args.exclude_edges else None for e in relations}
    with broadcast_scope():  # each relation's candidate broadcast goes once the output is written
        if held_out is not None:
            report = _typed_evaluate(spark, args, nodes, decoders, parts, excludes, common)
        else:
            report = _typed_topk(spark, args, nodes, decoders, sources, excludes, common)
    report["seconds"] = round(time.perf_counter() - started, 3)
    if args.report:
        files.write_json_atomic(args.report, report, indent=2, sort_keys=True)
    return 0


def _typed_relations(args, model, edge_types, cand_type) -> list:
    """The edge types a typed top-k ranks: --relation's, else the per-relation decoder's rows or
    members (or, for another decoder, every edge type between output types), kept to those into
    --candidates TYPE."""
    from sparkgnn.decoders import PerRelationDecoder, RelationalDecoder
    from sparkgnn.linkpred.pairs import PairsError
    from sparkgnn.linkpred.typed import resolve_relation

    if args.relation:
        labels = [int(r) if r.isdigit() else r for r in args.relation]
        try:
            return list(dict.fromkeys(resolve_relation(edge_types, label) for label in labels))
        except ValueError as e:
            raise PairsError(f"--relation: {e}; nothing was written") from None
    if isinstance(model.decoder, (RelationalDecoder, PerRelationDecoder)):
        chosen = [resolve_relation(edge_types, key) for key in model.decoder.relations]
    else:
        chosen = [e for e in edge_types if e[0] in model.out_dims and e[2] in model.out_dims]
    if cand_type is not None:
        chosen = [e for e in chosen if e[2] == cand_type]
        if not chosen:
            raise PairsError(f"--candidates {cand_type}: no relation the model scores ranks candidates of that type")
    return chosen


def _check_typed_ids(ids, vertices, what: str, node_type: str) -> None:
    from sparkgnn.linkpred.pairs import PairsError, check_known

    try:
        check_known(ids, vertices, what)
    except PairsError as e:
        raise PairsError(f"{e} (node type {node_type!r})") from None


def _typed_topk(spark, args, nodes, decoders, sources, excludes, common) -> dict:
    from sparkgnn.linkpred.approx import IndexParams, recall_at_k, sample_sources
    from sparkgnn.linkpred.typed import as_candidate, as_source, relation_topk_frame
    from sparkgnn.outputs import write_parquet_staged

    params = IndexParams(ef_search=args.ef_search, when=args.index)
    frames = [
        relation_topk_frame(
            nodes,
            e,
            dec,
            args.k,
            sources=sources,
            exclude=excludes[e],
            approx=args.approx,
            params=params,
            device=args.device,
            **common,
        )
        for e, dec in decoders.items()
    ]
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    write_parquet_staged(result, args.out)
    written = spark.read.parquet(args.out)
    rows = written.count()
    log.info("topk: wrote %d rows (k=%d, %d relation(s)%s) to %s", rows, args.k, len(decoders),
             ", approximate" if args.approx else "", args.out)  # fmt: skip
    report: dict = {"k": args.k, "approx": bool(args.approx), "rows": rows, "relations": list(map(edge_key, decoders))}
    if args.approx and args.recall_sample:
        recalls = {}
        for e, dec in decoders.items():
            pool = sources if sources is not None else nodes[e[0]].select("id")
            sample = sample_sources(pool, args.recall_sample, args.seed).cache()
            exact = relation_topk_frame(nodes, e, dec, args.k, sources=sample, exclude=excludes[e], **common)
            mine = written.where(written["relation"] == edge_key(e)).join(sample.withColumnRenamed("id", "src"), "src")
            mapped = lambda f: as_candidate(as_source(f, "src"), "dst")  # noqa: E731  (recall_at_k pairs on ids)
            recall, checked = recall_at_k(mapped(mine), mapped(exact))
            sample.unpersist()
            log.info("topk: recall@%d of the approximate top-k for %s = %.4f on %d sampled sources (seed %d)",
                     args.k, edge_key(e), recall, checked, args.seed)  # fmt: skip
            recalls[edge_key(e)] = {f"recall@{args.k}": recall, "recall_sources": checked}
        report.update({"recall": recalls, "seed": args.seed})
    return report


def _typed_evaluate(spark, args, nodes, decoders, parts, excludes, common) -> dict:
    from sparkgnn.linkpred.evaluate import metrics_of
    from sparkgnn.linkpred.typed import relation_counts
    from sparkgnn.outputs import write_parquet_staged

    if args.num_negatives is None:
        negatives = "all candidates" + (" less known edges" if args.exclude_edges else "")
    else:
        negatives = f"{args.num_negatives} sampled (seed {args.seed})"
    rows = []
    for e, dec in decoders.items():
        counts = relation_counts(
            nodes, e, dec, parts[e], exclude=excludes[e], num_negatives=args.num_negatives, seed=args.seed, **common
        )
        metrics = metrics_of(counts)
        rows.append({"relation": edge_key(e), "negatives": negatives, **metrics})
        shown = ", ".join(f"{name} {value:.4f}" for name, value in metrics.items() if name != "positives")
        log.info("topk: eval of %d held-out %s edges vs %s: %s", metrics["positives"], edge_key(e), negatives, shown)
    columns = ["relation", "negatives", *(name for name in rows[0] if name not in ("relation", "negatives"))]
    write_parquet_staged(spark.createDataFrame(rows).select(*columns), args.out)
    return {"relations": {row["relation"]: row for row in rows}}


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
        result = per_relation_topk_frame(nodes, decoder, args.k, relations, device=args.device, **options)
    elif args.approx:
        params = IndexParams(ef_search=args.ef_search, when=args.index)
        result = approx_topk_frame(nodes, decoder, args.k, params=params, **options)
    else:
        result = topk_frame(nodes, decoder, args.k, device=args.device, **options)
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
