"""Link prediction on typed graphs: pairs, top-k and evaluation per relation (edge type).

A pair of a typed graph names its relation: an edge type key (`author__writes__paper`), a relation
name that only one edge type of the graph has (`writes`), or an integer index into the graph's
edge types (graph.json's order). The pair's src is a vertex of the relation's source type and its
dst one of the destination type (ids are per type), so its score reads the typed model's output
of the src type for src and of the dst type for dst; the model's decoder scores it, bound to the
relation when it is per relation (DistMult, TransE: one row per edge type, models/hetero.py
`set_decoder`), the relation's own member decoder for a per_relation container (one decoder
module per edge type, decoders/per_relation.py), the same decoder for every relation otherwise.

Node outputs come from the typed batch path (engine/typed.py): `ids={type: ids}` for scoring
(only the pairs' endpoints and what they read are computed), `types=` for top-k and evaluation.

WHY top-k and evaluation map ids into one space (`bipartite`): the homogeneous top-k, approximate
top-k and evaluation (topk.py, approx.py, evaluate.py) read ONE (id, h) frame for both sides. A
relation's source rows go in as 2*id and its destination rows as 2*id+1 (the mapping the typed
engine uses for a relation's graph, engine/typed.py), so the two types' ids never collide, a type
whose relation points into itself appears on both sides, and the order of ids within a side, which
breaks ties, is kept; the results are mapped back (`unmap`). Ids must lie within +-2^62.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import torch

from sparkgnn.decoders import Decoder, PerRelationDecoder, RelationalDecoder
from sparkgnn.layers.hetero import EdgeType, edge_key, resolve_relation
from sparkgnn.linkpred.arrays import ids, matrix
from sparkgnn.linkpred.pairs import MAX_RELATIONS, RELATION, SHOWN, PairsError
from sparkgnn.linkpred.payload import DecoderPayload

if TYPE_CHECKING:  # pyspark is imported inside functions only (docs/ARCHITECTURE.md)
    from pyspark.sql import DataFrame, SparkSession

    from sparkgnn.graph.typed_spark import TypedGraph
    from sparkgnn.models.hetero import HeteroModel

log = logging.getLogger(__name__)


def load_typed_model(graph: str, model: str) -> HeteroModel:
    """The HeteroModel of a typed link-prediction job (its --graph and --model directories);
    PairsError (one line) when only one of them is typed or the model has no decoder."""
    from sparkgnn.engine.typed import is_typed_source
    from sparkgnn.graph.typed_io import is_typed_graph_dir
    from sparkgnn.models.hetero import HeteroModel

    if not is_typed_source(model):
        raise PairsError(f"--graph {graph} is typed (node and edge types) but --model {model} is not")
    if not is_typed_graph_dir(graph):
        raise PairsError(f"--model {model} is typed (node and edge types) but --graph {graph} is not")
    loaded = HeteroModel.load(model)
    if loaded.decoder is None:
        raise PairsError(
            f"--model {model}: the typed model has no decoder; convert it with "
            "HeteroModel.from_pyg(module, metadata, decoder=module) to score pairs"
        )
    return loaded


def load_typed_graph(spark: SparkSession, path: str, model: HeteroModel) -> TypedGraph:
    """The TypedGraph at `path` (validated unless its graph.json vouches for it); PairsError (one
    line) when its types differ from the model's."""
    from sparkgnn.errors import UnsupportedModelError
    from sparkgnn.graph.typed_spark import TypedGraph

    graph = TypedGraph.load(spark, path)
    try:
        model.check_metadata(graph.metadata(), where=f"graph {path}")
    except UnsupportedModelError as e:
        raise PairsError(str(e)) from None
    return graph


def relation_decoder(model: HeteroModel, edge_type: EdgeType) -> Decoder:
    """The model's decoder for pairs of `edge_type`: bound to its row when per relation, its
    member for a per_relation container; ValueError (one line) when the model has no decoder, no
    outputs of either end's type, or no row / member for it."""
    decoder = model.decoder
    key = edge_key(edge_type)
    if decoder is None:
        raise ValueError(
            "the typed model has no decoder; convert it with HeteroModel.from_pyg(module, metadata, decoder=...)"
        )
    missing = [t for t in (edge_type[0], edge_type[2]) if t not in model.out_dims]
    if missing:
        raise ValueError(f"relation {key}: the model gives no outputs for node type(s) {missing}")
    if isinstance(decoder, PerRelationDecoder):
        return decoder.member(key)
    if isinstance(decoder, RelationalDecoder):
        if decoder.relations is None or key not in decoder.relations:
            raise ValueError(f"the {decoder.kind} decoder has no row for relation {key} (it has {decoder.relations})")
        return decoder.bind(key)
    return decoder


def pair_relations(pairs: DataFrame, edge_types: Sequence[EdgeType], what: str) -> dict[Any, EdgeType]:
    """{relation value as the pairs give it: edge type} of every distinct RELATION value of
    `pairs`; PairsError (one line, nothing written) for one that names no edge type."""
    values = [r[RELATION] for r in pairs.select(RELATION).distinct().limit(MAX_RELATIONS + 1).collect()]
    if len(values) > MAX_RELATIONS:
        raise PairsError(f"{what} name more than {MAX_RELATIONS} distinct relations")
    out: dict[Any, EdgeType] = {}
    for value in values:
        try:
            out[value] = resolve_relation(edge_types, value)
        except ValueError as e:
            raise PairsError(f"{what}: {e}; nothing was written") from None
    return out


def by_relation(pairs: DataFrame, relations: Mapping[Any, EdgeType]) -> dict[EdgeType, DataFrame]:
    """The pairs of each edge type (whatever value named it)."""
    from pyspark.sql import functions as F

    wanted: dict[EdgeType, list] = {}
    for value, edge_type in relations.items():
        wanted.setdefault(edge_type, []).append(value)
    return {e: pairs.where(F.col(RELATION).isin(values)) for e, values in wanted.items()}


def check_typed_known(graph: TypedGraph, parts: Mapping[EdgeType, DataFrame], what: str) -> None:
    """Refuse (PairsError, one line) a pair whose src is not a vertex of its relation's source type
    or whose dst is not one of its destination type."""
    from pyspark.sql import functions as F

    for edge_type, part in parts.items():
        for column, node_type in (("src", edge_type[0]), ("dst", edge_type[2])):
            unknown = (
                part.select(F.col(column).alias("id"))
                .distinct()
                .join(graph.vertices[node_type].select("id"), "id", "left_anti")
            )
            shown = sorted(r.id for r in unknown.limit(SHOWN).collect())
            if shown:
                count = unknown.count()
                raise PairsError(
                    f"{what}: {count} {column} id(s) of relation {edge_key(edge_type)} are not vertices of type "
                    f"{node_type!r} (e.g. {', '.join(map(str, shown))}); nothing was written"
                )


def pair_endpoints(parts: Mapping[EdgeType, DataFrame]) -> dict[str, DataFrame]:
    """{node type: distinct ids (an `id` column)} the pairs of every relation name."""
    from pyspark.sql import functions as F

    frames: dict[str, list[DataFrame]] = {}
    for (s, _, d), part in parts.items():
        frames.setdefault(s, []).append(part.select(F.col("src").alias("id")))
        frames.setdefault(d, []).append(part.select(F.col("dst").alias("id")))
    out = {}
    for t, listed in frames.items():
        frame = listed[0]
        for more in listed[1:]:
            frame = frame.union(more)
        out[t] = frame.distinct()
    return out


def typed_node_outputs(
    spark: SparkSession,
    graph: TypedGraph,
    model: HeteroModel,
    *,
    ids: Mapping[str, DataFrame] | None = None,
    types: Sequence[str] | None = None,
    out: str | None = None,
    partitions: int | None = None,
    strategy: str = "auto",
    work_dir: str | None = None,
) -> dict[str, DataFrame]:
    """{node type: (id, h)} from the typed batch path: the rows `ids` reads (pruned, module doc)
    or every row of `types`. `out`: the job's output, beside which the default work dir lies."""
    from sparkgnn.engine.typed import infer_typed

    work = work_dir
    if work is None and out is not None:
        head = os.path.dirname(os.path.abspath(out)) if "://" not in out else out.rstrip("/").rpartition("/")[0]
        work = f"{head}/_sparkgnn_work"
    job = infer_typed(
        spark,
        graph,
        model,
        ids=dict(ids) if ids is not None else None,
        types=list(types) if types is not None else None,
        partitions=partitions,
        strategy=strategy,
        work_dir=work,
        validate=False,
    )
    return {t: frame.select("id", "h") for t, frame in job.frames.items()}


def score_typed_pairs(
    nodes: Mapping[str, DataFrame], parts: Mapping[EdgeType, DataFrame], decoders: Mapping[EdgeType, Decoder]
) -> DataFrame:
    """(src, dst, relation as the pairs give it, score) of every pair: per relation, the source
    type's outputs joined onto src and the destination type's onto dst, scored in Arrow batches by
    that relation's decoder."""
    from pyspark.sql import functions as F

    result = None
    for edge_type, part in parts.items():
        s, _, d = edge_type
        payload = DecoderPayload.of(decoders[edge_type])
        joined = (
            part.join(nodes[s].select(F.col("id").alias("src"), F.col("h").alias("h_src")), on="src")
            .join(nodes[d].select(F.col("id").alias("dst"), F.col("h").alias("h_dst")), on="dst")
            .select("src", "dst", RELATION, "h_src", "h_dst")
        )
        schema = f"src long, dst long, {RELATION} {part.schema[RELATION].dataType.simpleString()}, score float"
        frame = joined.mapInArrow(_scorer(payload), schema)
        result = frame if result is None else result.unionByName(frame)
    if result is None:
        raise PairsError("there are no pairs to score")
    return result


def _scorer(payload: DecoderPayload):
    def run(batches):
        torch.set_num_threads(1)
        built = payload.build()
        for batch in batches:
            if len(batch):
                h_src = torch.from_numpy(matrix(batch.column("h_src")))
                h_dst = torch.from_numpy(matrix(batch.column("h_dst")))
                scores = built(h_src, h_dst).numpy().astype(np.float32)
            else:
                scores = np.zeros(0, np.float32)
            yield pa.RecordBatch.from_arrays(
                [pa.array(ids(batch.column("src"))), pa.array(ids(batch.column("dst"))), batch.column(RELATION),
                 pa.array(scores, pa.float32())],
                names=["src", "dst", RELATION, "score"],
            )  # fmt: skip

    return run


# -- one id space for a relation's two sides (module doc) -------------------------------------------
def as_source(frame: DataFrame, column: str = "id") -> DataFrame:
    """`frame` with `column` mapped to the source side's ids (2 * id)."""
    from pyspark.sql import functions as F

    return frame.withColumn(column, F.col(column) * F.lit(2))


def as_candidate(frame: DataFrame, column: str = "id") -> DataFrame:
    """`frame` with `column` mapped to the candidate side's ids (2 * id + 1)."""
    from pyspark.sql import functions as F

    return frame.withColumn(column, F.col(column) * F.lit(2) + F.lit(1))


def bipartite(sources: DataFrame, candidates: DataFrame) -> DataFrame:
    """One (id, h) frame of a relation's source-type and destination-type outputs, ids mapped."""
    return as_source(sources.select("id", "h")).unionByName(as_candidate(candidates.select("id", "h")))


def mapped_edges(edges: DataFrame) -> DataFrame:
    """A relation's (src, dst) edges in the mapped ids (to exclude known edges)."""
    return as_candidate(as_source(edges.select("src", "dst"), "src"), "dst")


def unmap(frame: DataFrame) -> DataFrame:
    """`frame` with its src and dst columns mapped back to the types' own ids."""
    from pyspark.sql import functions as F

    return frame.withColumn("src", F.shiftright("src", 1)).withColumn("dst", F.shiftright("dst", 1))


def relation_topk_frame(
    nodes: Mapping[str, DataFrame],
    edge_type: EdgeType,
    decoder: Decoder,
    k: int,
    *,
    sources: DataFrame | None = None,
    candidates: DataFrame | None = None,
    exclude: DataFrame | None = None,
    partitions: int = 2,
    approx: bool = False,
    params: Any = None,
    device: str = "cpu",
) -> DataFrame:
    """(src, relation, dst, score, rank) of each source's k best candidates for `edge_type`: the
    homogeneous exact (or approximate) top-k over the relation's mapped ids (module doc). `nodes`:
    {type: (id, h)}; `sources` / `candidates`: `id` frames of the source / destination type (None:
    every row of the type); `exclude`: (src, dst) pairs of the types' own ids never returned;
    `decoder`: the relation's (relation_decoder); `device`: where the exact top-k scores
    (topk_frame)."""
    from pyspark.sql import functions as F

    from sparkgnn.linkpred.approx import IndexParams, approx_topk_frame
    from sparkgnn.linkpred.topk import topk_frame

    s, _, d = edge_type
    options: dict[str, Any] = {
        "sources": as_source((sources if sources is not None else nodes[s]).select("id")),
        "candidates": as_candidate((candidates if candidates is not None else nodes[d]).select("id")),
        "exclude": None if exclude is None else mapped_edges(exclude),
        "partitions": partitions,
    }
    both = bipartite(nodes[s], nodes[d])
    if approx:
        frame = approx_topk_frame(both, decoder, k, params=params or IndexParams(), **options)
    else:
        frame = topk_frame(both, decoder, k, device=device, **options)
    return unmap(frame).withColumn(RELATION, F.lit(edge_key(edge_type))).select("src", RELATION, "dst", "score", "rank")


def relation_counts(
    nodes: Mapping[str, DataFrame],
    edge_type: EdgeType,
    decoder: Decoder,
    positives: DataFrame,
    *,
    candidates: DataFrame | None = None,
    exclude: DataFrame | None = None,
    num_negatives: int | None = None,
    seed: int = 0,
    partitions: int = 2,
) -> DataFrame:
    """(src, dst, greater, at_least) of each held-out (src, dst) of `edge_type` ranked against the
    destination type's candidates (evaluate.py: every candidate, less `exclude`, or
    `num_negatives` seeded samples), in mapped ids (only the counts are read from it)."""
    from sparkgnn.linkpred.evaluate import full_counts, sampled_counts

    s, _, d = edge_type
    both = bipartite(nodes[s], nodes[d])
    pool = as_candidate((candidates if candidates is not None else nodes[d]).select("id"))
    pos = as_candidate(as_source(positives.select("src", "dst"), "src"), "dst")
    if num_negatives is None:
        mapped = None if exclude is None else mapped_edges(exclude)
        return full_counts(both, pos, decoder, candidates=pool, exclude=mapped, partitions=partitions)
    return sampled_counts(both, pos, decoder, pool, num_negatives, seed)


__all__ = [
    "as_candidate",
    "as_source",
    "bipartite",
    "by_relation",
    "check_typed_known",
    "load_typed_graph",
    "load_typed_model",
    "mapped_edges",
    "pair_endpoints",
    "pair_relations",
    "relation_counts",
    "relation_decoder",
    "relation_topk_frame",
    "resolve_relation",
    "score_typed_pairs",
    "typed_node_outputs",
    "unmap",
]
