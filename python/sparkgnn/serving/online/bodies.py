"""The strict schemas of what clients send the online service as JSON (the HTTP front's bodies).

WHY strict (msgspec Structs with forbid_unknown_fields, strict types): a lenient decoder would
ignore a misspelt key such as `"edge"` for `"edges"` and answer the request as if it had no edges,
a wrong answer with no word. So every unknown key is refused naming the key and the keys
expected there; a boolean or a string is not a number; ids are int64.

WHY msgspec: it decodes straight into the schema, so a body is refused at the first byte that
does not fit it. That bounds the nesting depth by the schema itself (the deepest valid value is
`$.nodes[i].x[j]`): a `[[[[...` body is refused at its first bracket, never recursed into, and an
unknown key is refused before its value is read. The body's size is bounded before any of this
by the HTTP server (`max_body_bytes`), and the counts of query nodes and edges by the service
(ServeConfig.max_queries, max_edges) once decoded.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Annotated, TypeVar

import msgspec
import numpy as np

from sparkgnn.serving.request import Request, RequestError

if TYPE_CHECKING:
    from sparkgnn.serving.typed import TypedRequest

INT64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
SWAP_TIMEOUT_MIN_S = 1.0
SWAP_TIMEOUT_MAX_S = 86400.0


class NodeBody(msgspec.Struct, forbid_unknown_fields=True):
    """One query node: its new id and its feature row."""

    id: INT64
    x: list[float]


class AnswerBody(msgspec.Struct, forbid_unknown_fields=True):
    """POST /v1/answer: {"request_id"?, "mode"?, "nodes": [{"id", "x"}], "edges"?: [[src, dst]],
    "edge_attr"?: [[a_1, ..., a_D]]} (edge_attr: one row per edge, in `edges`' order, for a model
    whose layers read edge attributes)."""

    nodes: list[NodeBody]
    edges: list[tuple[INT64, INT64]] = []
    edge_attr: list[list[float]] | None = None
    request_id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] = "http"
    mode: str | None = None
    deadline_ms: Annotated[float, msgspec.Meta(gt=0, le=86_400_000)] | None = None  # else the deployment's


class TypedNodeBody(msgspec.Struct, forbid_unknown_fields=True):
    """One query node of a typed request: its node type, its new id (ids are per type) and its
    feature row of the type's width; no `x` for a type whose vertices have no features in G."""

    type: Annotated[str, msgspec.Meta(min_length=1)]
    id: INT64
    x: list[float] | None = None


class TypedEdgeBody(msgspec.Struct, forbid_unknown_fields=True):
    """One request edge of a typed request: its relation as PyG writes an edge type, [src type,
    relation, dst type], and its endpoints' ids (src of the source type, dst of the destination
    type; each a query of the body or a vertex of G)."""

    relation: tuple[str, str, str]
    src: INT64
    dst: INT64


class TypedAnswerBody(msgspec.Struct, forbid_unknown_fields=True):
    """POST /v1/answer on a typed service: {"request_id"?, "mode"?, "deadline_ms"?, "nodes":
    [{"type", "id", "x"?}], "edges"?: [{"relation": [src type, relation, dst type], "src", "dst"}]}."""

    nodes: list[TypedNodeBody]
    edges: list[TypedEdgeBody] = []
    request_id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] = "http"
    mode: str | None = None
    deadline_ms: Annotated[float, msgspec.Meta(gt=0, le=86_400_000)] | None = None  # else the deployment's


class SwapBody(msgspec.Struct, forbid_unknown_fields=True):
    """POST /v1/admin/swap: {"graph": DIR, "store"?: PATH, "timeout_s"?: seconds}."""

    graph: Annotated[str, msgspec.Meta(min_length=1)]
    store: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    timeout_s: Annotated[float, msgspec.Meta(ge=SWAP_TIMEOUT_MIN_S, le=SWAP_TIMEOUT_MAX_S)] = 300.0


class BodyError(RequestError):
    """A JSON body does not follow its schema (the message says where and what)."""


_ANSWER = msgspec.json.Decoder(AnswerBody)
_TYPED_ANSWER = msgspec.json.Decoder(TypedAnswerBody)
_SWAP = msgspec.json.Decoder(SwapBody)
# the Struct each member key of a body names (for "unknown key ... expected one of"); other bodies: nodes
_MEMBERS: dict[type, dict[str, type[msgspec.Struct]]] = {
    TypedAnswerBody: {"nodes": TypedNodeBody, "edges": TypedEdgeBody}
}
_DEFAULT_MEMBERS: dict[str, type[msgspec.Struct]] = {"nodes": NodeBody}
TYPED_BODY_TO_HOMOGENEOUS = (
    "the request body is a typed request (its query nodes carry a 'type', its edges a 'relation'), but this "
    'service serves a homogeneous graph: send {"nodes": [{"id", "x"}], "edges": [[src, dst]]}'
)
HOMOGENEOUS_BODY_TO_TYPED = (
    "the request body is a homogeneous request, but this service serves a typed graph: every query node "
    'carries its node type and every edge its relation, {"nodes": [{"type", "id", "x"}], "edges": '
    '[{"relation": [src type, relation, dst type], "src", "dst"}]}'
)
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<key>.*?)`(?: - at `(?P<at>.*)`)?$")
_MISSING = re.compile(r"Object missing required field `(?P<key>.*?)`(?: - at `(?P<at>.*)`)?$")


def _struct_at(root: type[msgspec.Struct], at: str | None) -> type[msgspec.Struct]:
    """The Struct type the JSON path `at` ("$", "$.nodes[3]") names inside `root`."""
    found: type[msgspec.Struct] = root
    members = _MEMBERS.get(root, _DEFAULT_MEMBERS)
    for name in re.findall(r"\.(\w+)", at or "$"):
        found = members.get(name, found)
    return found


def _expected(struct: type[msgspec.Struct]) -> str:
    return ", ".join(sorted(struct.__struct_fields__))


def _message(exc: msgspec.MsgspecError, root: type[msgspec.Struct], what: str) -> str:
    text = str(exc)
    unknown = _UNKNOWN.match(text)
    if unknown:
        struct = _struct_at(root, unknown["at"])
        where = f" in {unknown['at']}" if unknown["at"] else ""
        return f"{what}: unknown key {unknown['key']!r}{where}; expected one of: {_expected(struct)}"
    missing = _MISSING.match(text)
    if missing:
        where = f" in {missing['at']}" if missing["at"] else ""
        return f"{what}: missing key {missing['key']!r}{where}"
    if isinstance(exc, msgspec.DecodeError) and not isinstance(exc, msgspec.ValidationError):
        return f"{what} is not JSON: {text}"
    return f"{what}: {text}"


_Body = TypeVar("_Body", bound=msgspec.Struct)


def _decode(decoder: msgspec.json.Decoder[_Body], body: bytes, struct: type[_Body], what: str) -> _Body:
    """`body` decoded by `decoder` (into `struct`), or BodyError naming `what` and the first thing
    that does not fit; a body nested too deeply for the decoder is refused the same way."""
    try:
        return decoder.decode(body)
    except RecursionError:
        raise BodyError(f"{what} nests too deeply") from None
    except msgspec.MsgspecError as exc:
        raise BodyError(_message(exc, struct, what)) from None


def decode_answer(body: bytes) -> AnswerBody:
    """The answer request in `body`, or BodyError naming what does not fit AnswerBody (a typed
    body, which a homogeneous service cannot answer, is named as one)."""
    try:
        return _decode(_ANSWER, body, AnswerBody, "the request body")
    except BodyError:
        if _fits(_TYPED_ANSWER, body):  # only a refused body pays for the second look
            raise BodyError(TYPED_BODY_TO_HOMOGENEOUS) from None
        raise


def decode_typed_answer(body: bytes) -> TypedAnswerBody:
    """The typed answer request in `body`, or BodyError naming what does not fit
    TypedAnswerBody (a homogeneous body, which a typed service cannot answer, is named as one)."""
    try:
        return _decode(_TYPED_ANSWER, body, TypedAnswerBody, "the request body")
    except BodyError:
        if _fits(_ANSWER, body):
            raise BodyError(HOMOGENEOUS_BODY_TO_TYPED) from None
        raise


def _fits(decoder: msgspec.json.Decoder, body: bytes) -> bool:
    """Whether `body` decodes with `decoder`."""
    try:
        decoder.decode(body)
    except (msgspec.MsgspecError, RecursionError):
        return False
    return True


def decode_swap(body: bytes) -> SwapBody:
    """The swap request in `body`, or BodyError (timeout_s outside [1 s, 1 day] included)."""
    return _decode(_SWAP, body, SwapBody, "the swap body")


def check_swap_timeout(timeout_s: float) -> float:
    """`timeout_s` as a float when it is a finite number of seconds in [1 s, 1 day]; else
    BodyError (a swap asked to wait 1e-9 s or forever is a mistake, not a setting)."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not math.isfinite(timeout_s):
        raise BodyError(f"timeout_s must be a finite number of seconds, got {timeout_s!r}")
    if not SWAP_TIMEOUT_MIN_S <= timeout_s <= SWAP_TIMEOUT_MAX_S:
        raise BodyError(
            f"timeout_s must lie in [{SWAP_TIMEOUT_MIN_S:g}, {SWAP_TIMEOUT_MAX_S:g}] seconds, got {timeout_s!r}"
        )
    return float(timeout_s)


def request_of(body: AnswerBody) -> Request:
    """The Request an AnswerBody describes (Request itself refuses ragged rows, NaN, ...)."""
    count = len(body.nodes)
    if count and len({len(n.x) for n in body.nodes}) == 1:
        with np.errstate(over="ignore"):  # beyond float32: inf, which Request's checks name
            x = np.asarray([n.x for n in body.nodes], np.float32)
    else:
        x = [n.x for n in body.nodes] if count else np.zeros((0, 0), np.float32)  # type: ignore[assignment]
    edges = np.asarray(body.edges, np.int64).reshape(-1, 2) if body.edges else np.zeros((0, 2), np.int64)
    attr = body.edge_attr if body.edge_attr or len(edges) else None  # no edges: no rows to carry
    if attr is not None and len(attr) != len(edges):
        raise BodyError(f"the request body: edge_attr has {len(attr)} rows, edges has {len(edges)} (one row per edge)")
    if attr is not None and len({len(row) for row in attr}) > 1:
        raise BodyError(f"the request body: edge_attr rows of different lengths {sorted({len(row) for row in attr})}")
    if attr is not None and not attr[0]:
        raise BodyError("the request body: edge_attr rows are empty (each edge needs D >= 1 values)")
    return Request(
        body.request_id,
        np.fromiter((n.id for n in body.nodes), np.int64, count),
        x,
        np.ascontiguousarray(edges[:, 0]),
        np.ascontiguousarray(edges[:, 1]),
        None if attr is None else np.asarray(attr, np.float32).reshape(len(edges), -1),
    )


def typed_request_of(body: TypedAnswerBody) -> TypedRequest:
    """The TypedRequest a TypedAnswerBody describes: query nodes grouped by type and request
    edges by relation, each in the order of its first appearance (the answer's order); BodyError
    when a type's queries carry features some but not all, or rows of different lengths. What
    needs G (unknown types and relations, widths, ids) is TypedQueryEngine's to refuse."""
    from sparkgnn.serving.typed import TypedRequest

    rows: dict[str, tuple[list[int], list[list[float] | None]]] = {}
    for node in body.nodes:
        ids, xs = rows.setdefault(node.type, ([], []))
        ids.append(node.id)
        xs.append(node.x)
    nodes: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    for node_type, (ids, xs) in rows.items():
        given = [x is not None for x in xs]
        if any(given) and not all(given):
            raise BodyError(
                f"the request body: node type {node_type!r}: {sum(given)} of its {len(xs)} query nodes carry x "
                "(a type's queries carry features all or none)"
            )
        x = None
        if all(given):
            lengths = sorted({len(row) for row in xs if row is not None})
            if len(lengths) > 1:
                raise BodyError(f"the request body: node type {node_type!r}: x rows of different lengths {lengths}")
            with np.errstate(over="ignore"):  # beyond float32: inf, which the engine's checks name
                x = np.asarray(xs, np.float32).reshape(len(xs), lengths[0])
        nodes[node_type] = (np.asarray(ids, np.int64), x)
    pairs: dict[tuple[str, str, str], tuple[list[int], list[int]]] = {}
    for edge in body.edges:
        src, dst = pairs.setdefault(edge.relation, ([], []))
        src.append(edge.src)
        dst.append(edge.dst)
    edges = {et: (np.asarray(s, np.int64), np.asarray(d, np.int64)) for et, (s, d) in pairs.items()}
    return TypedRequest(nodes, edges, request_id=body.request_id)


def typed_request_json(request: TypedRequest, mode: str | None = None) -> dict:
    """The JSON body (TypedAnswerBody) of a TypedRequest: what a client POSTs to /v1/answer of a
    typed service; typed_request_of reads it back to the same request."""
    nodes = []
    for node_type, (ids, x) in request.nodes.items():
        ids = np.asarray(ids, np.int64).reshape(-1)
        feats = None if x is None else np.asarray(x, np.float32).reshape(len(ids), -1).tolist()
        for k, i in enumerate(ids.tolist()):
            nodes.append({"type": node_type, "id": i} if feats is None else {"type": node_type, "id": i, "x": feats[k]})
    edges = [
        {"relation": list(et), "src": s, "dst": d}
        for et, (src, dst) in request.edges.items()
        for s, d in zip(np.asarray(src, np.int64).tolist(), np.asarray(dst, np.int64).tolist(), strict=True)
    ]
    body: dict = {"request_id": request.request_id, "nodes": nodes, "edges": edges}
    if mode:
        body["mode"] = mode
    return body
