"""The graph update format: one Parquet table per update, GraphUpdate as its in-memory form, and
the problem reporting every step of reading and validating an update shares.

An update is ONE table with a `kind` per row (UPDATE_SCHEMA):

    kind            columns used      meaning
    edge_insert     src, dst, weight  add one edge (weight required iff the graph has weights;
                    [edge_attr]       edge_attr, a list<float32> of the graph's edge_attr width,
                                      required iff the graph's edges carry attributes)
    edge_delete     src, dst, weight  remove ONE occurrence of (src -> dst) (of that weight, if given)
    vertex_insert   node, x           add a vertex with features x
    feature_update  node, x           replace a vertex's features
    vertex_delete   node              remove a vertex and every edge touching it

Columns a kind does not use are ignored (and written as null); extra columns are ignored.
`edge_attr` is optional (EDGE_ATTR_FIELD, not part of UPDATE_SCHEMA): a table written for a graph
without edge attributes has no such column, and the readers of the base schema keep reading it.
An edge_delete needs no attributes: it picks the occurrence by (src, dst[, weight]).

Design decisions:

* Ids are ORIGINAL vertex ids (GraphData.ids), never dense row indices: dense rows are renumbered
  by every vertex delete, so an update written against one snapshot would silently point at other
  vertices in the next; original ids are stable and are what the producer's data holds.
* An update is a set of changes grouped by kind, not a log replayed row by row: deletes apply
  before inserts, whatever the row order in the file(s). So the result does not depend on how a
  Spark job happened to order or partition its output, and an edge can be replaced (deleted and
  re-inserted, e.g. with a new weight) in one update.
* Problems (UpdateProblem, make_problem, raise_if_any) live here, not in validation.py: reading a table
  already reports them (unknown kinds, missing columns, nulls), and validation imports them, so
  one wording and one GraphUpdateError serve both.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sparkgnn.errors import GraphUpdateError, OutputError
from sparkgnn.graph import checks, layout
from sparkgnn.graph.problems import MAX_EXAMPLES

EDGE_INSERT = "edge_insert"
EDGE_DELETE = "edge_delete"
VERTEX_INSERT = "vertex_insert"
FEATURE_UPDATE = "feature_update"
VERTEX_DELETE = "vertex_delete"
# Also the order in which to_table() writes the kinds (any order reads the same).
KINDS = (EDGE_INSERT, EDGE_DELETE, VERTEX_INSERT, FEATURE_UPDATE, VERTEX_DELETE)

UPDATE_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("src", pa.int64()),
        ("dst", pa.int64()),
        ("weight", pa.float32()),
        ("node", pa.int64()),
        ("x", pa.list_(pa.float32())),
    ]
)

# The optional edge attribute column of edge_insert rows (module doc); written only by an update
# that inserts edges with attributes.
EDGE_ATTR_FIELD = pa.field("edge_attr", pa.list_(pa.float32()))

# Column -> the kinds that need a non-null value in it. `weight` is never required by the format:
# whether an edge needs one depends on the graph (validate()).
NEEDED_BY = {
    "src": (EDGE_INSERT, EDGE_DELETE),
    "dst": (EDGE_INSERT, EDGE_DELETE),
    "node": (VERTEX_INSERT, FEATURE_UPDATE, VERTEX_DELETE),
    "x": (VERTEX_INSERT, FEATURE_UPDATE),
}


def _is_number_list(t: pa.DataType) -> bool:
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    return is_list and (pa.types.is_floating(t.value_type) or pa.types.is_integer(t.value_type))


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_floating(t) or pa.types.is_integer(t)


# Column -> (type predicate, description) for the type check of from_table().
COLUMN_TYPES = {
    "src": (pa.types.is_integer, "int64"),
    "dst": (pa.types.is_integer, "int64"),
    "weight": (_is_number, "float32"),
    "node": (pa.types.is_integer, "int64"),
    "x": (_is_number_list, "list<float32>"),
    "edge_attr": (_is_number_list, "list<float32>"),
}

# Problem kind -> message template ({count}, {examples} and any detail fields). The first word of
# each message names the update kind (or the table) it is about.
TEMPLATES = {
    # reading the table
    "missing_column": "{count} required column(s) missing: {examples}",
    "column_type": "{count} column(s) have the wrong type: {examples}",
    "unknown_kind": "{count} rows have an unknown kind: {examples}; expected one of " + ", ".join(KINDS),
    "null_value": "{update_kind}: {count} rows have a null {column}; first rows: {examples}",
    "nan_weight": "{update_kind}: {count} rows have a NaN weight (leave it null for 'no weight'); "
    "first rows: {examples}",
    "shape": "{count} array(s) have an inconsistent shape: {examples}",
    # against the graph
    "unknown_id": "{update_kind}: {count} ids are not vertices of the graph{hint}; first: {examples}",
    "repeated_id": "{update_kind}: {count} ids appear more than once; first: {examples}",
    "existing_id": "{update_kind}: {count} ids are already vertices of the graph; first: {examples}",
    "deleted_id": "{update_kind}: {count} ids are deleted by this update{hint}; first: {examples}",
    "x_width": "{update_kind}: {count} rows have x of width {width}, the graph's features have width {expected}; "
    "first ids: {examples}",
    "x_nonfinite": "{update_kind}: {count} rows have NaN/Inf feature values; first ids: {examples}",
    "unknown_endpoint": "{update_kind}: {count} edges have an endpoint that is {hint}; first: {examples}",
    "deleted_endpoint": "{update_kind}: {count} edges have an endpoint deleted by this update{hint}; first: {examples}",
    "missing_weight": "{update_kind}: {count} edges have no weight, but the graph has edge weights; first: {examples}",
    "bad_weight": "{update_kind}: {count} edges have a negative, NaN or Inf weight; first: {examples}",
    "unexpected_weight": "{update_kind}: {count} edges have a weight, but the graph has no edge weights; "
    "first: {examples}",
    "missing_edge_attr": "{update_kind}: {count} edges have no edge_attr, but the graph's edges carry "
    "attributes of width {expected}; first: {examples}",
    "unexpected_edge_attr": "{update_kind}: {count} edges have an edge_attr, but the graph's edges carry none; "
    "first: {examples}",
    "edge_attr_width": "{update_kind}: {count} edges have an edge_attr of width {width}, the graph's have width "
    "{expected}; first: {examples}",
    "edge_attr_nonfinite": "{update_kind}: {count} edges have NaN/Inf edge_attr values; first: {examples}",
    "too_many_deletes": "{update_kind}: {count} edges are deleted more times than the graph holds them; "
    "first: {examples}",
}


@dataclass(frozen=True)
class UpdateProblem:
    """One kind of defect of an update: how many rows (or edges), a few of them, and the sentence."""

    kind: str  # "<update kind>.<defect>" (e.g. "vertex_insert.existing_id"), or "<defect>" for the table
    count: int
    examples: tuple[str, ...]
    message: str


def make_problem(
    defect: str, count: int, examples, update_kind: str = "", offenders: int | None = None, **detail
) -> UpdateProblem:
    """An UpdateProblem worded by TEMPLATES[defect]. `offenders`: how many examples there are to show
    (default `count`), for the trailing "..."."""
    examples = tuple(examples)[:MAX_EXAMPLES]
    more = (count if offenders is None else offenders) > len(examples)
    shown = ", ".join(examples) + (", ..." if more and examples else "")
    text = TEMPLATES[defect].format(count=count, examples=shown, update_kind=update_kind, **detail)
    return UpdateProblem(f"{update_kind}.{defect}" if update_kind else defect, int(count), examples, text)


def raise_if_any(problems, what: str) -> None:
    """One GraphUpdateError listing every problem with a count (None and empty ones skipped)."""
    problems = [p for p in problems if p is not None and p.count > 0]
    if not problems:
        return
    noun = "problem" if len(problems) == 1 else "problems"
    lines = "\n".join(f"  - {p.message}" for p in problems)
    error = GraphUpdateError(f"{what} failed validation ({len(problems)} {noun}):\n{lines}")
    error.problems = problems
    raise error


# --- the update in memory --------------------------------------------------------------------------


def no_ids() -> np.ndarray:
    """An empty id array (int64)."""
    return np.empty(0, np.int64)


def _no_rows() -> np.ndarray:
    return np.empty((0, 0), np.float32)


@dataclass(eq=False)
class GraphUpdate:
    """One update, as numpy arrays grouped by kind, ids ORIGINAL. Every field defaults to empty, so
    `GraphUpdate(vertex_delete_ids=[7])` is a whole update.

    Edge weights are float32 arrays aligned with src/dst, or None when no row of that kind has a
    weight; NaN inside an array means "no weight" (null in Parquet). x matrices are [rows, F].
    `edge_insert_attr`: the inserted edges' attribute rows [edge inserts, D], or None when the
    edges carry none (a graph without edge attributes).
    """

    edge_insert_src: np.ndarray = field(default_factory=no_ids)
    edge_insert_dst: np.ndarray = field(default_factory=no_ids)
    edge_insert_weight: np.ndarray | None = None
    edge_delete_src: np.ndarray = field(default_factory=no_ids)
    edge_delete_dst: np.ndarray = field(default_factory=no_ids)
    edge_delete_weight: np.ndarray | None = None
    vertex_insert_ids: np.ndarray = field(default_factory=no_ids)
    vertex_insert_x: np.ndarray = field(default_factory=_no_rows)
    feature_update_ids: np.ndarray = field(default_factory=no_ids)
    feature_update_x: np.ndarray = field(default_factory=_no_rows)
    vertex_delete_ids: np.ndarray = field(default_factory=no_ids)
    edge_insert_attr: np.ndarray | None = None

    def __post_init__(self) -> None:
        wrong: list[str] = []

        def ids(name: str) -> np.ndarray:
            arr = np.ascontiguousarray(getattr(self, name), dtype=np.int64)
            if arr.ndim != 1:
                wrong.append(f"{name} has shape {arr.shape}, expected 1-D")
                arr = arr.reshape(-1)
            return arr

        def rows(name: str, expected: int) -> np.ndarray:
            arr = np.ascontiguousarray(getattr(self, name), dtype=np.float32)
            if arr.size == 0 and arr.ndim != 2:
                arr = arr.reshape(len(arr) if arr.ndim else 0, 0)
            if arr.ndim != 2 or len(arr) != expected:
                wrong.append(f"{name} has shape {arr.shape}, expected ({expected}, F)")
            return arr

        def weights(name: str, expected: int) -> np.ndarray | None:
            if getattr(self, name) is None:
                return None
            arr = np.ascontiguousarray(getattr(self, name), dtype=np.float32)
            if arr.shape != (expected,):
                wrong.append(f"{name} has shape {arr.shape}, expected ({expected},)")
            return arr

        for prefix in (EDGE_INSERT, EDGE_DELETE):
            src, dst = ids(f"{prefix}_src"), ids(f"{prefix}_dst")
            if len(dst) != len(src):
                wrong.append(f"{prefix}_dst has {len(dst)} rows, {prefix}_src has {len(src)}")
            setattr(self, f"{prefix}_src", src)
            setattr(self, f"{prefix}_dst", dst)
            setattr(self, f"{prefix}_weight", weights(f"{prefix}_weight", len(src)))
        for prefix in (VERTEX_INSERT, FEATURE_UPDATE):
            setattr(self, f"{prefix}_ids", ids(f"{prefix}_ids"))
            setattr(self, f"{prefix}_x", rows(f"{prefix}_x", len(getattr(self, f"{prefix}_ids"))))
        self.vertex_delete_ids = ids("vertex_delete_ids")
        if self.edge_insert_attr is not None:
            attr = np.ascontiguousarray(self.edge_insert_attr, dtype=np.float32)
            attr = attr.reshape(-1, 1) if attr.ndim == 1 else attr
            if attr.ndim != 2 or len(attr) != len(self.edge_insert_src) or attr.shape[1] < 1:
                wrong.append(f"edge_insert_attr has shape {attr.shape}, expected ({len(self.edge_insert_src)}, D>=1)")
            self.edge_insert_attr = attr
        if wrong:
            raise_if_any([make_problem("shape", len(wrong), wrong)], "graph update")

    # --- sizes ---------------------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        """Rows per kind, every kind present (0 when absent), in KINDS order."""
        return {
            EDGE_INSERT: len(self.edge_insert_src),
            EDGE_DELETE: len(self.edge_delete_src),
            VERTEX_INSERT: len(self.vertex_insert_ids),
            FEATURE_UPDATE: len(self.feature_update_ids),
            VERTEX_DELETE: len(self.vertex_delete_ids),
        }

    @property
    def empty(self) -> bool:
        return not any(self.counts().values())

    def __repr__(self) -> str:
        return "GraphUpdate(" + ", ".join(f"{k}={v}" for k, v in self.counts().items()) + ")"

    # --- Parquet -------------------------------------------------------------------------------------
    @classmethod
    def read(cls, path) -> GraphUpdate:
        """Read an update from one .parquet file or a folder of them (e.g. a Spark job's output;
        files starting with "." or "_" are ignored, as Spark and pyarrow do)."""
        path = layout.strip_scheme(str(path))
        if not os.path.exists(path):
            raise GraphUpdateError(f"graph update {path} does not exist")
        if os.path.isdir(path) and not any(
            not name.startswith((".", "_")) for _, _, names in os.walk(path) for name in names
        ):
            raise GraphUpdateError(f"graph update folder {path} holds no Parquet files")
        try:
            # one file read directly, without the dataset discovery read_table runs (several times
            # the read of a small update file) and without waking arrow's thread pool
            table = pq.read_table(path) if os.path.isdir(path) else pq.ParquetFile(path).read(use_threads=False)
        except (pa.ArrowException, OSError) as error:
            raise GraphUpdateError(f"cannot read graph update {path}: {error}") from error
        return cls.from_table(table, source=f"graph update {path}")

    @classmethod
    def from_table(cls, table: pa.Table, source: str = "graph update table") -> GraphUpdate:
        """Arrow table (UPDATE_SCHEMA, or any integer / float / list-of-number column types) ->
        GraphUpdate. Raises one GraphUpdateError naming unknown kinds (with counts), missing or
        mistyped columns, and nulls where a kind needs a value."""
        problems: list[UpdateProblem] = []
        for wanted in [*UPDATE_SCHEMA, EDGE_ATTR_FIELD]:  # a column of nulls only (e.g. Python Nones) has type null
            name = wanted.name
            if name in table.column_names and pa.types.is_null(table.schema.field(name).type):
                position = table.column_names.index(name)
                table = table.set_column(position, name, table.column(name).cast(wanted.type))
        if "kind" not in table.column_names:
            raise_if_any([make_problem("missing_column", 1, ["kind"])], source)
        kind_column = table.column("kind")
        if pa.types.is_dictionary(kind_column.type):  # e.g. a hive partition folder kind=edge_insert
            kind_column = kind_column.cast(pa.string())
        if not (pa.types.is_string(kind_column.type) or pa.types.is_large_string(kind_column.type)):
            raise_if_any([make_problem("column_type", 1, [f"kind is {kind_column.type}, expected string"])], source)

        masks = {k: pc.fill_null(pc.equal(kind_column, k), False).to_numpy(zero_copy_only=False) for k in KINDS}
        known = np.zeros(table.num_rows, bool)
        for mask in masks.values():
            known |= mask
        if not known.all():
            problems.append(_unknown_kinds(kind_column.filter(pa.array(~known))))

        present = {k for k, mask in masks.items() if mask.any()}
        missing = [
            f"{column} (needed by {', '.join(k for k in kinds if k in present)})"
            for column, kinds in NEEDED_BY.items()
            if column not in table.column_names and present.intersection(kinds)
        ]
        if missing:
            problems.append(make_problem("missing_column", len(missing), missing))
        mistyped = [
            f"{name} is {table.schema.field(name).type}, expected {description}"
            for name, (is_ok, description) in COLUMN_TYPES.items()
            if name in table.column_names and not is_ok(table.schema.field(name).type)
        ]
        if mistyped:
            problems.append(make_problem("column_type", len(mistyped), mistyped))
        if missing or mistyped:
            raise_if_any(problems, source)

        parts: dict = {}
        for kind in KINDS:
            rows = np.flatnonzero(masks[kind])
            part = table.take(pa.array(rows)) if len(rows) < table.num_rows else table
            parts.update(_read_kind(kind, part, rows, problems))
        raise_if_any(problems, source)
        return cls(**parts)

    def to_table(self) -> pa.Table:
        """The update as one UPDATE_SCHEMA table, kinds in KINDS order, rows of a kind in order."""
        sizes = np.array(list(self.counts().values()), np.int64)
        total = int(sizes.sum())
        kind_codes = pa.array(np.repeat(np.arange(len(KINDS), dtype=np.int8), sizes))
        kind = pa.DictionaryArray.from_arrays(kind_codes, pa.array(KINDS)).cast(pa.string())
        n_edge = int(sizes[0] + sizes[1])
        no_edges = np.zeros(total - n_edge, np.int64)

        def int_column(values: list[np.ndarray], present: np.ndarray) -> pa.Array:
            return pa.array(np.concatenate(values), mask=~present, type=pa.int64())

        is_edge = np.arange(total) < n_edge
        src = int_column([self.edge_insert_src, self.edge_delete_src, no_edges], is_edge)
        dst = int_column([self.edge_insert_dst, self.edge_delete_dst, no_edges], is_edge)
        node = int_column(
            [np.zeros(n_edge, np.int64), self.vertex_insert_ids, self.feature_update_ids, self.vertex_delete_ids],
            ~is_edge,
        )
        weight_values = np.full(total, np.nan, np.float32)
        for start, size, weight in (
            (0, sizes[0], self.edge_insert_weight),
            (sizes[0], sizes[1], self.edge_delete_weight),
        ):
            if weight is not None:
                weight_values[start : start + size] = weight
        weight_column = pa.array(weight_values, mask=np.isnan(weight_values), type=pa.float32())

        lengths = np.zeros(total, np.int64)
        x_start = n_edge
        for x in (self.vertex_insert_x, self.feature_update_x):
            lengths[x_start : x_start + len(x)] = x.shape[1]
            x_start += len(x)
        has_x = (np.arange(total) >= n_edge) & (np.arange(total) < x_start)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        if offsets[-1] > np.iinfo(np.int32).max:
            raise GraphUpdateError(f"update holds {offsets[-1]} feature values, more than one Parquet list column can")
        x_values = pa.array(np.concatenate([self.vertex_insert_x.reshape(-1), self.feature_update_x.reshape(-1)]))
        x_column = pa.ListArray.from_arrays(
            pa.array(offsets.astype(np.int32)), x_values, type=pa.list_(pa.float32()), mask=pa.array(~has_x)
        )
        table = pa.Table.from_arrays([kind, src, dst, weight_column, node, x_column], schema=UPDATE_SCHEMA)
        if self.edge_insert_attr is None:
            return table
        attr = self.edge_insert_attr
        attr_offsets = np.concatenate([np.arange(len(attr) + 1) * attr.shape[1], np.full(total - len(attr), attr.size)])
        has_attr = np.arange(total) < len(attr)
        attr_column = pa.ListArray.from_arrays(
            pa.array(attr_offsets.astype(np.int32)),
            pa.array(attr.reshape(-1)),
            type=EDGE_ATTR_FIELD.type,
            mask=pa.array(~has_attr),
        )
        return table.append_column(EDGE_ATTR_FIELD, attr_column)

    def write(self, path) -> str:
        """Write the update as ONE Parquet file at `path` and return the path. Never replaces an
        existing path (an update that was read may be applied already); the file is written under a
        hidden temporary name next to it and renamed, so a reader never sees half a file."""
        path = layout.strip_scheme(str(path))
        if os.path.exists(path):
            raise OutputError(f"{path} already exists; a graph update is never overwritten, write it under a new name")
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        temporary = os.path.join(folder, f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex}")
        try:
            pq.write_table(self.to_table(), temporary)
            os.rename(temporary, path)
        except BaseException:
            if os.path.exists(temporary):
                os.remove(temporary)
            raise
        return path


def _unknown_kinds(unknown: pa.ChunkedArray) -> UpdateProblem:
    """'edge_upsert' (x3), null (x1): every distinct unknown kind, most frequent first."""
    counted = pc.value_counts(unknown)
    values = counted.field("values").to_pylist()
    counts = counted.field("counts").to_numpy()
    order = np.argsort(-counts, kind="stable")
    examples = [f"{'null' if values[i] is None else repr(values[i])} (x{counts[i]})" for i in order[:MAX_EXAMPLES]]
    return make_problem("unknown_kind", len(unknown), examples, offenders=len(values))


def _int_values(part: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    column = part.column(name)
    nulls = column.is_null().to_numpy(zero_copy_only=False)
    return pc.fill_null(column, 0).to_numpy().astype(np.int64, copy=False), nulls


def _read_kind(kind: str, part: pa.Table, rows: np.ndarray, problems: list) -> dict:
    """The GraphUpdate fields of one kind from its rows (`rows`: their numbers in the whole table,
    for the examples of null values)."""
    needed = [column for column, kinds in NEEDED_BY.items() if kind in kinds and column != "x"]
    values = {}
    for column in needed:
        values[column], nulls = _int_values(part, column) if len(rows) else (no_ids(), np.zeros(0, bool))
        if nulls.any():
            problems.append(
                make_problem("null_value", int(nulls.sum()), map(str, rows[nulls][:MAX_EXAMPLES]), kind, column=column)
            )
    if kind in (EDGE_INSERT, EDGE_DELETE):
        out = {}
        if kind == EDGE_INSERT:
            out["edge_insert_attr"] = _edge_attr(part, values["src"], values["dst"], rows, problems)
        weight = None
        if "weight" in part.column_names and len(rows) and part.column("weight").null_count < len(rows):
            column = part.column("weight").cast(pa.float32())
            nan = pc.fill_null(pc.is_nan(column), False).to_numpy(zero_copy_only=False)
            if nan.any():
                problems.append(make_problem("nan_weight", int(nan.sum()), map(str, rows[nan][:MAX_EXAMPLES]), kind))
            weight = pc.fill_null(column, np.nan).to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        return {**out, f"{kind}_src": values["src"], f"{kind}_dst": values["dst"], f"{kind}_weight": weight}
    if kind == VERTEX_DELETE:
        return {"vertex_delete_ids": values["node"]}
    x = _no_rows()
    if len(rows):
        x, x_problems = checks.vector_column(values["node"], part.column("x"))
        # Reuse the graph reader's wording ("N vertices have a null feature vector x; first ids: ...").
        problems.extend(
            UpdateProblem(f"{kind}.{p.kind}", p.count, p.examples, f"{kind}: {p.message()}") for p in x_problems
        )
    return {f"{kind}_ids": values["node"], f"{kind}_x": x if x is not None else _no_rows()}


def _edge_attr(part: pa.Table, src: np.ndarray, dst: np.ndarray, rows: np.ndarray, problems: list) -> np.ndarray | None:
    """The edge_insert rows' attribute matrix, or None when the column is absent or all null.
    Null and ragged rows next to given ones are problems in the graph reader's words (an update
    inserts edges either all with attributes or all without: validate() says which)."""
    if "edge_attr" not in part.column_names or not len(rows) or part.column("edge_attr").null_count == len(rows):
        return None
    from sparkgnn.graph.problems import fmt_edge

    attr, attr_problems = checks.vector_column(
        src,
        part.column("edge_attr"),
        kinds=("null_edge_attr", "edge_attr_width"),
        label=lambda i: fmt_edge(src[i], dst[i]),
    )
    problems.extend(
        UpdateProblem(f"{EDGE_INSERT}.{p.kind}", p.count, p.examples, f"{EDGE_INSERT}: {p.message()}")
        for p in attr_problems
    )
    return attr
