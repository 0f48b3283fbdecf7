"""One source of which layers recompute and how (Layout.recomputation / recomputed_kernels), read by the
pipeline program's passes (megatron._pass_times) and by the rank workload the data-parallel programs run
over a tensor-parallel layout (Layout.rank_workload): both add exactly the kernels it names."""

from __future__ import annotations

import math

import pytest

from clustersim.simulator.context import build_context
from clustersim.simulator.strategies.megatron import _pass_times
from tests.test_recompute_layers import _llama
from tests.test_recompute_layers import _scenario as megatron_scenario

MODES = [
    ({"recompute": "none"}, ["none"] * 24),
    ({"recompute": "selective"}, ["selective"] * 24),
    ({"recompute": "full"}, ["full"] * 24),
    # the first 5 of each chunk of 12 blocks (p = 2)
    (
        {"recompute": "full", "recompute_method": "block", "recompute_num_layers": 5},
        (["full"] * 5 + ["none"] * 7) * 2,
    ),
    ({"recompute": "full", "recompute_method": "uniform", "recompute_num_layers": 4}, ["full"] * 24),
]


@pytest.mark.parametrize(("par", "blocks"), MODES)
def test_each_block_is_said_recomputed_once_and_the_pass_adds_what_is_said(par, blocks):
    """GPT-3 1.3B (24 blocks) on t = 2 x p = 2: the embedding and head never recompute; the blocks as
    the mode says; a chunk's backward pass is its layers' backward plus exactly the kernels named as
    run again (a full block's forward as its own forward is priced)."""
    ctx = build_context(megatron_scenario(t=2, p=2, **par))
    lay = ctx.layout
    layers = ctx.workload.layers
    assert [lay.recomputation(x) for x in layers] == ["none", *blocks, "none"]
    for chunk in lay.chunks:
        _, bwd = _pass_times(ctx, chunk)
        own = sum(ctx.rank_backward_time(x) for x in chunk.layers)
        again = sum(ctx.rank_kernels_time(lay.recomputed_kernels(x)) for x in chunk.layers)
        host = sum(
            ctx.host_backward_time(x) + ctx.host_kernels_time(lay.recomputed_kernels(x)) for x in chunk.layers
        )
        assert math.isclose(bwd, max(own + again, host), rel_tol=1e-12)
        assert (again > 0) == (par["recompute"] != "none")


@pytest.mark.parametrize(
    ("scenario", "how"),
    [
        (lambda: megatron_scenario(t=2, sharding="fsdp", recompute="selective"), "selective"),
        (lambda: megatron_scenario(t=2, sharding="fsdp", recompute="full"), "full"),
        (lambda: _llama("selective_op"), "selective_op"),
        (lambda: _llama("none"), "none"),
    ],
)
def test_the_rank_workload_runs_again_what_the_layout_names(scenario, how):
    """Over a tensor-parallel layout without a pipeline the data-parallel programs run the rank workload:
    each block's backward there is what Layout.recomputed_kernels names, then its own backward."""
    ctx = build_context(scenario())
    lay = ctx.layout
    for layer, rank_layer in zip(lay.workload.layers, lay.rank_workload.layers, strict=True):
        expected = "none" if not layer.name.startswith("block") else how
        assert lay.recomputation(layer) == expected
        own = lay.kernels(layer.backward, backward=True)
        assert rank_layer.backward == lay.recomputed_kernels(layer) + own
