"""layers/dag.py: the save / combine node ops and the rows that carry saved values between
rounds. A spec whose slots do not fit (read before saved, never read, saved twice, widths that
disagree) is refused with one line; a carried stack computes what the ops compute on separate
tensors."""

import pytest
import torch

from sparkgnn.layers.dag import CarryStack, CombineOp, Layout, SaveOp
from sparkgnn.layers.nodeops import ActivationOp
from sparkgnn.models import Model


def _spec(pre, post0, post1):
    conv = {"kind": "sage", "in_dim": 4, "out_dim": 4, "aggr": "mean"}
    return {
        "format": "sparkgnn.Model",
        "version": 1,
        "output": "embedding",
        "in_dim": 4,
        "pre": pre,
        "convs": [conv, conv],
        "post": [post0, post1],
    }


SAVE = {"op": "save", "slot": "s0"}
ADD = {"op": "combine", "mode": "add", "inputs": ["h", "s0"], "widths": [4, 4]}


def test_a_spec_with_a_residual_builds_carry_rounds():
    model = Model(_spec([SAVE], [], [ADD]))
    assert [c.kind for c in model.conv_list()] == ["sage+carry", "sage+carry"]
    assert [c.in_dim for c in model.conv_list()] == [8, 8]
    assert model.out_dim == 4


@pytest.mark.parametrize(
    ("pre", "post0", "post1", "needle"),
    [
        ([], [], [ADD], "read but never saved"),
        ([SAVE], [], [], "saved but never read"),
        ([SAVE], [SAVE], [ADD], "saved while still carried"),
        ([SAVE], [], [{**ADD, "widths": [4, 3]}], "one width"),
        ([SAVE], [], [{**ADD, "inputs": ["s0", "s0"]}], "exactly once"),
        ([SAVE], [], [{**ADD, "mode": "mean"}], "mode must be one of"),
    ],
)
def test_slots_that_do_not_fit_are_refused(pre, post0, post1, needle):
    with pytest.raises(ValueError, match=needle):
        Model(_spec(pre, post0, post1))


def test_a_carry_stack_applies_plain_ops_to_the_main_columns_and_combines_the_slots():
    x = torch.randn(5, 3)
    carried = torch.randn(5, 2)
    ops = [ActivationOp("relu"), SaveOp("s1"), ActivationOp("tanh"), CombineOp("cat", ["s0", "h", "s1"], [2, 3, 3])]
    stack = CarryStack(ops, Layout(3, [("s0", 2)]), drops=[[], [], [], ["s0", "s1"]])
    out = stack(torch.cat([x, carried], dim=1))
    assert torch.equal(out, torch.cat([carried, torch.tanh(x.relu()), x.relu()], dim=1))
    assert stack.out_dim(5) == 8 and stack.layout_out.carried == []
    with pytest.raises(ValueError, match="expect width 5"):
        stack.out_dim(3)


def test_combine_max_is_the_elementwise_maximum():
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    assert torch.equal(CombineOp("max", ["h", "s0"], [3, 3]).combine([a, b]), torch.maximum(a, b))


def _small_graph():
    import numpy as np

    from sparkgnn.graph import GraphData

    ids = np.arange(6, dtype=np.int64)
    x = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    return GraphData.from_edge_ids(ids, x, np.array([0, 1, 2, 3, 3]), np.array([1, 2, 3, 0, 3]), name="dag-small")


def test_jobs_that_do_not_carry_skip_columns_refuse_a_dag_model_in_one_line(tmp_path):
    from sparkgnn.errors import UnsupportedModelError
    from sparkgnn.graph.updates import GraphUpdate
    from sparkgnn.models.batching import why_incompatible
    from sparkgnn.pe.local import precompute_local
    from sparkgnn.pe.refresh import refresh_local
    from sparkgnn.serving.engine import QueryEngine

    model, graph = Model(_spec([SAVE], [], [ADD])), _small_graph()
    jobs = {
        "the PE precompute": lambda: precompute_local(graph, model, str(tmp_path / "store")),
        "a PE store refresh": lambda: refresh_local(graph, GraphUpdate(), model, str(tmp_path / "store")),
        "serving": lambda: QueryEngine(graph, model),
    }
    for job, run in jobs.items():
        with pytest.raises(UnsupportedModelError) as info:
            run()
        msg = str(info.value)
        assert msg.startswith(f"{job} does not carry skip connections") and "sparkgnn.infer" in msg, msg
        assert "\n" not in msg
    chain = Model(_spec([], [], []))
    assert "skip connections" in why_incompatible([chain, model], ["chain", "dag"])
