"""Neighbouring pipeline stages on different nodes send over the NIC: with Megatron's rank order
(tp + t*dp + t*d*pp) a node holds g / (t*d) whole stages when t*d < g, so every (g / (t*d))-th stage
boundary crosses nodes; the sends across are priced on the network and counted as NIC bytes."""

import pytest

from clustersim.scenario import Scenario
from clustersim.simulator import simulate
from clustersim.simulator.context import build_context


def _pp(**changes):
    s = Scenario.model_validate(
        {
            "name": "pp",
            "cluster": {
                "nodes": 2,
                "gpus_per_node": 8,
                "gpu": "H100-SXM",
                "intra_node": {"fabric": "nvswitch"},
                "nic": {"kind": "ethernet_tcp", "count": 8, "line_rate_gbps": 400},
            },
            "workload": {"model": "GPT-3-13B", "micro_batch": 1, "seq_len": 2048, "precision": "bf16",
                         "gradient_accumulation": 8},
            "training": {"optimizer": "adam", "parallelism": {"tensor": 1, "pipeline": 4,
                                                             "distributed_optimizer": True}},
        }
    )  # fmt: skip
    return s.with_changes(**changes)


def test_which_boundaries_cross_nodes_follows_the_rank_order():
    L = build_context(_pp()).layout  # t*d = 4 on nodes of 8: stages 0-1 on node 0, 2-3 on node 1
    assert [L.stages_pair(s, s + 1).nodes for s in range(3)] == [1, 2, 1]
    assert L.crossing_boundaries() == 1
    wide = build_context(_pp(**{"cluster.nodes": 4, "training.parallelism.tensor": 2}))
    assert wide.layout.crossing_boundaries() == 3  # t*d = 2*4 fills a node: every boundary crosses


def test_sends_across_nodes_are_nic_bytes_and_a_slower_nic_is_slower():
    fast, slow = simulate(_pp()), simulate(_pp(**{"cluster.nic.line_rate_gbps": 10}))
    ctx = build_context(_pp())
    activation = 1 * 2048 * ctx.layout.arch.hidden * ctx.element_bytes
    sends = [o for o in fast.ops if o.name.startswith("send ")]
    across = [o for o in sends if o.inter_node_bytes > 0]
    # one boundary of three crosses: each of the 8 micro-batches sends its activation forward and its
    # gradient back over it, from each of the t*d = 4 GPUs on that edge of the node at once
    assert len(sends) == 8 * 2 * 3 and len(across) == 8 * 2
    assert sum(o.inter_node_bytes for o in across) == pytest.approx(8 * 2 * activation * 4)
    assert all(o.intra_node_bytes == 0 for o in across)
    # the first and last stage (nodes 0 and 1) all-reduce the tied embedding over the NIC too
    tied = [o for o in fast.ops if o.name.startswith("all_reduce tied embedding")]
    assert tied and all(o.inter_node_bytes > 0 for o in tied)
    assert slow.iteration_time > fast.iteration_time


def test_run_says_which_boundaries_cross():
    placement = build_context(_pp()).layout.describe()["pipeline_group"]
    assert "at 1 of 3 boundaries, which cross nodes" in placement
