"""Online link prediction: `/v1/score` (decoder scores of given node pairs) and `/v1/topk` (a few
sources' k best candidates among every vertex of the served graph), from the served embeddings.

    POST /v1/score  {"pairs": [[src, dst], ...], "relations"?: [r, ...], "nodes"?: [{"id", "x"}],
                     "edges"?: [[s, d]], "edge_attr"?, "request_id"?, "mode"?, "deadline_ms"?}
    POST /v1/topk   {"sources": [id, ...], "k": K, "relation"?: r, "nodes"?, "edges"?, ...}

A pair's end (a source) is a vertex of the served graph or a query node of the same body: query
nodes (with their edges, exactly as in /v1/answer) are answered through the service's own queue,
in the request's mode, and their node outputs are what the decoder reads; a vertex's output is
its row in the PE store's last layer (the served graph as stored: a body's query nodes do not
change it, as in the reuse modes HE/SRPE/EXACT). Scores are the model's decoder over those rows
(the batch jobs' decoder, so a pair scores as score_edges.py scores it); a per-relation decoder
(DistMult, TransE) takes one relation per pair (`relations`: indices or names) or one for the top-k
(`relation`). Top-k is exact (linkpred.tiles: tiles of the candidates, each source's k best
merged; ties rank the smaller id first), as topk.py ranks without --exclude-edges.

WHY at the front end and bounded: the front end otherwise never holds embeddings (the workers do),
so it opens the store's last layer lazily, once per version served, only when a score or top-k
request arrives; a top-k holds the whole layer, refused when it is over MAX_CANDIDATE_BYTES. Each
body is capped (MAX_PAIRS pairs, MAX_SOURCES sources, k <= MAX_K) and refused as too large (413)
beyond, before any work; the query nodes go through the same caps, admission and deadlines as
/v1/answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import numpy as np
import torch

from sparkgnn import npsets
from sparkgnn.decoders.relational import RelationalDecoder
from sparkgnn.errors import SparkGNNError
from sparkgnn.serving.online.bodies import INT64, AnswerBody, BodyError, NodeBody, _decode, request_of

MAX_PAIRS = 10_000  # pairs one /v1/score body may name
MAX_SOURCES = 64  # sources one /v1/topk body may name
MAX_K = 1_000
MAX_CANDIDATE_BYTES = 1 << 30  # the store's last layer held whole for top-k, at most
CANDIDATE_TILE = 1 << 15  # candidates scored per tile

Relation = INT64 | Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
RequestId = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
DeadlineMs = Annotated[float, msgspec.Meta(gt=0, le=86_400_000)]


class LinkRefused(SparkGNNError, ValueError):
    """A score / top-k body the service cannot answer: `kind` "error" (400: the client's mistake,
    or a deployment without a decoder or store) or "too_large" (413: over a cap)."""

    def __init__(self, message: str, kind: str = "error"):
        super().__init__(message)
        self.kind = kind


class ScoreBody(msgspec.Struct, forbid_unknown_fields=True):
    """POST /v1/score (module doc)."""

    pairs: list[tuple[INT64, INT64]]
    relations: list[Relation] | None = None
    nodes: list[NodeBody] = []
    edges: list[tuple[INT64, INT64]] = []
    edge_attr: list[list[float]] | None = None
    request_id: RequestId = "http"
    mode: str | None = None
    deadline_ms: DeadlineMs | None = None


class TopkBody(msgspec.Struct, forbid_unknown_fields=True):
    """POST /v1/topk (module doc)."""

    sources: list[INT64]
    k: int
    relation: Relation | None = None
    nodes: list[NodeBody] = []
    edges: list[tuple[INT64, INT64]] = []
    edge_attr: list[list[float]] | None = None
    request_id: RequestId = "http"
    mode: str | None = None
    deadline_ms: DeadlineMs | None = None


_SCORE = msgspec.json.Decoder(ScoreBody)
_TOPK = msgspec.json.Decoder(TopkBody)
OPS = ("score", "topk")


@dataclass
class LinkJob:
    """A checked score / top-k body: `queries` resolves to the Outcome of its query nodes (None:
    it has none); `finish(outcome)` then computes the answer, (Outcome kind, JSON body)."""

    queries: Future | None
    finish: Callable[[Any], tuple[str, dict]]


class _Served:
    """What scoring needs of one served version: the decoder and the store's last layer."""

    def __init__(self, version):
        from sparkgnn.linkpred.payload import model_decoder
        from sparkgnn.models import Model
        from sparkgnn.pe.store import PEStore

        self.number = version.number
        model = Model.load(version.spec["model"])
        try:
            self.decoder = model_decoder(model)
        except ValueError as e:
            raise LinkRefused(f"the served model cannot score pairs: {e}") from None
        if version.store is None:
            raise LinkRefused("scoring reads the node outputs of a PE store; this deployment serves none")
        self.store = PEStore.open(version.store, model=model, graph=version.graph, verify="sizes")
        self.layer = self.store.layers[-1]
        if self.store.width(self.layer) != model.out_dim:
            raise LinkRefused(
                f"the PE store's last layer has width {self.store.width(self.layer)}, not the model's "
                f"output width {model.out_dim}; it cannot be scored"
            )
        self.facts = version.facts


class LinkService:
    """Score and top-k requests of one Server (module doc); thread-safe (the parse pool's threads)."""

    def __init__(self, server):
        self.server = server
        self._lock = threading.Lock()
        self._served: _Served | None = None

    def served(self) -> _Served:
        """The decoder and store of the version served now (opened once per version)."""
        version = self.server.versions.current
        with self._lock:
            if self._served is None or self._served.number != version.number:
                self._served = _Served(version)
            return self._served

    def prepare(self, op: str, body: bytes) -> LinkJob:
        """Decode and check a body of `op` ("score" or "topk"), queue its query nodes; BodyError
        or LinkRefused (one line) for a body that cannot be answered."""
        if op not in OPS:
            raise LinkRefused(f"unknown link-prediction op {op!r} (one of {', '.join(OPS)})")
        parsed: ScoreBody | TopkBody
        if op == "score":
            parsed = _decode(_SCORE, body, ScoreBody, "the request body")
            served = self.served()
            src, dst, rel = self._check_score(parsed, served)
            ends = np.concatenate([src, dst])
        else:
            parsed = _decode(_TOPK, body, TopkBody, "the request body")
            served = self.served()
            sources, k, relation = self._check_topk(parsed, served)
            ends = sources
        query_ids = np.fromiter((n.id for n in parsed.nodes), np.int64, len(parsed.nodes))
        _check_ends(ends, query_ids, served)
        queries = None
        if len(parsed.nodes):
            answer = AnswerBody(
                nodes=parsed.nodes,
                edges=parsed.edges,
                edge_attr=parsed.edge_attr,
                request_id=parsed.request_id,
                mode=parsed.mode,
            )
            queries = self.server.submit(request_of(answer), parsed.mode, deadline_ms=parsed.deadline_ms)
        elif parsed.edges or parsed.edge_attr:
            raise BodyError("the request body: edges attach query nodes; give the nodes too (or no edges)")

        def finish(outcome) -> tuple[str, dict]:
            head = {"request_id": parsed.request_id}
            if outcome is not None and outcome.kind != "ok":
                return outcome.kind, {**head, "status": outcome.kind, "error": outcome.error}
            rows = _Rows(served, outcome)
            if op == "score":
                scores = score_pairs(served.decoder, rows(src), rows(dst), rel)
                pairs = [
                    {"src": int(s), "dst": int(d), "score": float(v)} for s, d, v in zip(src, dst, scores, strict=True)
                ]
                return "ok", {**head, "status": "ok", "scores": pairs}
            ranked = topk_rows(served, rows(sources), sources, k, relation)
            return "ok", {**head, "status": "ok", "k": k, "topk": ranked}

        return LinkJob(queries, finish)

    # -- checks ---------------------------------------------------------------------------------
    def _check_score(self, parsed: ScoreBody, served: _Served):
        if not parsed.pairs:
            raise BodyError("the request body: pairs is empty")
        if len(parsed.pairs) > MAX_PAIRS:
            raise LinkRefused(
                f"{len(parsed.pairs)} pairs is over the cap of {MAX_PAIRS}; split the request", "too_large"
            )
        pairs = np.asarray(parsed.pairs, np.int64).reshape(-1, 2)
        rel = None
        decoder = served.decoder
        if decoder.relational:
            if parsed.relations is None or len(parsed.relations) != len(pairs):
                raise BodyError(
                    f"the {decoder.kind} decoder scores each pair with its relation: give relations, one per pair"
                )
            rel = _relations(decoder, parsed.relations)
        elif parsed.relations is not None:
            raise BodyError(f"the {decoder.kind} decoder takes no relation; drop relations")
        return pairs[:, 0].copy(), pairs[:, 1].copy(), rel

    def _check_topk(self, parsed: TopkBody, served: _Served):
        if not parsed.sources:
            raise BodyError("the request body: sources is empty")
        if len(parsed.sources) > MAX_SOURCES:
            raise LinkRefused(
                f"{len(parsed.sources)} sources is over the cap of {MAX_SOURCES}; split the request", "too_large"
            )
        if isinstance(parsed.k, bool) or parsed.k <= 0:
            raise BodyError(f"the request body: k must be an integer >= 1, got {parsed.k!r}")
        if parsed.k > MAX_K:
            raise LinkRefused(f"k={parsed.k} is over the cap of {MAX_K}", "too_large")
        candidates = len(served.facts.id_index.ids)
        held = candidates * served.store.width(served.layer) * 4
        if held > MAX_CANDIDATE_BYTES:
            raise LinkRefused(
                f"top-k holds every vertex's output ({held} bytes), over the cap of {MAX_CANDIDATE_BYTES}; "
                "run spark_jobs/topk.py",
                "too_large",
            )
        decoder = served.decoder
        relation = None
        if decoder.relational:
            if parsed.relation is None:
                raise BodyError(f"the {decoder.kind} decoder ranks per relation: give relation")
            relation = int(_relations(decoder, [parsed.relation])[0])
        elif parsed.relation is not None:
            raise BodyError(f"the {decoder.kind} decoder takes no relation; drop relation")
        sources = np.asarray(parsed.sources, np.int64)
        if len(npsets.unique(sources)) != len(sources):
            raise BodyError("the request body: sources names an id twice")
        return sources, int(parsed.k), relation


def _relations(decoder, values) -> np.ndarray:
    try:
        return decoder.relation_index(list(values)).numpy()
    except ValueError as e:
        raise BodyError(f"the request body: {e}") from None


def _check_ends(ends: np.ndarray, query_ids: np.ndarray, served: _Served) -> None:
    """Refuse ids that are neither a query node of the body nor a vertex of the served graph."""
    _, found = served.facts.id_index.lookup(ends)
    unknown = npsets.unique(ends[~found & ~np.isin(ends, query_ids)])
    if len(unknown):
        shown = ", ".join(str(int(v)) for v in unknown[:5])
        raise BodyError(
            f"the request body names {len(unknown)} id(s) that are neither query nodes nor vertices of the "
            f"served graph (e.g. {shown})"
        )


class _Rows:
    """Node outputs by id: a query node's from its answer, a vertex's from the store's last layer."""

    def __init__(self, served: _Served, outcome):
        self.served = served
        self.query_ids = np.zeros(0, np.int64)
        self.query_h = None
        if outcome is not None:
            self.query_ids, self.query_h, _ = outcome.answer.arrays()
            self.query_ids = np.asarray(self.query_ids, np.int64)

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        width = self.served.store.width(self.served.layer)
        out = np.empty((len(ids), width), np.float32)
        is_query = np.isin(ids, self.query_ids)
        if is_query.any():
            assert self.query_h is not None, "query ids come with their answer's rows"
            order = np.argsort(self.query_ids, kind="stable")
            pos = order[np.searchsorted(self.query_ids[order], ids[is_query])]
            out[is_query] = self.query_h[pos]
        if (~is_query).any():
            out[~is_query] = self.served.store.lookup(ids[~is_query], self.served.layer)[0]
        return out


def score_pairs(decoder, h_src: np.ndarray, h_dst: np.ndarray, rel: np.ndarray | None) -> np.ndarray:
    """The decoder's scores of the pairs (rows of h_src, h_dst), float32."""
    return decoder(torch.from_numpy(h_src), torch.from_numpy(h_dst), rel).numpy().astype(np.float32)


def topk_rows(served: _Served, h_sources: np.ndarray, sources: np.ndarray, k: int, relation: int | None) -> list:
    """Each source's k best candidates among every vertex of the served graph (exact, by tiles:
    linkpred.tiles), as [{"src", "candidates": [{"dst", "score", "rank"}]}] in the sources' order."""
    from sparkgnn.linkpred.tiles import merge_topk, tile_topk

    decoder = served.decoder
    if relation is not None:
        assert isinstance(decoder, RelationalDecoder), "a relation is only checked for per-relation decoders"
        decoder = decoder.bind(relation)
    table = served.store.table(served.layer)
    cand_ids, cand_h = table.ids, table.columns["h"]
    parts = [
        tile_topk(decoder, sources, h_sources, cand_ids[i : i + CANDIDATE_TILE], cand_h[i : i + CANDIDATE_TILE], k)
        for i in range(0, len(cand_ids), CANDIDATE_TILE)
    ]
    src, dst, raw, rank = merge_topk(
        np.concatenate([p[0] for p in parts]),
        np.concatenate([p[1] for p in parts]),
        np.concatenate([p[2] for p in parts]),
        k,
    )
    score = decoder.apply_final(torch.from_numpy(raw)).numpy()
    out = []
    for s in sources:
        mine = src == s
        out.append(
            {
                "src": int(s),
                "candidates": [
                    {"dst": int(d), "score": float(v), "rank": int(r)}
                    for d, v, r in zip(dst[mine], score[mine], rank[mine], strict=True)
                ],
            }
        )
    return out
