"""Smaller defects: offload suggested only where it can fit; a command's phases share one clock."""

import pytest

from clustersim.errors import InputError
from clustersim.scenario import load_scenario
from clustersim.simulator import simulate


def _error(model: str, optimizer: str) -> str:
    s = load_scenario("preset:default").with_changes(
        **{"workload.model": model, "training.optimizer": optimizer}
    )
    with pytest.raises(InputError) as exc:
        simulate(s)
    return exc.value.message


@pytest.mark.parametrize("model,optimizer", [("GPT-3-175B", "binsgdm"), ("GPT-2-1.5B", "onebit-adam")])
def test_offload_is_never_suggested_for_an_optimizer_that_cannot_be_offloaded(model, optimizer):
    """A whole-replica optimizer that does not fit is told to use GPUs with more memory, never
    training.offload, which it is refused with (sharding_rules._NOT_OFFLOADED)."""
    text = _error(model, optimizer)
    assert "runs only as whole replicas on the GPUs" in text and "try training.offload" not in text
    assert "GPUs with more memory" in text


def test_a_commands_phases_share_one_clock():
    """compare's simulations, then its break-even: the second phase's elapsed time goes on from the
    first's, not from zero; its estimate of what is left is its own."""
    import time

    from clustersim.commands import support

    support._command_start[0] = time.monotonic() - 100.0
    try:
        phase = support.PlainProgress("compare", "simulations", total=10, every_s=1e9)
        phase.done = 5
        line = phase.line()
        phase.close()
    finally:
        support._command_start[0] = None
    elapsed = float(line.split(", ")[1].split(" s elapsed")[0].replace(",", ""))
    assert elapsed >= 100.0 and line.endswith("~0 s left"), line


def test_plan_says_when_its_counted_candidates_are_done_and_choosing_runs(capsys):
    """A plan's progress read 'candidates 28/28' for seconds while the bands ran: the stage after the
    count is said (PlainProgress.say through the callback's say, planning.say_stage)."""
    from clustersim.commands import support
    from clustersim.planner.planning import say_stage

    with support.progress_bar("plan", "candidates") as update:
        update(3, 3)
        say_stage(update, "choosing: the bands")
    err = capsys.readouterr().err
    assert "plan: choosing: the bands" in err
    say_stage(lambda done, total=None: None, "ignored")  # a plain callable has no say: nothing happens


def test_one_gpu_out_of_memory_is_pointed_at_offload_not_at_more_ranks():
    """LLaMA-7B with Adam on one H100 does not fit: the advice was ZeRO-3 or tensor/pipeline
    parallelism, which need more GPUs (ZeRO-3 then refused: 'divides model states by the data-parallel
    size'); on one GPU only the host helps. On two nodes the sharding advice stays."""
    one = load_scenario("preset:offload-llama7b-h100").with_changes(**{"training.offload.mode": "none"})
    with pytest.raises(InputError) as err:
        simulate(one)
    assert "on one GPU try training.offload" in err.value.message
    assert "sharding.stage: 3" not in err.value.message.split("GPUs with more memory")[0]
    with pytest.raises(InputError) as err:
        simulate(one.with_changes(**{"cluster.nodes": 2}))
    assert "try training.sharding.stage: 3" in err.value.message


def test_a_micro_batch_that_offload_makes_room_for_says_so():
    """GPT-2 XL at micro-batch 21 on an A100-80GB misses by 0.55 GiB: besides the largest micro-batch
    that fits (20), the error says that moving the optimizer state (11.61 GiB) to the host keeps 21,
    and that run then fits. At 40 no offload makes room, and none is suggested."""
    s = load_scenario("preset:default").with_changes(
        **{
            "cluster.gpu": "A100-80GB",
            "cluster.gpus_per_node": 8,
            "workload.model": "GPT-2-1.5B",
            "workload.seq_len": 1024,
            "workload.precision": "bf16",
        }
    )
    fits = None
    for b in range(16, 40):
        try:
            simulate(s.with_changes(**{"workload.micro_batch": b}), uncertainty_samples=0)
        except InputError:
            fits = b - 1
            break
    assert fits is not None
    with pytest.raises(InputError) as err:
        simulate(s.with_changes(**{"workload.micro_batch": fits + 1}), uncertainty_samples=0)
    assert err.value.key == "workload.micro_batch" and "training.offload (mode: zero)" in err.value.message
    offloaded = s.with_changes(**{"workload.micro_batch": fits + 1, "training.offload.mode": "zero"})
    assert simulate(offloaded, uncertainty_samples=0).iteration_time > 0
    with pytest.raises(InputError) as err:
        simulate(s.with_changes(**{"workload.micro_batch": 2 * fits}), uncertainty_samples=0)
    assert "training.offload" not in err.value.message
