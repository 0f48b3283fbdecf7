"""The input pipeline over PCIe (simulator/input_pipeline.py): closed forms for both ways of loading a
batch, prefetch overlap, alignment, and resource sharing."""

import math

import pytest
from conftest import make_scenario

from clustersim.errors import InputError
from clustersim.simulator import simulate
from clustersim.simulator.context import build_context
from clustersim.simulator.input_pipeline import gather_dram_bytes, pcie_bytes

LAYERS = [
    {"name": "sage", "params": 1_000_000, "forward_flops": 2e9, "forward_bytes": 2e6, "repeat": 3},
]


def gcn(**input_spec):
    spec = {
        "bytes_per_sample": 100_000,
        "row_bytes": 512,
        "mode": "host_gather",
        "prefetch": False,
        **input_spec,
    }
    return make_scenario(
        **{
            "cluster.nodes": 1,
            "workload.model": None,
            "workload.layers": LAYERS,
            "workload.micro_batch": 1024,
            "workload.input": spec,
        }
    )


def plain():
    return make_scenario(
        **{
            "cluster.nodes": 1,
            "workload.model": None,
            "workload.layers": LAYERS,
            "workload.micro_batch": 1024,
        }
    )


def test_bytes_follow_rows_lines_and_alignment():
    spec = gcn(row_bytes=300).workload.input
    rows = 1024 * 100_000 / 300
    assert pcie_bytes(spec, 1024) == pytest.approx(rows * 3 * 128)  # 300 B -> three 128-B requests
    unaligned = spec.model_copy(update={"aligned": False})
    assert pcie_bytes(unaligned, 1024) == pytest.approx(rows * 4 * 128)
    assert gather_dram_bytes(spec, 1024) == pytest.approx(rows * (math.ceil(300 / 64) * 64 + 300))


def test_host_gather_without_prefetch_adds_gather_and_copy():
    """Without prefetch the forward waits: the step grows by the CPU gather (DRAM roofline of the rank's
    share) plus the H2D copy (PCIe), the closed forms of the host model."""
    s = gcn()
    ctx = build_context(s)
    host = ctx.host
    nbytes = 1024 * 100_000
    gather = gather_dram_bytes(s.workload.input, 1024) / host.dram_share
    copy = nbytes / min(host.pcie, host.switch_share, host.dram_share)
    base = simulate(plain(), uncertainty_samples=0).iteration_time
    got = simulate(s, uncertainty_samples=0).iteration_time
    assert got - base == pytest.approx(gather + copy, rel=1e-6)


def test_prefetch_hides_a_small_input_and_is_bounded_by_a_large_one():
    base = simulate(plain(), uncertainty_samples=0).iteration_time
    small = simulate(gcn(prefetch=True), uncertainty_samples=0).iteration_time
    assert small == pytest.approx(base, rel=1e-9)
    huge = gcn(prefetch=True, bytes_per_sample=20_000_000)
    ctx = build_context(huge)
    copy = 1024 * 20_000_000 / min(ctx.host.pcie, ctx.host.switch_share, ctx.host.dram_share)
    t = simulate(huge, uncertainty_samples=0).iteration_time
    assert t >= copy and t >= base  # the slower chain bounds the step
    no_prefetch = simulate(gcn(prefetch=False, bytes_per_sample=20_000_000), uncertainty_samples=0)
    assert t < no_prefetch.iteration_time


def test_zero_copy_beats_the_cpu_gather_and_alignment_matters():
    """Zero-copy skips the CPU pass; unaligned rows cost one more 128-byte request each."""
    host = simulate(gcn(mode="host_gather"), uncertainty_samples=0).iteration_time
    aligned = simulate(gcn(mode="zero_copy"), uncertainty_samples=0).iteration_time
    unaligned = simulate(gcn(mode="zero_copy", aligned=False), uncertainty_samples=0).iteration_time
    assert aligned < host
    assert unaligned > aligned
    base = simulate(plain(), uncertainty_samples=0).iteration_time
    assert (unaligned - base) / (aligned - base) == pytest.approx(5 / 4, rel=1e-6)  # 4 vs 5 lines per row


def test_faster_pcie_is_never_slower():
    times = [
        simulate(
            gcn(mode=m).with_changes(**{"cluster.intra_node.pcie_gen": g}), uncertainty_samples=0
        ).iteration_time
        for m in ("host_gather", "zero_copy")
        for g in (3, 4, 5)
    ]
    assert times[0] >= times[1] >= times[2]
    assert times[3] >= times[4] >= times[5]


def test_input_batches_count_in_gpu_memory():
    r = simulate(gcn(prefetch=True), uncertainty_samples=0)
    assert r.memory["input_batches"] == pytest.approx(2 * 1024 * 100_000)


def test_bad_input_spec_names_its_key():
    with pytest.raises(InputError) as exc:
        gcn(bytes_per_sample=-1)
    assert "workload.input.bytes_per_sample" in str(exc.value)


def test_input_batches_that_do_not_fit_name_the_input_not_the_model():
    """Batches too large for the GPU are the input's doing: the error names
    workload.input.bytes_per_sample, not the model's weights and optimizer state."""
    with pytest.raises(InputError) as err:
        simulate(gcn(bytes_per_sample=1e12))
    msg = str(err.value)
    assert err.value.key == "workload.input.bytes_per_sample"
    assert "input batches" in msg and "optimizer state alone" not in msg


@pytest.mark.parametrize("stage", [1, 3])
def test_sharded_programs_load_their_input_too(stage):
    """ZeRO programs build their own forward passes (stage 3 gathers parameters before each layer): the
    input pipeline applies there as well, so without prefetch the step grows by the batch's load."""
    with_input = gcn().with_changes(**{"training.sharding.stage": stage})
    without = plain().with_changes(**{"training.sharding.stage": stage})
    t_in = simulate(with_input, uncertainty_samples=0).iteration_time
    t_out = simulate(without, uncertainty_samples=0).iteration_time
    assert t_in > t_out
