"""How far the compressed optimizers' speedups are checked against published ones, and what compare
says of a comparison outside that (validation/speedup_checks.py)."""

import json

from clustersim.cli import app
from clustersim.scenario import load_scenario
from clustersim.validation.published import validate
from clustersim.validation.speedup_checks import checked_ranges, compute, notes


def test_every_published_speedup_of_a_compressed_optimizer_is_a_check():
    """The 1-bit Adam table's speedups across nodes (8-32 GPUs; inside one node the network is not what
    sets them), its end-to-end speedups, and BinSGDM's two 64-GPU ones, each once (the seeds repeat
    BinSGDM's), each equal to what validate predicts."""
    checks = compute()
    by = {(c.optimizer, c.gpus, c.published) for c in checks}
    assert len(by) == len(checks)
    onebit = [c for c in checks if c.optimizer == "onebit-adam"]
    assert sorted({c.gpus for c in onebit}) == [8, 16, 32]
    assert {round(c.published, 2) for c in onebit if c.dataset == "seeds"} == {3.3, 2.9}
    assert all(c.nic_kind == "ethernet_tcp" and "4.1 Gb/s effective" in c.network for c in onebit)
    binsgdm = [c for c in checks if c.optimizer == "binsgdm"]
    assert sorted(c.published for c in binsgdm) == [2.47, 6.26] and {c.baseline for c in binsgdm} == {
        "sgdm",
        "adam",
    }
    rows = {(r.optimizer, r.published): r.predicted for r in validate("binsgdm_speedups", None, 0).rows}
    assert all(c.predicted == rows["binsgdm", c.published] for c in binsgdm)
    # the error's sign: the model's 32-GPU 1-bit Adam speedup is below the chart's
    table = {c.gpus: c for c in onebit if c.dataset == "onebit_adam_ethernet"}
    assert table[32].error < 0 and abs(table[32].error) == max(abs(c.error) for c in onebit)


def test_a_comparison_outside_the_checked_range_says_so():
    ranges = checked_ranges()
    onebit = ranges["onebit-adam"]
    assert onebit.gpus == (8, 32) and onebit.covers(32, "ethernet_tcp")
    assert onebit.covers(64, "ethernet_tcp") and not onebit.covers(128, "ethernet_tcp")  # one doubling
    assert not onebit.covers(16, "infiniband")  # no InfiniBand speedup checks it
    s = load_scenario("preset:onebit-adam-infiniband")
    said = {n["optimizer"]: n for n in notes(s, ["adam", "onebit-adam", "zero-one-adam"], [32, 256])}
    assert set(said) == {"onebit-adam", "zero-one-adam"}  # the baseline needs no check
    assert (
        said["onebit-adam"]["outside"] == [32, 256]
        and "lie outside what was checked" in said["onebit-adam"]["text"]
    )
    assert said["zero-one-adam"]["checked"] is None and "model's alone" in said["zero-one-adam"]["text"]
    inside = notes(load_scenario("preset:onebit-adam-ethernet"), ["onebit-adam"], [16, 32])[0]
    assert inside["outside"] == [] and "outside" not in inside["text"]
    assert "median error" in inside["text"] and "worst" in inside["text"]


def test_compare_prints_and_returns_how_far_its_speedups_are_checked(runner):
    args = ["compare", "preset:onebit-adam-ethernet", "--gpus", "16,64", "--optimizers", "adam,onebit-adam"]
    res = runner.invoke(app, [*args, "--samples", "4", "--break-even-at", "0"])
    assert res.exit_code == 0, res.output
    assert "not the model's error on a speedup" in res.output
    assert "onebit-adam: checked against 5 published speedups at 8–32 GPUs" in res.output
    assert "lie outside" not in res.output  # 64 GPUs on the checked network: one doubling past 32
    res = runner.invoke(app, [*args, "--samples", "0", "--break-even-at", "0", "--json"])
    data = json.loads(res.stdout)
    (said,) = data["speedups_checked"]
    assert said["optimizer"] == "onebit-adam" and said["outside"] == []
    assert said["checked"]["gpus"] == [8, 32] and len(said["checked"]["checks"]) == 5


def test_the_checks_are_what_validate_predicts_for_their_rows():
    """compute reads each dataset once and leaves out the predictions across the rows' undisclosed
    settings: each check's prediction is still, exactly, the one `validate` (every prediction) gives its
    row or its trend point across nodes, and the checks are the same seven."""
    from clustersim.validation.published import datasets
    from clustersim.validation.speedups import speedups_by_scale

    reference = {}
    for name in datasets():
        report = validate(name, None, samples=0)
        for r in report.rows:
            if (r.metric or report.dataset.metric) == "speedup" and r.baseline:
                reference[name, r.optimizer, r.baseline, r.gpus, r.published] = r.predicted
        for trend in speedups_by_scale(report).trends:
            for p in trend.trend_points:
                reference[name, trend.optimizer, trend.baseline, p.gpus, p.published] = p.predicted
    checks = compute()
    assert {(c.dataset, c.optimizer, c.baseline, c.gpus, round(c.published, 3)) for c in checks} == {
        ("binsgdm_speedups", "binsgdm", "sgdm", 64, 2.47),
        ("binsgdm_speedups", "binsgdm", "adam", 64, 6.26),
        ("onebit_adam_ethernet", "onebit-adam", "adam", 8, 5.444),
        ("onebit_adam_ethernet", "onebit-adam", "adam", 16, 5.114),
        ("onebit_adam_ethernet", "onebit-adam", "adam", 32, 6.692),
        ("seeds", "onebit-adam", "adam", 32, 3.3),
        ("seeds", "onebit-adam", "adam", 32, 2.9),
    }
    for c in checks:
        assert c.predicted == reference[c.dataset, c.optimizer, c.baseline, c.gpus, c.published], c


def test_predict_rows_without_the_undisclosed_range_changes_no_row_else():
    """The seeds' rows with an undisclosed setting (hugepages, micro-batch, the GPU count of 'up to'):
    predict_rows(over_undisclosed=False) gives each row what validate does, less the range."""
    from dataclasses import replace

    from clustersim.validation.published import load_dataset, predict_rows

    full = validate("seeds", None, samples=0).rows
    lean = predict_rows(load_dataset("seeds"), None, samples=0, over_undisclosed=False).rows
    assert sum(r.undisclosed_range is not None for r in full) == 5
    assert all(r.undisclosed_range is None for r in lean)
    assert lean == [replace(r, undisclosed_range=None) for r in full]


def test_a_range_says_where_its_predicted_trend_with_scale_has_the_wrong_sign():
    """1-bit Adam's published speedups rise from 16 to 32 GPUs while the predicted ones fall (the
    Ethernet figure): compare and report say so beside the median and worst error, since a speedup at
    more GPUs than were checked leans on that trend. A series whose two ends move together is not
    flagged."""
    from clustersim.validation.speedup_checks import CheckedRange, SpeedupCheck, checked_ranges

    onebit = checked_ranges()["onebit-adam"]
    assert (8, 32) in onebit.wrong_trends()
    assert "move opposite ways" in onebit.describe()

    def check(gpus, published, predicted):
        return SpeedupCheck("x", "adam", "d", "s", gpus, "V100", "ethernet_tcp", "n", published, predicted)

    same_way = CheckedRange("x", [check(8, 2.0, 1.8), check(32, 3.0, 2.5)])
    assert same_way.wrong_trends() == [] and "opposite" not in same_way.describe()
    opposite = CheckedRange("x", [check(8, 2.0, 1.8), check(32, 3.0, 1.7)])
    assert opposite.wrong_trends() == [(8, 32)]
