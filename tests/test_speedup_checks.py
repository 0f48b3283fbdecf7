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
