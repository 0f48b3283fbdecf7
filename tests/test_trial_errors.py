"""One-line errors a new user met that did not name what to fix: a sweep's missing base scenario, and a
collective's misspelled --op."""

from typer.testing import CliRunner

from clustersim.cli import app


def test_a_sweeps_missing_base_names_the_sweep_file_and_its_base_key(tmp_path):
    sweep = tmp_path / "se3.yaml"
    sweep.write_text("name: s\nbase: bertt.yaml\nvary:\n  gpus: [8]\n")
    out = CliRunner().invoke(app, ["sweep", str(sweep), "--out", str(tmp_path / "out")])
    assert out.exit_code == 2
    line = out.output.strip()
    assert "\n" not in line and "Traceback" not in line
    assert f"{sweep}: base: base scenario 'bertt.yaml' not found" in line
    assert not (tmp_path / "out").exists()


def test_a_misspelled_collective_names_the_option_and_the_near_name():
    out = CliRunner().invoke(app, ["collective", "preset:default", "--op", "allreduce", "--bytes", "1e6"])
    assert out.exit_code == 2
    assert "error: --op: unknown collective 'allreduce'; did you mean all_reduce?" in out.output


def test_calibrate_model_flags_a_fit_its_own_hold_out_or_its_slopes_do_not_trust():
    from types import SimpleNamespace as NS

    from clustersim.commands.calibrate import _fit_warnings

    def phase(per_sample):
        return NS(device_s=NS(per_sample_s=per_sample), host_s=NS(per_sample_s=0.0))

    good = NS(holdout=NS(rel_error=-0.004), forward=phase(0.026), backward=phase(0.039))
    assert _fit_warnings(good) == []
    # the trial's CPU run: backward measured 971 ms at micro-batch 1 and 546 ms at 4, held out +17.8%
    bad = NS(holdout=NS(rel_error=0.178), forward=phase(0.026), backward=phase(0.0))
    warnings = _fit_warnings(bad)
    assert len(warnings) == 2
    assert "+17.8% off (target within 10%)" in warnings[0]
    assert warnings[1].startswith("backward's time did not grow with the micro-batch")


def test_an_nvswitch_node_holds_no_more_gpus_than_the_largest_nvlink_domain_built_of_them():
    import pytest

    from clustersim.catalog import gpus
    from clustersim.errors import InputError
    from clustersim.scenario import load_scenario

    base = load_scenario("preset:default")
    nvswitch = {"cluster.gpu": "A100-80GB", "cluster.intra_node.fabric": "nvswitch"}
    assert base.with_changes(**nvswitch, **{"cluster.gpus_per_node": 16}).cluster.gpus_per_node == 16
    with pytest.raises(InputError) as exc:
        base.with_changes(**nvswitch, **{"cluster.gpus_per_node": 100})
    assert exc.value.key == "cluster.gpus_per_node" and "holds 16" in exc.value.message
    # every GPU that sits on NVLink or Infinity Fabric boards says how many one domain holds
    for name, spec in gpus().items():
        if spec.nvlink.links > 0 and spec.chip not in ("cpu",) and "PCIe" not in spec.description:
            assert spec.nvlink_domain_gpus, name


def test_a_sweep_whose_rows_all_fail_is_not_a_success_and_report_names_the_folder(tmp_path):
    sweep = tmp_path / "oom.yaml"
    sweep.write_text("name: oom\nbase: preset:default\nvary:\n  model: [GPT-3-175B]\n  gpus: [8, 16]\n")
    out = tmp_path / "out"
    ran = CliRunner().invoke(app, ["sweep", str(sweep), "--out", str(out), "--samples", "0"])
    assert ran.exit_code == 1, ran.output
    assert "2 rows run (0 simulated)" in ran.output
    assert "error: none of the 2 rows could be simulated" in ran.output
    report = CliRunner().invoke(app, ["report", str(out), "--out", str(tmp_path / "r.html")])
    assert report.exit_code == 2
    assert f"error: {out}: no successfully simulated rows to report on" in report.output


def test_validate_says_how_many_draws_its_bands_took():
    out = CliRunner().invoke(app, ["validate", "--dataset", "binsgdm_speedups", "--samples", "8"])
    assert out.exit_code == 0, out.output
    assert "inside the P10–P90 band (8 draws) in" in out.output


def test_plan_names_the_candidates_file_none_of_whose_rows_can_run(tmp_path):
    cand = tmp_path / "cand.yaml"
    cand.write_text("name: c\nbase: preset:default\nvary:\n  gpu: [V100-PCIe]\n  gpus: [8]\n")
    args = [
        "plan",
        "--model",
        "GPT-3-175B",
        "--steps",
        "1000",
        "--deadline",
        "60d",
        "--candidates",
        str(cand),
    ]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 2
    assert f"error: {cand}: none of the 1 candidates can train GPT-3-175B" in out.output


def test_steps_given_twice_for_one_optimizer_are_refused():
    out = CliRunner().invoke(
        app, ["plan", "--model", "GPT-3-1.3B", "--steps", "adam=100,adam=200", "--deadline", "60d"]
    )
    assert out.exit_code == 2
    assert "error: --steps: adam is given steps twice ('adam=200')" in out.output
