"""Custom layers with their parameter tensors: PyTorch DDP fills its buckets tensor by tensor.

Checked against PyTorch's bucket rule (reverse order, the first bucket closes at 1 MiB, later ones at
the cap), invariants (the tensors cover the layer's parameters exactly; splitting a layer into its
tensors changes no FLOP or byte of forward and backward, only which bucket a gradient lands in and so
how much of the all-reduce overlaps backward) and bad input (one line naming the key).
"""

from __future__ import annotations

import pytest

from clustersim.errors import InputError
from clustersim.simulator import simulate
from clustersim.simulator.strategies.buckets import MIB, assign_buckets
from clustersim.testbed.validate import Job, scenario_for
from clustersim.workloads.builder import build_workload
from tests.conftest import make_scenario

D = 256
ENCODER = [3 * D * D, 3 * D, D * D, D, 4 * D * D, 4 * D, 4 * D * D, D, D, D, D, D]


def _custom(tensors=None, **overrides):
    layer = {"name": "enc", "params": sum(ENCODER), "forward_flops": 1e8, "repeat": 2}
    if tensors is not None:
        layer["param_tensors"] = tensors
    return make_scenario(**{"workload.model": None, "workload.layers": [layer], **overrides})


def test_tensors_go_to_buckets_as_pytorch_fills_them():
    """Two encoder layers of d=256 (3.16 MB of fp32 gradients each): the first bucket closes at 1 MiB
    on the last layer's second feed-forward weight, everything else waits for the first layer."""
    w = build_workload(_custom(ENCODER).workload)
    buckets = assign_buckets(w.layers, 4, 25, 1)
    assert [b.elements for b in buckets] == [
        4 * D + 4 * D * D + D,
        2 * sum(ENCODER) - (4 * D + 4 * D * D + D),
    ]
    assert buckets[0].elements * 4 >= 1 * MIB
    assert [b.ready_layer for b in buckets] == [1, 0]
    whole = assign_buckets(build_workload(_custom().workload).layers, 4, 25, 1)
    assert [b.elements for b in whole] == [sum(ENCODER), sum(ENCODER)]  # one tensor: a layer per bucket


def test_splitting_into_tensors_changes_only_the_overlap():
    base = {"cluster.nodes": 2, "cluster.gpus_per_node": 1, "workload.precision": "fp32"}
    split, whole = simulate(_custom(ENCODER, **base)), simulate(_custom(**base))
    assert split.breakdown["forward"] == pytest.approx(whole.breakdown["forward"])
    # backward also holds each bucket's copy into its flat buffer: the same bytes, other bucket sizes
    assert split.breakdown["backward"] == pytest.approx(whole.breakdown["backward"], rel=0.01)
    assert split.bytes_per_link_kind == pytest.approx(whole.bytes_per_link_kind)
    # less of the all-reduce can start before the end of backward
    assert split.breakdown["exposed_communication"] > whole.breakdown["exposed_communication"]


def test_the_testbed_job_describes_torch_tensors():
    for job in (Job(model="transformer", layers=2, width=256), Job(model="mlp", width=512)):
        layer = scenario_for(2, 2e8, job).workload.layers[0]
        assert sum(layer.param_tensors) == job.layer_params
    assert Job(model="transformer", width=256).layer_tensors == ENCODER


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ([1000, 2000], "sum to 3,000 elements"),
        ([], "at least 1"),
        ([-5, sum(ENCODER) + 5], "each 0 or more"),
    ],
)
def test_bad_tensors_are_one_line_naming_the_key(tensors, message):
    with pytest.raises(InputError) as err:
        _custom(tensors)
    assert "workload.layers.0.param_tensors" in str(err.value)
    assert message in str(err.value)
