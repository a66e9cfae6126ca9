"""Transport interface: in-process transport, connect() registry, result verification."""

import fixture_handlers as fh
import pyarrow as pa
import pytest

from sparkgnn.messenger.errors import RemoteTaskError, TransportError
from sparkgnn.messenger.transport import TRANSPORTS, InProcessTransport, Transport, connect


@pytest.mark.parametrize("wire", [True, False])
def test_inprocess_call_and_map_in_order(wire):
    t = InProcessTransport(fh.scale, wire=wire)
    header, out = t.call({"op": "scale", "batch": "b0", "factor": 3.0, "id_column": "id"}, fh.batch(4))
    assert header["kind"] == "RESULT" and header["batch"] == "b0" and header["op"] == "scale"
    assert out["out"].column("x").to_pylist() == [0.0, 1.5, 3.0, 4.5]
    results = list(t.map(({"batch": i, "id_column": "id"}, fh.batch(3, 10 * i)) for i in range(5)))
    assert [h["batch"] for h, _ in results] == list(range(5))
    assert [o["out"].column("id")[0].as_py() for _, o in results] == [0, 10, 20, 30, 40]
    assert isinstance(t, Transport)


def test_inprocess_rejects_results_with_other_row_ids():
    def shuffled(header, tables):
        t = tables["batch"]
        return {}, {"out": t.take(pa.array(list(reversed(range(t.num_rows)))))}

    with pytest.raises(TransportError, match="row ids of result table 'out' differ"):
        InProcessTransport(shuffled).call({"batch": 1, "id_column": "id"}, fh.batch(4))


def test_inprocess_handler_error_names_batch_and_op():
    with pytest.raises(RemoteTaskError, match=r"batch 9 op 'scale'.*ValueError: asked to fail: bad width"):
        InProcessTransport(fh.scale).call({"batch": 9, "op": "scale", "fail": "bad width"}, fh.batch(2))


def test_connect_registry():
    assert isinstance(connect("inprocess", lambda: fh.scale), InProcessTransport)
    with pytest.raises(ValueError, match="unknown transport spec 'carrier-pigeon://x'"):
        connect("carrier-pigeon://x")
    with pytest.raises(ValueError, match="needs handler_factory"):
        connect("inprocess")
    assert {"inprocess", "tcp", "ipc", "inproc", "local"} <= set(TRANSPORTS)
    t = connect("tcp://127.0.0.1:1", timeout_s=1)
    assert type(t).__name__ == "MessengerTransport"
    t.close()
