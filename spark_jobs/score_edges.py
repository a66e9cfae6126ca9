"""Edge scoring: the model's decoder over given node pairs, from the batch path's node outputs.

    spark-submit spark_jobs/score_edges.py --graph DIR --model PATH --pairs PAIRS --out DIR [--overwrite]
    python spark_jobs/score_edges.py ...                 (creates a local session)

PAIRS: Parquet with src and dst columns (vertex ids), and a relation column (an integer index or
a relation name) when the decoder is per-relation (DistMult, TransE); relations the decoder lacks
are refused. The model must carry a decoder (Model.from_pyg(encoder, decoder=module)). When the
pairs name at least half the vertices (an approximate distinct count) every vertex's output is
computed; otherwise only the pairs' endpoints' k-hop neighbourhoods (sparkgnn.infer with ids).
The outputs are broadcast to the tasks and gathered by position into each Arrow batch of pairs,
or joined onto the pairs when too large to broadcast (sparkgnn.linkpred.scoring). Output Parquet
under --out: src (long), dst (long), the relation as given (per-relation decoders), score
(float). Pairs with a null id or naming ids the graph lacks are refused with nothing written
(found by the scoring pass: fewer rows scored than pairs read); --out as for batch_inference.py
(refused when non-empty unless --overwrite; staged, then swapped in). User errors: one line on
stderr, exit 2.

Typed graph and typed model (HeteroModel.from_pyg(..., decoder=)): every pair names its relation,
an edge type key (author__writes__paper), a relation name only one edge type has, or an index into
the graph's edge types; src is a vertex of the relation's source type, dst of its destination type.
Only those rows' upstream is computed (typed inference with ids), and each relation's pairs are
scored from the two types' outputs by the decoder (bound to the relation's row when it is per
relation; sparkgnn.linkpred.typed). A relation the graph lacks, or an id missing in its type, is
refused before anything is written.
"""

from __future__ import annotations

import argparse
import sys
import time

from sparkgnn.cliargs import positive_int, require_inputs, run_cli
from sparkgnn.logs import install_cli_handler
from sparkgnn.outputs import check_output
from sparkgnn.planner import STRATEGIES


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="score_edges.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", required=True, help="graph directory (vertices/, edges/, graph.json)")
    parser.add_argument("--model", required=True, help="model saved with a decoder (Model.from_pyg(..., decoder=))")
    parser.add_argument("--pairs", required=True, help="Parquet of node pairs: columns src, dst[, relation]")
    parser.add_argument("--out", required=True, help="output directory (Parquet: src, dst, score)")
    parser.add_argument("--strategy", default="auto", choices=["auto", *STRATEGIES], help="data movement per layer")
    parser.add_argument("--partitions", type=positive_int, default=None, help="number of partitions")
    parser.add_argument("--work-dir", default=None, help="where prepared graph layouts and models are cached")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier result in --out")
    args = parser.parse_args(argv)
    require_inputs(parser, {"--graph": args.graph, "--model": args.model, "--pairs": args.pairs})
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    install_cli_handler()
    return run_cli("score_edges", lambda: _run(args))


def _run(args) -> int:
    from sparkgnn.engine.api import input_paths
    from sparkgnn.engine.session import job_session
    from sparkgnn.engine.typed import is_typed_source
    from sparkgnn.errors import GraphValidationError
    from sparkgnn.graph.spark_graph import Graph
    from sparkgnn.linkpred.nodes import node_outputs, pairs_cover_graph
    from sparkgnn.linkpred.pairs import PairsError, check_relations, endpoints, read_pairs, refuse_bad_pairs
    from sparkgnn.linkpred.payload import model_decoder
    from sparkgnn.linkpred.scoring import write_scores
    from sparkgnn.models.model import Model

    inputs = {**input_paths(args.graph, args.model, args.work_dir), "--pairs file": args.pairs}
    check_output(args.out, inputs, args.overwrite)
    if is_typed_source(args.graph) or is_typed_source(args.model):
        return _run_typed(args)
    model = Model.load(args.model)
    try:
        decoder = model_decoder(model)
    except ValueError as e:
        raise PairsError(f"--model {args.model}: {e}") from None
    started = time.perf_counter()
    spark = job_session("sparkgnn-score-edges")
    graph = Graph.load(spark, args.graph)
    what = f"--pairs {args.pairs}"
    # null and unknown ids are found by the scoring pass itself (write_scores), not a scan of their own
    pairs = read_pairs(spark, args.pairs, relation=decoder.relational, check_nulls=False)
    pair_count = pairs.count()
    if not pair_count:
        raise PairsError(f"{what} holds no pairs")
    if decoder.relational:
        check_relations(pairs, decoder, what)
    num_vertices = graph.stats()["num_vertices"]
    ends = None if pairs_cover_graph(pairs, pair_count=pair_count, num_vertices=num_vertices) else endpoints(pairs)
    try:
        nodes = node_outputs(
            spark,
            graph,
            model,
            ids=ends,
            out=args.out,
            partitions=args.partitions,
            strategy=args.strategy,
            work_dir=args.work_dir,
        )
    except GraphValidationError:
        if ends is not None:  # infer refused ids the graph lacks: name them as the pairs' fault
            refuse_bad_pairs(pairs, graph.vertices, what)
        raise
    node_count = num_vertices if ends is None else nodes.count()
    rows = write_scores(
        spark,
        nodes,
        pairs,
        decoder,
        args.out,
        pair_count=pair_count,
        node_count=node_count,
        vertices=graph.vertices,
        what=what,
    )
    print(f"score_edges: wrote {rows} scored pairs to {args.out} in {time.perf_counter() - started:.1f} s")
    return 0


def _run_typed(args) -> int:
    """Typed graph and typed model: pairs name their relation (sparkgnn.linkpred.typed)."""
    from sparkgnn.engine.session import job_session
    from sparkgnn.linkpred.pairs import PairsError, read_pairs
    from sparkgnn.linkpred.typed import (
        by_relation,
        check_typed_known,
        load_typed_graph,
        load_typed_model,
        pair_endpoints,
        pair_relations,
        relation_decoder,
        score_typed_pairs,
        typed_node_outputs,
    )
    from sparkgnn.outputs import write_parquet_staged

    model = load_typed_model(args.graph, args.model)
    started = time.perf_counter()
    spark = job_session("sparkgnn-score-edges")
    graph = load_typed_graph(spark, args.graph, model)
    what = f"--pairs {args.pairs}"
    pairs = read_pairs(spark, args.pairs, relation=True)
    if not pairs.limit(1).count():
        raise PairsError(f"{what} holds no pairs")
    relations = pair_relations(pairs, graph.metadata()[1], what)
    parts = by_relation(pairs, relations)
    try:
        decoders = {e: relation_decoder(model, e) for e in parts}
    except ValueError as e:
        raise PairsError(f"{what}: {e}; nothing was written") from None
    check_typed_known(graph, parts, what)
    nodes = typed_node_outputs(
        spark,
        graph,
        model,
        ids=pair_endpoints(parts),
        out=args.out,
        partitions=args.partitions,
        strategy=args.strategy,
        work_dir=args.work_dir,
    )
    write_parquet_staged(score_typed_pairs(nodes, parts, decoders), args.out)
    rows = spark.read.parquet(args.out).count()
    print(f"score_edges: wrote {rows} scored pairs to {args.out} in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
