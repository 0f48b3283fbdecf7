"""Golden outputs: what every preset (and each optimizer on the default preset, and GPT-3 175B) simulates
to. Written once with the code before the speed work of issue #15 (commit 70036b7); the engine may get
faster, never different. tests/test_golden.py compares against tests/data/golden_outputs.json.

Regenerate only when a prediction is *meant* to change:  python -m tests.golden
(re-recorded since: the default CPU Adam rate became the Deep Optimizer States paper's measured
1.75e9 parameters/s per node, issue #13, which changes the offload cases and nothing else; the fp32
cast of an offloaded gradient partition moved from the compute stream to the stream that reduced it,
which changes offload-1.3b-2nodes/zero-one-adam alone, by 0.02%; GPT-3 13B's hidden size became 5120,
40 heads of 128, as Megatron-LM builds it: the paper's 5140 cannot be split into 40 heads, which
changes frontier-gpt3-13b-zero3 alone; the default CPU Adam rate became 1.51e9, the same log's rate
with its model's real size, and ZeRO-3's offloaded gradients take DeepSpeed's 16-bit round trip through
the host buffer, which change the offload cases alone: offload/zero and offload/placement-cpu +13.7%,
preset:offload-llama7b-h100 +0.3%; preset:offload-dos-7b-h100 is new; collectives paced by their
slowest node and NCCL's two-node tree priced as its tuner does, onebit-adam-ethernet +0.8%; 0/1 Adam's
update passes as DeepSpeed's zoadam.py writes them, default/zero-one-adam +6.4% and
offload-1.3b-2nodes/zero-one-adam +10.3%; Hugging Face's launch counts and the per-op eager backward,
offload-1.3b-2nodes/onebit-adam +0.4% and host-dispatch op times elsewhere; preset:mlperf-gpt3-175b-h100
is new and, past MAX_RECORDED_OPS, recorded by its op count and sums; page faults of the blocking
gradient copy and DeepSpeed's memory reports, preset:offload-dos-7b-h100 5.66 s -> 10.57 s; the
offload-1.3b-2nodes cases removed: 1-bit and 0/1 Adam are refused with offload, as DeepSpeed refuses
them; batch-norm priced per pass, preset:binsgdm-resnet50 +1.7%; the device's gap between queued
kernels added to analytically priced kernels, 0 to +2% wherever a GPU is device-bound; ZeRO-Offload
reduces in DeepSpeed's reduce_bucket_size buckets, offload/zero and offload/placement-cpu +0.2%; a
ZeRO-Offload rank holds DeepSpeed's gradient buckets and no gradient partition, as stage_1_and_2.py
with the optimizer offloaded does, so more subgroups stay resident: preset:offload-llama7b-h100 -21.7%).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

from clustersim.scenario import load_scenario, preset_names
from clustersim.simulator import runner, simulate

GOLDEN = Path(__file__).parent / "data" / "golden_outputs.json"
OPTIMIZERS = ("adam", "sgdm", "onebit-adam", "zero-one-adam", "binsgdm")


def cases() -> dict[str, tuple[object, bool]]:
    """name -> (scenario, memory check on)."""
    out = {f"preset:{name}": (load_scenario(f"preset:{name}"), True) for name in preset_names()}
    default = load_scenario("preset:default")
    for opt in OPTIMIZERS:
        out[f"default/{opt}"] = (default.with_changes(**{"training.optimizer": opt}), True)
    gpt3 = load_scenario("preset:dgx-h100-gpt3-1.3b").with_changes(**{"workload.model": "GPT-3-175B"})
    out["gpt3-175b (memory check off)"] = (gpt3, False)
    offload = load_scenario("preset:offload-llama7b-h100")
    out["offload/zero"] = (offload.with_changes(**{"training.offload.mode": "zero"}), True)
    out["offload/placement-cpu"] = (offload.with_changes(**{"training.offload.placement": "cpu"}), True)
    return out


@contextmanager
def memory_check(on: bool):
    if on:
        yield
    else:
        with mock.patch.object(runner, "check_fits", lambda ctx, mem: None):
            yield


def outputs(result) -> dict:
    """The numbers a run reports, plus every op's start and end on the most frequent step."""
    return {
        "iteration_time_s": result.iteration_time,
        "breakdown_s": result.breakdown,
        "bytes_per_link_kind": result.bytes_per_link_kind,
        "buckets": result.buckets,
        "steps": [
            {k: s[k] for k in ("label", "weight", "iteration_time_s", "intra_node_bytes", "inter_node_bytes")}
            for s in result.extra.get("steps", [])
        ],
        "offload_candidates": result.extra.get("offload", {}).get("candidates", {}),
        # placements the planner ruled out by a lower bound instead of simulating them (not in the
        # recorded outputs, which simulated every candidate)
        "offload_ruled_out": result.extra.get("offload", {}).get("ruled_out", {}),
        "ops": _ops(result.ops),
    }


# A program past this many ops (MLPerf's 512-GPU GPT-3 runs ~100k) is recorded by its op count and the
# sum of its ops' starts and ends instead of op by op: the file stays about a megabyte and any moved op
# still moves the sum.
MAX_RECORDED_OPS = 20_000


def _ops(ops) -> list | dict:
    if len(ops) <= MAX_RECORDED_OPS:
        return [[op.name, op.start, op.end] for op in ops]
    return {
        "count": len(ops),
        "sum_of_starts": sum(op.start for op in ops),
        "sum_of_ends": sum(op.end for op in ops),
    }


def run_case(scenario, check: bool) -> dict:
    with memory_check(check):
        return outputs(simulate(scenario))


def main() -> None:
    # Record every offload alternative simulated (no lower-bound pruning), as the first recording did:
    # the test checks each pruned alternative's bound against its recorded simulated time.
    with mock.patch("clustersim.simulator.engine.contention_free_end", lambda program: 0.0):
        data = {name: run_case(s, check) for name, (s, check) in cases().items()}
    GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN} ({len(data)} cases)")


if __name__ == "__main__":
    main()
