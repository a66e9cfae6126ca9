"""One owner-partition step of a layer: aggregate what arrived, update, and prepare what the next
layer needs to ship. This is the fused DL operator of a plan (one Pipe round trip per partition per
layer, docs/ARCHITECTURE.md "Data movement and the planner", fusion).

A step is configured by two registry keys in the task header:
- `aggregate`: how layer l's aggregation input arrived
    "none"   - first step: h = model.pre(x), no conv applied
    "given"  - own.h already is h^(l) (second step of a combine layer with attention)
    "edges"  - local edges + source payloads (replicate and edge_join strategies)
    "states" - partial aggregation states computed where the edges are (combine strategy)
- `emit`: what to prepare for layer l+1
    "none"     - last layer: return h (and predictions for classifiers)
    "src"      - source payloads of own vertices (shipped to mirror partitions / joined onto edges)
    "partials" - partial states of layer l+1 over this partition's out-edges (combine)
    "dst"      - destination payloads of own vertices (combine with attention: shipped to the
                 partitions that hold the in-edges, before partials can be formed)

Tables in (all row orders are the owner's local order, decided by the graph engine):
  own:   h (vector), one float32 column per node statistic, named by its key (sparkgnn.stat_keys:
         gcn_degree_w for GCN's weighted degree, gcn_degree for the unweighted one)
  mirror: p (vector) source payloads of foreign sources       [aggregate=edges]
  edges: src (local in [own | mirror]), dst (local own), weight, [attr (vector): the edge
         attributes, for a conv that reads them]                [aggregate=edges]
  states: s (vector), seg (local own)                          [aggregate=states]
  out_edges: src (local own), dst (local in [own | foreign]), weight  [emit=partials]
  foreign_dst: d (vector) destination payloads of foreign dsts [emit=partials, attention layers]
Tables out: own: h (+ pred), src: p, partials: row, s, dst: d; with header with_state, also
  state: s, each own vertex's merged aggregation state of layer l (what a PE store keeps so a node
  can later be recomputed from its state plus only its changed in-edges).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import cast

import pyarrow as pa
import torch

from sparkgnn.dl.chunks import chunked_by_dst
from sparkgnn.dl.csr import Block, Csr, by_destination
from sparkgnn.dl.staging import staged, to_host
from sparkgnn.dl.tensors import fixed_list, index, matrices, matrix, vector
from sparkgnn.errors import SparkGNNError
from sparkgnn.layers.generic import GenericConv
from sparkgnn.layers.rowwise import rows_independent as layers_rows_independent
from sparkgnn.models.model import Model
from sparkgnn.planner.partitions import MESSAGE_CHUNK_BYTES, VERTEX_CHUNK_BYTES
from sparkgnn.stat_keys import stat_key


class StepError(SparkGNNError, ValueError):
    """A task's tables do not fit the step it asks for (missing table, wrong width, NaN)."""


# VERTEX_CHUNK_BYTES (planner.partitions, which counts it in a task's peak): vertex-sized
# temporaries of the sums path of aggregate=edges (sums, state, finalize, the
# update's intermediates such as lin_l(agg), lin_r(h) and their sum, each post op's output) are
# made for at most this many bytes of destination rows at once. WHY: over a whole partition they are
# n_own x width each, ~1.3 GiB of a 2.45 GiB task peak at 8M edges / P=2, and the planner pays
# for them with more partitions (more bytes shipped per layer). Every one of these operations reads
# one destination's row only (update reads h[i] and agg[i]; post ops are node-wise), so the step
# runs them on destination ranges and writes each range's rows into one preallocated output: same
# per-row arithmetic (each row's edges are summed in the same order), bounded memory. 64 MiB keeps
# the ranges large enough that the per-range overhead (a sub-CSR's offsets, one sparse product per
# block) is noise: ~18K rows for SAGE-mean at F = out = 128. Overridden per task by header key
# vertex_chunk_bytes.
# Fewest rows per range, whatever the widths; the ranges of a partition are balanced (sizes differ
# by at most one row), so none is smaller than half of this. WHY: the dense products of `update`
# pick their kernel by the number of rows, and on very few rows (under 8 here) another kernel sums
# each dot product in another order, ~1e-7 relative away from the one-pass result. They also depend
# on the rows' memory alignment: a range's own buffers start 64-byte aligned, so when a row is a
# multiple of 64 bytes (widths a multiple of 16 floats, e.g. 128) the step's output equals the
# one-pass output bit for bit; other widths agree within float tolerance (tests/dl/test_step_rows.py).
VERTEX_CHUNK_MIN_ROWS = 1024


def vertex_chunk_rows(model: Model, layer: int, pre: bool, chunk_bytes: int = VERTEX_CHUNK_BYTES) -> int:
    """Destination rows per range of the sums path: chunk_bytes over a row's float32 temporaries,
    counted as the sums (source width), the state and the finalized aggregate (state width each)
    and four rows of the widest output (the update's products and their sum, the post ops)."""
    conv = model.conv(layer)
    widest = max(conv.out_dim, model.post_list()[layer].out_dim(conv.out_dim), conv.in_dim)
    row_bytes = 4 * (conv.src_width(pre) + 2 * conv.state_width(pre) + 4 * widest)
    return max(VERTEX_CHUNK_MIN_ROWS, 1, int(chunk_bytes) // row_bytes)


def _row_ranges(n: int, rows: int) -> list[tuple[int, int]]:
    """ceil(n / rows) balanced ranges covering 0..n-1: at most `rows` rows each, and at least
    rows // 2 when n >= rows (no small tail range)."""
    k = max(1, -(-n // max(1, rows)))
    bounds = [n * i // k for i in range(k + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def rows_independent(model: Model, layer: int) -> bool:
    """Whether layer `layer`'s update and post compute each destination's row from that row alone
    (layers.rowwise), so the step may run them on destination ranges."""
    return layers_rows_independent(model.conv(layer), model.post_list()[layer])


@dataclass
class StepContext:
    model: Model
    header: dict
    tables: dict
    device: str

    @property
    def n_own(self) -> int:
        return self.tables["own"].num_rows

    def table(self, name: str) -> pa.Table:
        try:
            return self.tables[name]
        except KeyError:
            raise StepError(
                f"step {self.header.get('aggregate')}/{self.header.get('emit')} needs table {name!r}"
            ) from None

    def required_stats(self, conv) -> dict:
        """{name: values} of the statistics `conv` reads, from the own table's columns keyed by
        sparkgnn.stat_keys.stat_key (a conv without edge weights reads the unweighted ones)."""
        own = self.table("own")
        missing = [stat_key(conv, name) for name in conv.required_stats if stat_key(conv, name) not in own.column_names]
        if missing:
            raise StepError(f"layer {conv.kind} needs node statistics {missing} that the task did not carry")
        return {name: vector(own, stat_key(conv, name), self.device) for name in conv.required_stats}


def _check_finite(name: str, values: torch.Tensor) -> None:
    """Refuse NaN/Inf inputs. A NaN or Inf anywhere makes the sum non-finite, so one reduction (no
    |rows| x F boolean tensor to allocate and touch: a fifth of a layer step on 2M edges) clears the
    common case; a non-finite sum (a NaN, an Inf, or finite values whose float32 sum overflows)
    falls through to the element-wise check, which decides."""
    if not values.numel() or bool(torch.isfinite(values.sum())):
        return
    if not torch.isfinite(values).all():
        bad = (~torch.isfinite(values)).any(dim=-1).nonzero().flatten()[:5].tolist()
        raise StepError(f"table {name!r} holds NaN/Inf values in rows {bad}")


def _own_h(ctx: StepContext, table: str = "own") -> torch.Tensor:
    h = matrix(ctx.table(table), "h", ctx.device)
    _check_finite(table, h)
    return h


def _edge_weight(table: pa.Table, conv, device: str):
    """What the conv's messages read per edge: the `attr` rows [E, D] of a conv with edge
    attributes (layers/base.py), the weights of one that uses them, else None."""
    if conv.edge_attr_dim:
        if table.num_rows == 0:
            return torch.zeros(0, conv.edge_attr_dim, device=device)
        if "attr" not in table.column_names:
            raise StepError(f"{conv.kind} reads edge attributes but the edges table has no attr column")
        return matrix(table, "attr", device, conv.edge_attr_dim)
    if conv.uses_edge_weight and "weight" in table.column_names:
        return vector(table, "weight", device)
    return None


def local_partial(
    conv,
    src_pay,
    dst_pay,
    src,
    dst,
    weight,
    num_dst: int,
    pre: bool,
    chunk_bytes: int = MESSAGE_CHUNK_BYTES,
    mirror=None,
) -> torch.Tensor:
    """Partial aggregation states of `num_dst` destinations over local edges. Sources are local ids
    in [own | mirror]: rows of `src_pay`, then rows of `mirror` (None: no mirror rows).

    When the message is a scaled source payload and the state follows from sums and counts
    (GCN, SAGE-sum/mean, GIN), sparse CSR products give the sums without materialising an |E| x F
    message tensor (touching that much fresh memory dominated the step; docs/ARCHITECTURE.md,
    "Data movement and the planner"), one per payload block, so own and mirror rows are never copied into one
    tensor (_sparse_sums). Everything else goes through message + partial, in destination ranges
    holding at most `chunk_bytes` of messages at once (dl/chunks.py); its per-edge gathers index
    [own | mirror] as one tensor, so that path alone concatenates them."""
    scaled, scale = conv.message_scale(weight, pre)
    mirrors = mirror_blocks(mirror)
    if scaled and conv.aggregator.from_sums and src.numel():
        csr = by_destination(src, dst, num_dst, split=block_starts(src_pay, mirrors))
        sums = _sparse_sums(csr, scale, num_dst, src_pay, mirrors)
        return conv.aggregator.partial_from_sums(sums, csr.in_degree.to(torch.float32))

    src_all = src_pay
    if any(block.shape[0] for block in mirrors):
        src_all = torch.cat([src_pay] + [block.to(src_pay.dtype) for block in mirrors], dim=0)

    def partial(src_c, dst_c, weight_c, first: int, num: int) -> torch.Tensor:
        dst_e = None if dst_pay is None else dst_pay[dst_c + first]
        return conv.aggregator.partial(conv.message(src_all[src_c], dst_e, weight_c, pre), dst_c, num)

    width = src_all.shape[1] + (0 if dst_pay is None else dst_pay.shape[1])
    # gathered payloads + the message + the aggregator's per-edge intermediates: ~3 rows per edge
    return chunked_by_dst(partial, src, dst, weight, num_dst, 3 * 4 * width, chunk_bytes)


def mirror_blocks(mirror) -> list[torch.Tensor]:
    """Mirror payloads as a list of row blocks: None (no mirror rows), one tensor, or a list (one
    memory-mapped block per source partition, engine.routed_files)."""
    if mirror is None:
        return []
    return [mirror] if isinstance(mirror, torch.Tensor) else list(mirror)


def block_starts(own_src: torch.Tensor, mirrors: list[torch.Tensor]) -> tuple[int, ...]:
    """First source row of each mirror block in [own | mirror_0 | mirror_1 ...] (dl/csr.py split)."""
    starts, row = [], own_src.shape[0]
    for block in mirrors or [own_src[:0]]:
        starts.append(row)
        row += block.shape[0]
    return tuple(starts)


def _block_rows(block: Block, r0: int, r1: int) -> Block:
    """Destinations r0..r1-1 of a CSR block, as a CSR of its own (rows re-based to 0). A row range
    of a CSR is a contiguous edge range, so col and order are views; only the r1 - r0 + 1 offsets
    are new."""
    if r0 == 0 and r1 == block.crow.numel() - 1:
        return block
    e0, e1 = int(block.crow[r0]), int(block.crow[r1])
    return Block(crow=block.crow[r0 : r1 + 1] - e0, col=block.col[e0:e1], order=block.order[e0:e1])


def _sparse_sums(
    csr: Csr, scale, num_dst: int, own_src: torch.Tensor, mirror, rows: tuple[int, int] | None = None
) -> torch.Tensor:
    """Per-destination sums of (scaled) source rows: A_own @ own_src + A_mirror @ mirror (one
    product per mirror block when `mirror` is a list), the blocks of the CSR from dl/csr.py (built
    once per edge list and process), accumulated in place into one output (addmm_: `A @ X` would
    allocate a second output-sized buffer, and each block's product reads a smaller source matrix,
    faster than one product over the concatenation; docs/ARCHITECTURE.md). A row's sum adds its own
    edges first, then its mirror edges block by block; the float result differs from one product
    over [own | mirror] only by that order (~1e-7 relative).
    `rows` = (r0, r1): only destinations r0..r1-1 (row r0 of the result is destination r0); each
    row's edges and their order are those of the whole product, so its sum is the same."""
    r0, r1 = (0, num_dst) if rows is None else rows
    sums = torch.zeros(r1 - r0, own_src.shape[1], dtype=own_src.dtype, device=own_src.device)
    payloads = [own_src] + mirror_blocks(mirror)
    for number, whole in enumerate(csr.blocks):
        block = _block_rows(whole, r0, r1)
        if not block.num_edges:
            continue
        if number >= len(payloads):
            raise StepError(f"edges reference {'own' if number == 0 else 'mirror'} source rows the task did not carry")
        payload = payloads[number]
        values = (
            torch.ones(block.num_edges, dtype=sums.dtype, device=sums.device)
            if scale is None
            else scale[block.order].to(sums.dtype)
        )
        with warnings.catch_warnings():  # beta-state notices, once per process
            warnings.simplefilter("ignore", UserWarning)
            adjacency = torch.sparse_csr_tensor(block.crow, block.col, values, size=(r1 - r0, payload.shape[0]))
        sums.addmm_(adjacency, payload.to(sums.dtype))
    return sums


# ---- aggregate stages: produce h^(l) for own vertices -------------------------------------------


def aggregate_none(ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor | None]:
    x = _own_h(ctx)
    return ctx.model.pre(x), None


def _layer(ctx: StepContext):
    layer = int(ctx.header["layer"])
    if not 0 <= layer < ctx.model.num_rounds:
        raise StepError(f"layer {layer} out of range for a {ctx.model.num_rounds}-layer model")
    return layer, ctx.model.conv(layer), bool(ctx.header.get("pre_transform", False))


def _layer_inputs(ctx: StepContext):
    """The conv finishing in this step, its mode, the own vertices' h^(l-1) (checked) and stats."""
    layer, conv, pre = _layer(ctx)
    h = _own_h(ctx)
    if h.shape[1] != conv.in_dim:
        raise StepError(f"layer {layer} expects {conv.in_dim}-wide inputs, own.h is {h.shape[1]} wide")
    return layer, conv, pre, h, ctx.required_stats(conv)


def aggregate_edges(ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor | None]:
    from sparkgnn.layers.selfloops import apply_self_loops

    layer, conv, pre, h, stats = _layer_inputs(ctx)
    n_own = h.shape[0]
    mirror = matrices(ctx.table("mirror"), "p", ctx.device, conv.src_width(pre)) if "mirror" in ctx.tables else []
    own_src = conv.prepare_src(h, stats, pre)
    # kept apart from own_src (and block by block): local_partial concatenates only if it must
    for block in mirror:
        _check_finite("mirror", block)
    mirror = [block.to(own_src.dtype) for block in mirror]
    edges = ctx.table("edges")
    src, dst = index(edges, "src", ctx.device), index(edges, "dst", ctx.device)
    _check_range("edges.src", src, own_src.shape[0] + sum(block.shape[0] for block in mirror))
    _check_range("edges.dst", dst, n_own)
    if not conv.edge_mergeable:  # the generic fallback: the user's conv on [own | mirror] rows, all in-edges
        rows = torch.cat([own_src, *mirror], dim=0) if mirror else own_src
        return ctx.model.post(layer, cast(GenericConv, conv).neighbourhoods(rows, src, dst, n_own, h_own=h)), None
    src, dst, weight = apply_self_loops(src, dst, _edge_weight(edges, conv, ctx.device), n_own, conv.self_loops)
    scaled, scale = conv.message_scale(weight, pre)
    if scaled and conv.aggregator.from_sums and src.numel():
        csr = by_destination(src, dst, n_own, split=block_starts(own_src, mirror))
        rows = n_own
        if rows_independent(ctx.model, layer):
            chunk_bytes = int(ctx.header.get("vertex_chunk_bytes", VERTEX_CHUNK_BYTES))
            rows = vertex_chunk_rows(ctx.model, layer, pre, chunk_bytes)
        return _sums_by_rows(ctx, layer, conv, pre, h, stats, csr, scale, own_src, mirror, rows)
    dst_pay = conv.prepare_dst(h, stats) if conv.dst_width() else None
    chunk = int(ctx.header.get("message_chunk_bytes", MESSAGE_CHUNK_BYTES))
    # all in-edges: the full state
    state = local_partial(conv, own_src, dst_pay, src, dst, weight, n_own, pre, chunk, mirror=mirror)
    return ctx.model.post(layer, conv.update(h, conv.aggregator.finalize(state), stats, pre)), state


def _sums_by_rows(ctx, layer, conv, pre, h, stats, csr, scale, own_src, mirror, rows: int):
    """aggregate=edges on the sums path, in destination ranges of at most `rows` rows: per range its
    sums, state, finalize, update and post, written into one n_own-row output (the comment at
    VERTEX_CHUNK_BYTES). The merged states are kept (one n_own-row tensor) only when the header asks
    for them (with_state); otherwise the step returns None for the state."""
    n_own = h.shape[0]
    keep_state = bool(ctx.header.get("with_state"))
    counts = csr.in_degree.to(torch.float32)
    out = states = None
    for r0, r1 in _row_ranges(n_own, rows):
        sums = _sparse_sums(csr, scale, n_own, own_src, mirror, rows=(r0, r1))
        state = conv.aggregator.partial_from_sums(sums, counts[r0:r1])
        del sums
        part = {name: values[r0:r1] for name, values in stats.items()}
        y = ctx.model.post(layer, conv.update(h[r0:r1], conv.aggregator.finalize(state), part, pre))
        if r1 - r0 == n_own:  # one range: the tensors are the whole result, nothing to copy
            return y, (state if keep_state else None)
        if out is None:
            out = torch.empty((n_own, *y.shape[1:]), dtype=y.dtype, device=y.device)
            if keep_state:
                states = torch.empty((n_own, *state.shape[1:]), dtype=state.dtype, device=state.device)
        out[r0:r1] = y
        if states is not None:
            states[r0:r1] = state
        del y, state
    assert out is not None  # n_own > rows: at least two ranges ran
    return out, states


def aggregate_states(ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
    layer, conv, pre, h, stats = _layer_inputs(ctx)
    n_own = h.shape[0]
    states_table = ctx.table("states")
    states = matrix(states_table, "s", ctx.device, conv.state_width(pre))
    seg = index(states_table, "seg", ctx.device)
    _check_range("states.seg", seg, n_own)
    merged = conv.aggregator.merge(states, seg, n_own)
    return ctx.model.post(layer, conv.update(h, conv.aggregator.finalize(merged), stats, pre)), merged


def _check_range(name: str, values: torch.Tensor, bound: int) -> None:
    if values.numel() and (int(values.min()) < 0 or int(values.max()) >= bound):
        raise StepError(f"{name} holds local ids outside [0, {bound})")


def aggregate_given(ctx: StepContext) -> tuple[torch.Tensor, None]:
    """own.h already holds h^(l) (computed by the previous step of a two-step layer)."""
    return _own_h(ctx), None


AGGREGATE_STAGES = {
    "none": aggregate_none,
    "given": aggregate_given,
    "edges": aggregate_edges,
    "states": aggregate_states,
}


# ---- emit stages: what layer l+1 needs shipped --------------------------------------------------


def _next(ctx: StepContext):
    layer = int(ctx.header["layer"]) + 1
    if layer >= ctx.model.num_rounds:
        raise StepError(f"emit {ctx.header.get('emit')!r} asked after the last layer")
    return layer, ctx.model.conv(layer), bool(ctx.header.get("next_pre_transform", False))


def emit_none(ctx: StepContext, h: torch.Tensor) -> dict:
    own = {"h": h}
    if getattr(ctx.model, "output", "embedding") == "logits":
        own["pred"] = h.argmax(dim=1)
    return {"own": own}


def emit_src(ctx: StepContext, h: torch.Tensor) -> dict:
    _, conv, pre = _next(ctx)
    payload = conv.prepare_src(h, ctx.required_stats(conv), pre)
    return {"own": {"h": h}, "src": {"p": payload}}


def emit_dst(ctx: StepContext, h: torch.Tensor) -> dict:
    _, conv, _ = _next(ctx)
    payload = conv.prepare_dst(h, ctx.required_stats(conv))
    return {"own": {"h": h}, "dst": {"d": payload}}


def emit_partials(ctx: StepContext, h: torch.Tensor) -> dict:
    from sparkgnn.layers.selfloops import apply_self_loops

    _, conv, pre = _next(ctx)
    stats = ctx.required_stats(conv)
    n_own = h.shape[0]
    num_foreign = int(ctx.header.get("num_foreign", 0))
    src_pay = conv.prepare_src(h, stats, pre)
    dst_pay = None
    if conv.dst_width():
        own_dst = conv.prepare_dst(h, stats)
        foreign = matrix(ctx.table("foreign_dst"), "d", ctx.device, conv.dst_width()) if num_foreign else own_dst[:0]
        if foreign.shape[0] != num_foreign:
            raise StepError(f"foreign_dst has {foreign.shape[0]} rows, header says {num_foreign}")
        dst_pay = torch.cat([own_dst, foreign.to(own_dst.dtype)], dim=0)
    edges = ctx.table("out_edges")
    src, dst = index(edges, "src", ctx.device), index(edges, "dst", ctx.device)
    _check_range("out_edges.src", src, n_own)
    _check_range("out_edges.dst", dst, n_own + num_foreign)
    src, dst, weight = apply_self_loops(src, dst, _edge_weight(edges, conv, ctx.device), n_own, conv.self_loops)
    num_dst = n_own + num_foreign
    chunk = int(ctx.header.get("message_chunk_bytes", MESSAGE_CHUNK_BYTES))
    states = local_partial(conv, src_pay, dst_pay, src, dst, weight, num_dst, pre, chunk)
    touched = torch.bincount(dst, minlength=num_dst) > 0
    rows = touched.nonzero().flatten()
    return {"own": {"h": h}, "partials": {"row": rows.to(torch.int64), "s": states[rows]}}


EMIT_STAGES = {"none": emit_none, "src": emit_src, "dst": emit_dst, "partials": emit_partials}


def result_tables(result: dict[str, dict[str, torch.Tensor]]) -> dict[str, pa.Table]:
    """The emit stages' tensors as Arrow tables, brought to the host in one transfer (dl/staging.py):
    a matrix becomes a vector column, a 1-d tensor a plain column."""
    names = [(table, column) for table, columns in result.items() for column in columns]
    host = dict(zip(names, to_host([result[t][c] for t, c in names]), strict=True))
    tables = {}
    for table, columns in result.items():
        tables[table] = pa.table(
            {
                column: fixed_list(host[table, column])
                if host[table, column].dim() == 2
                else pa.array(host[table, column].numpy())
                for column in columns
            }
        )
    return tables


def run_step(model, header: dict, tables: dict, device: str = "cpu") -> dict:
    """Run one fused layer step; returns the result tables."""
    aggregate = header.get("aggregate", "none")
    emit = header.get("emit", "none")
    if aggregate not in AGGREGATE_STAGES:
        raise StepError(f"unknown aggregate stage {aggregate!r}; known: {sorted(AGGREGATE_STAGES)}")
    if emit not in EMIT_STAGES:
        raise StepError(f"unknown emit stage {emit!r}; known: {sorted(EMIT_STAGES)}")
    ctx = StepContext(model=model, header=header, tables=tables, device=device)
    if "own" not in tables:
        raise StepError("every step needs the 'own' table (the partition's vertices)")
    with torch.inference_mode(), staged(tables, device):
        h, state = AGGREGATE_STAGES[aggregate](ctx)
        result = EMIT_STAGES[emit](ctx, h)
        if header.get("with_state") and state is not None:
            result["state"] = {"s": state}  # the node's merged state (PE store)
        return result_tables(result)
