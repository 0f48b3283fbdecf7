"""Calibration on a noisy host: stalled measurements are found by the physics of a size sweep and not
fitted, a block no fit explains is left at the simulator's defaults (with a warning, exit 0), a rate
no such device runs at is refused, and an interrupted run writes nothing. Synthetic measurements
only: nothing here depends on how fast this machine is."""

import copy
import json
import math

import numpy as np
import pytest

from clustersim.calibration import microbench, run
from clustersim.calibration.compute_fit import fit_gemm_model, gemm_time
from clustersim.calibration.fit import build_profile
from clustersim.calibration.microbench import Bench, gemm_shapes
from clustersim.calibration.profile import load_profile, parse_profile
from clustersim.calibration.screen import screen, stall_suspects
from clustersim.calibration.timing import Timing, measure_interleaved, summarize
from clustersim.cli import app

# a CPU-like device: 0.5 TFLOP/s fp32, 60 GB/s, 20 us per call
CPU = {"r_max": 0.5e12, "launch": 20e-6, "mem": 60e9}
COPY_GBS = 60.0
ADAM_GBS = 25.0
STALL_S = 16e-3  # a scheduler slice: every stalled call waits out one


def _gemm(rng, precision="fp32", noise=0.03, sizes=(128, 256, 512), r_max=CPU["r_max"]):
    out = []
    elt = 4 if precision == "fp32" else 2
    for m, n, k in gemm_shapes(list(sizes)):
        w, b = 2.0 * m * n * k, float(elt * (m * k + k * n + m * n))
        t = float(gemm_time(w, b, r_max, CPU["launch"], CPU["mem"])) * math.exp(rng.normal(0, noise))
        out.append({"precision": precision, "m": m, "n": n, "k": k, "flops": w, "bytes": b, "median_s": t})
    return out


def _raw(rng, **parts) -> dict:
    elements = [1 << 16, 1 << 18, 1 << 20]
    raw = {
        "format": run.RAW_FORMAT,
        "format_version": 1,
        "device": "cpu",
        "provenance": {"source": "synthetic"},
        "gemm": _gemm(rng),
        "memory": [
            {"bytes": 4.0 * n, "traffic_bytes": 8.0 * n, "median_s": 8.0 * n / (COPY_GBS * 1e9)}
            for n in elements
        ],
        "kernels": [
            {"name": "optimizer", "elements": n, "bytes": 16.0 * n, "median_s": 16.0 * n / (ADAM_GBS * 1e9)}
            for n in elements
        ],
    }
    raw.update(parts)
    return raw


def test_a_stall_is_a_sample_far_above_its_fastest_repeat():
    t = summarize([1e-4] * 8 + [STALL_S, 2 * STALL_S])
    assert t.median_s == pytest.approx(1e-4) and t.stalled == 2 and t.repeats == 10
    # every sample slow alike: no sample says the op is faster, nothing is left out
    assert summarize([STALL_S] * 5).stalled == 0
    # a microsecond op that varies 10x is noise, not a stall (no scheduler slice is that short)
    assert summarize([1e-6] * 5 + [2e-5]).stalled == 0


def test_sweeps_are_timed_in_turn():
    calls = []
    fns = [lambda i=i: calls.append(i) for i in range(3)]
    timings = measure_interleaved(fns, lambda: None, warmup=0, repeat=2)
    assert calls == [0, 1, 2, 0, 1, 2] and all(t.repeats == 2 for t in timings)


def test_stall_rules_follow_the_physics_of_a_sweep():
    # (work, bytes, seconds)
    assert stall_suspects([(1e6, 1e4, 1e-4), (8e6, 4e4, 5e-4), (64e6, 16e4, 3e-3)]) == {}
    # every size at one quantum: time that does not grow with work (all three suspect)
    assert set(stall_suspects([(1e6, 1e4, STALL_S), (8e6, 4e4, STALL_S), (64e6, 16e4, STALL_S)])) == {0, 1, 2}
    # small sizes stalled to about the time the biggest genuinely takes: the biggest is kept
    assert set(stall_suspects([(1e6, 1e6, 2.0e-3), (4e6, 4e6, 1.8e-3), (16e6, 16e6, 2.3e-3)])) == {0, 1}
    # a smaller size slower than a bigger one
    assert set(stall_suspects([(1e6, 1e4, 4e-3), (8e6, 4e4, 2e-3), (64e6, 16e4, 9e-3)])) == {0}
    # far more time than the work grew by
    assert set(stall_suspects([(1e6, 1e4, 1e-4), (4e6, 4e4, 4e-4), (16e6, 16e4, 80e-3)])) == {2}
    # microseconds are never suspect (a GPU's launch-bound small sizes are flat)
    assert stall_suspects([(1e6, 1e4, 8e-6), (8e6, 4e4, 8e-6), (64e6, 16e4, 9e-6)]) == {}


def test_stalled_gemms_are_dropped_and_the_fit_prices_like_the_clean_one():
    rng = np.random.default_rng(0)
    clean = _raw(rng)
    noisy = copy.deepcopy(clean)
    gemm = noisy["gemm"]
    # quantised: the 128 shapes all at one 16 ms slice; non-monotone: 256^3 slower than 512^3
    for r in gemm:
        if r["m"] == 128 and r["n"] in (128, 32) or (r["m"], r["n"]) == (32, 128):
            r["median_s"] = STALL_S
    big = next(r for r in gemm if r["m"] == r["n"] == r["k"] == 512)
    next(r for r in gemm if r["m"] == r["n"] == r["k"] == 256)["median_s"] = 3 * big["median_s"]
    kept, notes = screen(noisy)
    assert len(kept["gemm"]) == len(gemm) - 5 and len(notes.dropped) == 5
    assert all(r["median_s"] < STALL_S for r in kept["gemm"])

    a, b = build_profile(clean)["compute_model"]["fp32"], build_profile(noisy)["compute_model"]["fp32"]
    assert b["r_max_tflops"] == pytest.approx(a["r_max_tflops"], rel=0.05)
    for m, n, k in [(384, 384, 384), (512, 1024, 128)]:  # shapes neither fit saw
        w, nbytes = 2.0 * m * n * k, 4.0 * (m * k + k * n + m * n)
        ta = gemm_time(w, nbytes, a["r_max_tflops"] * 1e12, a["launch_s"], a["memory_gbs"] * 1e9)
        tb = gemm_time(w, nbytes, b["r_max_tflops"] * 1e12, b["launch_s"], b["memory_gbs"] * 1e9)
        assert tb == pytest.approx(ta, rel=0.05)
    # unscreened, the stalls are no GEMM model at all: refused, never fitted into a wrong one
    assert "fp32" not in fit_gemm_model(gemm, COPY_GBS)


def test_a_stalled_kernel_size_is_dropped_and_the_rate_comes_from_the_others():
    rng = np.random.default_rng(1)
    raw = _raw(rng)
    raw["kernels"][-1]["median_s"] = 0.1  # Adam over 1M parameters: 100 ms, 0.17 GB/s
    profile = build_profile(raw)
    assert profile["kernels_gbs"]["optimizer"] == pytest.approx(ADAM_GBS)
    assert profile["provenance"]["dropped"] == [
        next(d for d in profile["provenance"]["dropped"] if d.startswith("optimizer n=1,048,576"))
    ]
    assert "defaults" not in profile["provenance"]
    assert profile["raw"]["kernels"][-1]["median_s"] == 0.1  # the profile's raw keeps what was measured


def test_hopeless_scatter_leaves_the_block_at_defaults_with_a_warning(runner, tmp_path):
    rng = np.random.default_rng(0)
    # a scatter of a factor e^2 per sigma, every time under a millisecond: no stall rule applies
    bf16 = _gemm(rng, "bf16", noise=2.0, sizes=(32, 64, 128))
    assert max(r["median_s"] for r in bf16) < 1e-3
    raw = _raw(rng, gemm=_gemm(rng) + bf16)
    profile = parse_profile(build_profile(raw), "p.json")
    assert "bf16" not in profile.compute_model and "bf16" not in profile.matmul_tflops
    assert "fp32" in profile.compute_model
    assert [line.split(":")[0] for line in profile.provenance.defaults] == ["GEMM bf16"]
    assert "scatter of 478% about the fit" in profile.provenance.defaults[0]

    raw_path, out = tmp_path / "raw.json", tmp_path / "p.json"
    raw_path.write_text(json.dumps(raw))
    result = runner.invoke(app, ["calibrate", "fit", str(raw_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "warning: left at the simulator's defaults: GEMM bf16" in result.stderr
    assert load_profile(str(out)).provenance.defaults == profile.provenance.defaults


def test_a_rate_no_such_device_runs_at_is_refused():
    rng = np.random.default_rng(3)
    # Adam measured at one size only (no sweep to check), 0.07 GB/s against copies at 60 GB/s
    raw = _raw(
        rng, kernels=[{"name": "optimizer", "elements": 1 << 18, "bytes": 16.0 * (1 << 18), "median_s": 0.06}]
    )
    profile = build_profile(raw)
    assert "optimizer" not in profile["kernels_gbs"]
    assert profile["provenance"]["defaults"][0].startswith("kernel optimizer: 0.0699 GB/s, under 1/30")
    # a GEMM rate 100x under the catalog CPU's (0.32 TFLOP/s)
    slow = _raw(rng, gemm=_gemm(rng, r_max=3.2e9))
    profile = build_profile(slow)
    assert "fp32" not in profile.get("matmul_tflops", {}) and "fp32" not in profile["compute_model"]
    assert any(
        line.startswith("GEMM fp32:") and "CPU-2vCPU" in line for line in profile["provenance"]["defaults"]
    )


@pytest.mark.parametrize("name", ["cpu-2core-gloo", "h200-pytorch-2.11", "h100-pytorch-2.11"])
def test_clean_measurements_lose_nothing(name):
    """The shipped profiles' own measurements (a quiet CPU, two GPUs) pass every check untouched."""
    from importlib import resources

    shipped = json.loads(
        (resources.files("clustersim.calibration") / "profiles" / f"{name}.json").read_text()
    )
    raw = {**shipped["raw"], "provenance": {"source": name, "catalog_device": shipped["device"]}}
    profile = build_profile(raw)
    assert "dropped" not in profile["provenance"] and "defaults" not in profile["provenance"]
    assert set(profile["compute_model"]) == {r["precision"] for r in raw["gemm"]}
    assert set(profile["kernels_gbs"]) == set(shipped["kernels_gbs"])


def test_stalled_measurements_are_measured_again_and_the_lower_median_kept(monkeypatch):
    bench = Bench(None, "cpu", quick=True)
    sweep = [
        ({"name": "k", "elements": n, "bytes": 4.0 * n}, lambda: None) for n in (1 << 16, 1 << 18, 1 << 20)
    ]
    times = iter(
        [
            [
                Timing(1e-5, 1e-5, 1e-5, 5),
                Timing(4e-5, 4e-5, 4e-5, 5),
                Timing(STALL_S * 10, STALL_S, STALL_S, 5),
            ]
        ]
    )
    monkeypatch.setattr(microbench, "measure_interleaved", lambda fns, *a, **k: next(times))
    records = bench.time_sweep(sweep)
    raw = {"kernels": records}
    asked = []

    def again(fns, *a, **k):
        asked.append(len(fns))
        return [Timing(2e-5, 2e-5, 2e-5, 5), Timing(3e-5, 3e-5, 3e-5, 5), Timing(1.6e-4, 1.5e-4, 1.7e-4, 5)]

    monkeypatch.setattr(microbench, "measure_interleaved", again)
    monkeypatch.setattr(microbench, "REMEASURE_PAUSE_S", 0.0)
    bench.remeasure_stalls(raw)
    assert asked == [3]  # the stalled size's whole sweep, once: then nothing is suspect
    assert records[2]["median_s"] == 1.6e-4 and records[2]["remeasured"] == 1
    # each keeps the lower of its two medians: a stall only adds time
    assert [r["median_s"] for r in records[:2]] == [1e-5, 3e-5]


def _local(rng):
    raw = _raw(rng)
    return {k: raw[k] for k in ("gemm", "memory", "kernels")}


def test_an_interrupted_run_leaves_no_profile(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    monkeypatch.setattr(run, "run_local", lambda *a, **k: _local(rng))

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "run_collective_sweep", interrupted)
    out, raw_out = tmp_path / "p.json", tmp_path / "raw.json"
    with pytest.raises(KeyboardInterrupt):
        run.calibrate("cpu", out, True, 2, raw_out)
    assert not out.exists() and not raw_out.exists()
    # a previous profile is left as it was
    out.write_text("previous")
    with pytest.raises(KeyboardInterrupt):
        run.calibrate("cpu", out, True, 2, raw_out)
    assert out.read_text() == "previous"


def test_an_interrupted_command_does_not_say_done(runner, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    rng = np.random.default_rng(5)

    def local(torch, device, quick, progress=None):
        progress("GEMM fp32 128x128x128")
        return _local(rng)

    def interrupted(*a, progress=None, **k):
        progress("collectives: all_reduce 1 MiB")
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "run_local", local)
    monkeypatch.setattr(run, "run_collective_sweep", interrupted)
    out = tmp_path / "p.json"
    result = runner.invoke(app, ["calibrate", "run", "--device", "cpu", "--quick", "--out", str(out)])
    assert result.exit_code != 0 and not out.exists()
    assert "calibrate: GEMM fp32" in result.stderr and "done" not in result.stderr


def test_a_whole_run_writes_the_profile_once(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    monkeypatch.setattr(run, "run_local", lambda *a, **k: _local(rng))
    monkeypatch.setattr(run, "run_collective_sweep", lambda *a, **k: {"backend": "gloo"})
    writes = []
    real = run.write_json_atomically
    monkeypatch.setattr(
        run, "write_json_atomically", lambda path, data: (writes.append(path), real(path, data))
    )
    out, raw_out = tmp_path / "p.json", tmp_path / "raw.json"
    run.calibrate("cpu", out, True, 2, raw_out)
    assert sorted(writes) == sorted([raw_out, out])
