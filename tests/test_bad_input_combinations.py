"""Options that would change nothing are refused by name, not ignored: compare's --steps for an optimizer
it does not compare and --warmup where no compared optimizer has a warmup stage; calibrate run's testbed
options without --testbed, and its device options with it."""

from __future__ import annotations

import pytest

from tests.inputs_support import SCENARIO, invoke, refused, write_yaml


@pytest.fixture
def scenario(tmp_path):
    return write_yaml(tmp_path / "s.yaml", SCENARIO)


def _compare(scenario, *extra):
    args = ["compare", scenario, "--samples", "0", "--gpus", "8", "--optimizers", "adam,binsgdm"]
    return invoke(*args, *extra)


def test_steps_for_an_optimizer_not_compared_is_refused(scenario):
    refused(_compare(scenario, "--steps", "100,onebit-adam=50"), "--steps", "onebit-adam", "not compared")


def test_warmup_without_an_optimizer_that_has_one_is_refused(scenario):
    refused(_compare(scenario, "--warmup", "0.2"), "--warmup", "no", "warmup stage")


def test_steps_and_warmup_for_compared_optimizers_are_taken(scenario):
    r = invoke(
        "compare", scenario, "--samples", "0", "--gpus", "8", "--optimizers", "adam,onebit-adam",
        "--steps", "adam=100,onebit-adam=90", "--warmup", "0.2",
    )  # fmt: skip
    assert r.exit_code == 0, r.output


def test_the_api_names_the_arguments(scenario):
    from clustersim import api
    from clustersim.errors import InputError

    with pytest.raises(InputError) as info:
        api.compare(scenario, ["adam", "binsgdm"], [8], samples=0, steps={"adam": 100, "onebit-adam": 50})
    assert info.value.key == "steps"
    with pytest.raises(InputError) as info:
        api.compare(scenario, ["adam", "binsgdm"], [8], samples=0, warmup=0.2)
    assert info.value.key == "warmup"


@pytest.mark.parametrize(
    "args, option",
    [
        (["--device", "cpu", "--rate", "1gbit"], "--rate"),
        (["--device", "cpu", "--ops", "all_reduce"], "--ops"),
        (["--device", "cpu", "--repeat", "3"], "--repeat"),
        (["--device", "cpu", "--min-bytes", "4KiB"], "--min-bytes"),
        (["--testbed", "2", "--quick"], "--quick"),
        (["--testbed", "2", "--ranks", "4"], "--ranks"),
        (["--testbed", "2", "--cluster", "preset:default"], "--cluster"),
        (["--testbed", "2", "--device", "cuda"], "--device"),  # its default, given: still refused
    ],
)
def test_calibrate_run_refuses_an_option_its_mode_ignores(tmp_path, monkeypatch, args, option):
    from clustersim.calibration import run
    from clustersim.testbed import calibrate, hosts

    monkeypatch.setattr(run, "calibrate", lambda *a, **k: pytest.fail("measured before refusing"))
    monkeypatch.setattr(calibrate, "calibrate_on_testbed", lambda *a, **k: pytest.fail("measured"))
    monkeypatch.setattr(hosts, "up", lambda *a, **k: pytest.fail("the testbed came up"))
    r = invoke("calibrate", "run", *args, "--out", tmp_path / "p.json")
    refused(r, option, "--testbed")
    assert not (tmp_path / "p.json").exists()


def test_plan_have_says_which_parts_of_candidates_it_reads(tmp_path, scenario):
    candidates = write_yaml(
        tmp_path / "c.yaml",
        {"name": "c", "base": SCENARIO, "steps": 100, "vary": {"gpus": [8, 16], "optimizer": ["adam"]}},
    )
    args = ["plan", "--model", "BERT-Large", "--deadline", "30d", "--samples", "0", "--have", scenario]
    r = invoke(*args, "--candidates", candidates)
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())
    assert "--candidates: with --have" in said and "gpus axes are not" in said
    r = invoke(*args, "--steps", "100")
    assert r.exit_code == 0 and "--candidates" not in r.output, r.output


@pytest.mark.parametrize(
    "extra, option",
    [
        (["--instance", "p4de.24xlarge"], "--instance"),
        (["--instances", "INSTANCES"], "--instances"),
    ],
)
def test_a_flat_price_with_an_instance_is_refused(extra, option):
    from importlib import resources

    shipped = str(resources.files("clustersim.catalogs").joinpath("instances.yaml"))
    extra = [shipped if e == "INSTANCES" else e for e in extra]
    args = ["plan", "--model", "BERT-Large", "--steps", "100", "--deadline", "3d", "--samples", "0"]
    refused(invoke(*args, "--price", "2", *extra), option, "--price", "flat rate")


@pytest.mark.parametrize(
    "extra, option",
    [
        (["--cost", "rent"], "--cost"),
        (["--cost", "rent", "--instance", "p4de.24xlarge"], "--cost"),
        (["--network-prices", "none"], "--network-prices"),
    ],
)
def test_compare_cost_options_without_steps_are_refused(scenario, extra, option):
    refused(_compare(scenario, *extra), option, "--steps")


def test_the_api_refuses_a_cost_without_steps(scenario):
    from clustersim import api
    from clustersim.errors import InputError

    with pytest.raises(InputError) as info:
        api.compare(scenario, ["adam"], [8], samples=0, cost="rent")
    assert info.value.key == "cost"


def test_cost_own_with_an_instance_catalog_is_refused(scenario):
    from importlib import resources

    shipped = str(resources.files("clustersim.catalogs").joinpath("instances.yaml"))
    r = _compare(scenario, "--steps", "100", "--cost", "own", "--instances", shipped)
    refused(r, "--instances", "--cost own")


@pytest.mark.parametrize(
    "key, value, why",
    [
        ("training.parallelism.sequence_parallel", True, "tensor-parallel group"),
        ("training.parallelism.schedule", "interleaved", "pipeline 1"),
        ("training.offload.placement", "cpu", "offload.mode is none"),
        ("training.sharding.prefetch_bucket_mb", 10, "stage 0"),
    ],
)
def test_a_training_setting_its_layout_never_reads_is_noted(key, value, why):
    from clustersim import api
    from tests.inputs_support import changed

    notes = api.simulate(changed(SCENARIO, key, value)).result.notes
    assert any(n.startswith(f"{key} is not used") and why in n for n in notes), notes
    assert not any("is not used" in n for n in api.simulate(SCENARIO).result.notes)


@pytest.mark.parametrize(
    "parallelism, names",
    [
        ({"recompute": "full"}, ["recompute = full", "training.parallelism.recompute to none"]),
        ({"sequence_parallel": True}, ["sequence parallel", "parallelism.sequence_parallel to false"]),
        ({"distributed_optimizer": True}, ["training.parallelism.distributed_optimizer to false"]),
        ({"tensor": 2, "recompute": "selective"}, ["tensor = 2 and recompute", "tensor to 1, training"]),
    ],
)
def test_a_compressed_optimizer_on_megatrons_program_names_what_runs_it(parallelism, names):
    """A layout that runs Megatron-LM's program without tensor or pipeline splits (its recomputation,
    sequence parallelism or distributed optimizer) named no key at all: 'this layout has : ...; set  to
    1'. Each setting is named with the value that undoes it."""
    from clustersim.errors import InputError
    from clustersim.scenario import load_scenario

    with pytest.raises(InputError) as err:
        load_scenario("preset:default").with_changes(
            **{"training.optimizer": "onebit-adam", "training.parallelism": parallelism}
        )
    assert err.value.key == "training.optimizer"
    assert "has :" not in err.value.message and "set  " not in err.value.message
    for name in names:
        assert name in err.value.message
