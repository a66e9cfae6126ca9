"""Result verification shared by every transport: the result must answer *this* batch (batch id
and the dealer's token), its payload hash was checked by protocol.decode, and when the request
names an `id_column`, every result table carrying that column must list exactly the request's
ids in order (Lotan's hash index: match and verify by batch id + hash + row ids)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from sparkgnn.messenger import hashing
from sparkgnn.messenger.protocol import ProtocolError


def column_digest(table: pa.Table, column: str) -> str:
    values = table.column(column).to_numpy()
    return hashing.digest([np.ascontiguousarray(values).view(np.uint8)])


def request_ids(header: dict, tables: dict) -> str | None:
    """Digest of the request's id column (first table in order that has it), or None."""
    column = header.get("id_column")
    if not column:
        return None
    for table in tables.values():
        if column in table.column_names:
            return column_digest(table, column)
    raise ProtocolError(f"id_column {column!r} is in none of the request tables {list(tables)}")


def check_result(request: dict, result: dict, tables: dict, expected_ids: str | None) -> None:
    if result.get("batch") != request.get("batch"):
        raise ProtocolError(f"result is for batch {result.get('batch')!r}, expected {request.get('batch')!r}")
    if expected_ids is None:
        return
    column = request["id_column"]
    carrying = [name for name, t in tables.items() if column in t.column_names]
    if not carrying:
        raise ProtocolError(f"batch {request.get('batch')!r}: no result table has id column {column!r}")
    for name in carrying:
        if column_digest(tables[name], column) != expected_ids:
            raise ProtocolError(
                f"batch {request.get('batch')!r}: row ids of result table {name!r} differ from the request's"
            )
