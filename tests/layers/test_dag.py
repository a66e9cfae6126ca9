"""layers/dag.py: the save / combine node ops and the rows that carry saved values between
rounds. A spec whose slots do not fit (read before saved, never read, saved twice, widths that
disagree) is refused with one line; a carried stack computes what the ops compute on separate
tensors. The PE store, refresh and serving of DAG models: tests/pe and tests/serving."""

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


def test_model_batching_runs_a_dag_model_alone():
    """A batch shares one row per vertex between models side by side, which keeps no saved slots:
    a DAG model is named as the reason it cannot join (it runs as a batch of its own)."""
    from sparkgnn.models.batching import why_incompatible

    dag, chain = Model(_spec([SAVE], [], [ADD])), Model(_spec([], [], []))
    assert dag.is_dag and not chain.is_dag
    assert "dag has skip connections" in why_incompatible([chain, dag], ["chain", "dag"])
