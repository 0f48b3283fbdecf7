"""Inputs and output of CPU offload that a user can get wrong or misread: the CPU optimizer's threads per
GPU, and what the exposed host time of an offloaded run is."""

import pytest

from clustersim.errors import InputError
from clustersim.scenario import load_scenario


def _zero(**changes):
    base = {"training.sharding.stage": 3, "training.offload.mode": "zero", "cluster.host.cores": 32}
    return load_scenario("preset:default").with_changes(**{**base, **changes})


def test_more_optimizer_threads_than_the_nodes_cores_are_refused_by_key():
    # preset:default has 4 GPUs per node: 32 cores give each rank 8
    s = _zero(**{"training.offload.cpu_threads": 8})
    assert s.training.offload.cpu_threads * s.cluster.gpus_per_node <= s.cluster.host.cores
    with pytest.raises(InputError) as exc:
        _zero(**{"training.offload.cpu_threads": 9})
    assert exc.value.key == "training.offload.cpu_threads"
    assert "at most 8 per GPU" in exc.value.message and "cluster.host.cores" in exc.value.message


def test_one_thread_per_gpu_is_allowed_on_a_host_with_fewer_cores_than_gpus():
    s = _zero(**{"cluster.host.cores": 4, "training.offload.cpu_threads": 1})
    assert s.training.offload.cpu_threads == 1


def test_run_says_the_exposed_host_time_of_an_offloaded_run_includes_the_cpu_update():
    from typer.testing import CliRunner

    from clustersim.cli import app

    out = CliRunner().invoke(app, ["run", "preset:offload-dos-7b-h100", "--samples", "0"])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "exposed host is the time the GPU waits for the host: the CPU optimizer's update" in text
    plain = CliRunner().invoke(app, ["run", "preset:default", "--samples", "0"])
    assert "CPU optimizer's update" not in plain.output


def _thirteen_b(**changes):
    base = {
        "cluster": {
            "nodes": 1,
            "gpus_per_node": 8,
            "gpu": "A100-80GB",
            "intra_node": {"fabric": "nvswitch"},
            "nic": {"kind": "ethernet_tcp", "count": 1, "line_rate_gbps": 100},
            "host": {"sockets": 2, "cores": 64, "memory_gib": 1024},
        },
        "workload": {"model": "GPT-3-13B", "micro_batch": 4, "seq_len": 2048, "precision": "bf16"},
        "training": {"optimizer": "adam", "sharding": {"stage": 3}, "offload": {"mode": "interleaved"}},
    }
    from clustersim.scenario import Scenario

    return Scenario.model_validate({"name": "thirteen-b", **base}).with_changes(**changes)


def test_interleaved_resident_state_leaves_the_headroom_the_memory_model_does_not_count():
    from clustersim.simulator import simulate

    # interleaved keeps subgroups on the GPU only up to THIN_HEADROOM of it free (it used to fill the
    # GPU to its last megabytes and then be told to shrink a micro-batch that was not the cause)
    close = simulate(_thirteen_b())
    assert close.memory["capacity"] - close.memory["total"] >= 0.05 * close.memory["capacity"]
    assert not any("CUDA context" in n for n in close.notes)
    roomy = simulate(_thirteen_b(**{"workload.micro_batch": 1, "training.offload.mode": "none"}))
    assert not any("CUDA context" in n for n in roomy.notes)


def test_an_offloaded_rank_that_only_its_micro_batch_tips_over_names_the_micro_batch():
    with pytest.raises(InputError) as exc:
        from clustersim.simulator import simulate

        simulate(_thirteen_b(**{"training.offload.mode": "zero", "workload.micro_batch": 6}))
    assert exc.value.key == "workload.micro_batch"
    assert "a micro_batch of at most 5 fits" in exc.value.message


def test_model_states_of_an_interleaved_run_count_its_resident_subgroups(tmp_path):
    """`run` prints ZeRO's model states per rank; an interleaved run keeps its resident subgroups' state
    on the GPU, so it prints what the run without offload prints (plus nothing offloaded)."""
    import re

    from typer.testing import CliRunner

    from clustersim.cli import app

    path = tmp_path / "s.json"
    path.write_text(_thirteen_b(**{"workload.micro_batch": 1}).model_dump_json(exclude_none=True))

    def states(*extra):
        out = CliRunner().invoke(app, ["run", str(path), "--samples", "0", *extra])
        assert out.exit_code == 0, out.output
        return float(re.search(r"model states ([0-9.]+) GiB", out.output).group(1))

    plain = states("--set", "training.offload.mode=none")
    assert states() == pytest.approx(plain, abs=0.1)
    assert states("--set", "training.offload.mode=zero") < plain / 2  # the state is on the host
