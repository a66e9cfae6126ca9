"""dl/staging.py: a step's input columns packed into one buffer and copied to the device at once,
its results brought back at once, with the same answers as the unstaged step."""

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch_geometric.nn import GraphSAGE

from sparkgnn.arrowvec import ALIGNMENT, to_fixed_list
from sparkgnn.dl import csr, staging
from sparkgnn.dl.step import run_step
from sparkgnn.models import Model

F = 8


def _tables(seed=0, n_own=30, mirror_blocks=(25, 15), edges=400):
    rng = np.random.default_rng(seed)
    own = pa.table({"h": to_fixed_list(rng.normal(size=(n_own, F)).astype(np.float32))})
    chunks = [to_fixed_list(rng.normal(size=(n, F)).astype(np.float32)) for n in mirror_blocks]
    mirror = pa.table({"p": pa.chunked_array(chunks)})  # one block per source file, as mapped
    rows = n_own + sum(mirror_blocks)
    edge_table = pa.table({"src": rng.integers(0, rows, edges), "dst": rng.integers(0, n_own, edges)})
    return {"own": own, "mirror": mirror, "edges": edge_table}


def test_every_input_array_is_staged_once_aligned_and_equal():
    tables = _tables()
    lookup = staging.stage(tables, "cpu", pin=False)
    arrays = staging.input_arrays(tables)
    # own h, two mirror blocks, src, dst: each a distinct block of the one packed buffer
    assert len(arrays) == len(lookup) == 5
    for values in arrays:
        view = lookup[staging._key(values)]
        assert view.data_ptr() != values.ctypes.data and view.data_ptr() % ALIGNMENT == 0
        np.testing.assert_array_equal(view.numpy(), values)


def test_a_staged_step_equals_the_unstaged_one_bit_for_bit():
    csr.clear()
    torch.manual_seed(0)
    model = Model.from_pyg(GraphSAGE(F, F, 1).eval(), output="embedding")
    tables = _tables(seed=1)
    header = {"layer": 0, "aggregate": "edges", "emit": "none"}
    expected = run_step(model, header, tables)["own"]
    csr.clear()
    with staging.staged(tables, "cpu", force=True):  # the accelerator path's packing, on the CPU
        assert staging.lookup(staging.input_arrays(tables)[0]) is not None
        got = run_step(model, header, tables)["own"]
    assert staging.lookup(staging.input_arrays(tables)[0]) is None  # the lookup ends with the block
    assert got.equals(expected)


def test_the_host_buffer_made_inside_a_step_takes_a_stage_outside_one():
    """The reused host buffer is first made inside a step (under torch.inference_mode); a later
    stage outside inference mode still writes into it."""
    staging._HOST.pop("cpu", None)
    tables = _tables(seed=3)
    with torch.inference_mode():
        staging.stage(tables, "cpu", pin=False)
    lookup = staging.stage(tables, "cpu", pin=False)
    for values in staging.input_arrays(tables):
        np.testing.assert_array_equal(lookup[staging._key(values)].numpy(), values)


def test_results_come_back_as_they_are_on_the_cpu():
    h, rows = torch.randn(5, 3), torch.arange(4)
    back = staging.to_host([h, rows])
    assert back[0] is h or back[0].data_ptr() == h.data_ptr()
    assert torch.equal(back[1], rows)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_step_on_cuda_equals_the_cpu_step():
    csr.clear()
    torch.manual_seed(0)
    module = GraphSAGE(F, F, 1).eval()
    tables = _tables(seed=2)
    header = {"layer": 0, "aggregate": "edges", "emit": "none"}
    expected = run_step(Model.from_pyg(module, output="embedding"), header, tables)["own"]
    on_gpu = Model.from_pyg(module, output="embedding").to("cuda")
    got = run_step(on_gpu, header, tables, device="cuda")["own"]
    torch.testing.assert_close(
        torch.from_numpy(np.stack(got.column("h").to_numpy(zero_copy_only=False))),
        torch.from_numpy(np.stack(expected.column("h").to_numpy(zero_copy_only=False))),
        rtol=1e-5,
        atol=1e-5,
    )
    packed = staging.stage(tables, "cuda")
    assert all(t.device.type == "cuda" for t in packed.values())
    assert staging.host_buffer(1, "cuda", True).is_pinned()
    back = staging.to_host([torch.ones(3, 2, device="cuda"), torch.arange(3, device="cuda")])
    assert [t.device.type for t in back] == ["cpu", "cpu"] and torch.equal(back[1], torch.arange(3))
