"""Calibration for real: torch kernels on this CPU and gloo collectives under torchrun on 127.0.0.1."""

import json
import statistics
import sys

import pytest

torch = pytest.importorskip("torch")

from clustersim.calibration.fit import build_profile, predict  # noqa: E402
from clustersim.calibration.microbench import run_local  # noqa: E402
from clustersim.calibration.profile import load_profile, parse_profile  # noqa: E402
from clustersim.calibration.run import run_collective_sweep  # noqa: E402
from clustersim.cli import app  # noqa: E402
from clustersim.simulator.strategies.compressed_allreduce import FINISH_PASSES, SERVER_PASSES, WORKER_PASSES  # noqa: E402


def test_local_microbenchmarks_measure_every_modelled_kernel():
    raw = run_local(torch, "cpu", quick=True)
    assert {r["precision"] for r in raw["gemm"]} == {"fp32", "bf16"}
    names = {r["name"] for r in raw["kernels"]}
    assert {n for n, _, _ in WORKER_PASSES + SERVER_PASSES + FINISH_PASSES} <= names
    assert {"binsgdm_update", "binsgdm_quantize", "optimizer"} <= names
    assert all(r["median_s"] > 0 and r["p10_s"] <= r["median_s"] <= r["p90_s"] for r in raw["kernels"])
    assert raw["host_adam"][0]["params_per_s"] > 0
    built = build_profile(
        {
            "format": "clustersim-raw",
            "format_version": 1,
            "provenance": {"source": "test", "catalog_device": "cpu"},
            **raw,
        }
    )
    profile = parse_profile(built, "t")
    assert profile.memory_gbs > 0 and profile.matmul_tflops["fp32"] > 0
    # every kernel measured is priced, or named where the fit set it aside (a sweep that read as a stall
    # on a loaded host: calibration/screen.py), never silently missing
    said = " ".join(built["provenance"].get("dropped", []) + built["provenance"].get("defaults", []))
    assert set(profile.kernels_gbs) <= names
    assert all(n in profile.kernels_gbs or n in said for n in names), (names, said)


def test_every_size_of_a_kernel_sweep_times_its_own_tensors(monkeypatch):
    """The sweep builds every size before timing any (so a kernel's sizes are timed in turn): each
    size's kernel must work on that size's tensors, not on the last (largest) size's. Here each kernel
    runs once per size and its result's length is checked against the size it is recorded at."""
    from clustersim.calibration.microbench import Bench

    bench = Bench(torch, "cpu", quick=True)
    seen: dict[str, list[tuple[int, int]]] = {}

    def run_once(entries):
        for record, fn in entries:
            result = fn()
            result = result[0] if isinstance(result, tuple) else result
            if isinstance(result, torch.Tensor):
                seen.setdefault(record["name"], []).append((record["elements"], result.numel()))
        return [record for record, _ in entries]

    monkeypatch.setattr(bench, "time_sweep", run_once)
    bench.compression_kernels(p=4)
    sizes = bench.sizes["elements"]
    assert len(set(sizes)) > 1
    for name in ("onebit_error_compensate", "onebit_momentum", "binsgdm_apply", "binsgdm_update"):
        assert seen[name] == [(n, n) for n in sizes], name  # one result element per element
    assert seen["onebit_pack"] == [(n, n // 8) for n in sizes]  # 8 signs to a byte
    assert seen["binsgdm_vote"] == [(n, n // 4) for n in sizes]  # one count per element of a shard


@pytest.mark.parametrize("ranks", [2, 4])
def test_gloo_sweep_under_torchrun(ranks):
    raw = run_collective_sweep(ranks, "cpu", quick=True, ops="all_reduce,all_gather")
    assert raw["topology"]["ranks"] == ranks and raw["backend"] == "gloo"
    ops = {r["op"] for r in raw["collectives"]}
    assert ops == {"all_reduce", "all_gather"}
    assert all(r["ranks"] == ranks and r["median_s"] > 0 for r in raw["collectives"])
    assert raw["provenance"]["gloo"]


def test_torchrun_module_writes_a_profile(tmp_path):
    """The multi-node entry point: torchrun -m clustersim.calibration.collectives, rank 0 writes a profile."""
    import os
    import subprocess

    from clustersim.calibration.run import free_port

    out = tmp_path / "cluster.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "-m",
        "clustersim.calibration.collectives",
        "--out",
        str(out),
        "--quick",
        "--device",
        "cpu",
        "--ops",
        "all_reduce,broadcast",
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1")
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    profile = load_profile(str(out))
    assert {f.op for f in profile.collectives} == {"all_reduce", "broadcast"}
    assert all(f.gpus_per_node == 2 and f.quality is not None for f in profile.collectives)


def test_calibrate_cli_round_trip_and_simulated_collective(runner, tmp_path):
    out, raw = tmp_path / "cpu.json", tmp_path / "raw.json"
    r = runner.invoke(
        app, ["calibrate", "run", "--device", "cpu", "--quick", "--out", str(out), "--raw-out", str(raw)]
    )
    assert r.exit_code == 0, r.output
    profile = load_profile(str(out))
    assert profile.device == "cpu" and profile.collectives and profile.host.cpu_adam_params_per_s
    assert runner.invoke(app, ["calibrate", "show", str(out)]).exit_code == 0
    refit = tmp_path / "refit.json"
    assert runner.invoke(app, ["calibrate", "fit", str(raw), "--out", str(refit)]).exit_code == 0
    assert json.loads(refit.read_text())["collectives"] == json.loads(out.read_text())["collectives"]

    # The calibrated "cluster": one CPU host with 2 ranks. The simulator must use the measured fit (and a
    # CPU profile is only accepted for a CPU device: tests/test_uncertainty.py checks the refusal).
    scenario = tmp_path / "two_ranks.yaml"
    scenario.write_text(
        "cluster: {nodes: 1, gpus_per_node: 2, gpu: CPU-2vCPU, intra_node: {fabric: pcie}}\n"
        "workload: {model: BERT-Base, micro_batch: 1}\n"
    )
    measured = max(
        (m for m in json.loads(raw.read_text())["collectives"] if m["op"] == "all_reduce"),
        key=lambda m: m["bytes"],
    )
    r = runner.invoke(
        app,
        [
            "collective",
            str(scenario),
            "--op",
            "all_reduce",
            "--bytes",
            str(int(measured["bytes"])),
            "--profile",
            str(out),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    sim = json.loads(r.stdout)
    assert sim["algorithm"] == "measured"
    fit = next(f for f in profile.collectives if f.op == "all_reduce")
    assert sim["time_s"] == pytest.approx(predict(fit.segments, measured["bytes"]))
    # The fit against the measurements, over every size: the median |error| within 10%, or within 1.5x
    # the measurements' median p10-p90 spread where this host's loopback timings are noisier than that
    # (see docs/calibration.md: Calibration on a noisy host). Not one size alone: the fit is robust
    # (soft-L1) over all sizes, and on a loaded CI machine one disturbed size sat 0.64 spreads from it
    # (twice), and once, in a fresh-clone CI run, the largest size's median came out 10x the others' trend.
    # Loopback gloo on a shared 2-core host is occasionally disturbed for a whole sweep (a fresh-clone
    # run: 4 of 6 sizes 45-104% off a fit the other runs met within 10%): one more calibration then,
    # and the check holds on it; a fit that misses twice fails.
    for attempt in range(2):
        if attempt:
            again = ["calibrate", "run", "--device", "cpu", "--quick", "--out", str(out)]
            assert runner.invoke(app, [*again, "--raw-out", str(raw)]).exit_code == 0
            fit = next(f for f in load_profile(str(out)).collectives if f.op == "all_reduce")
        points = [m for m in json.loads(raw.read_text())["collectives"] if m["op"] == "all_reduce"]
        errors = [abs(predict(fit.segments, m["bytes"]) / m["median_s"] - 1) for m in points]
        spreads = [(m["p90_s"] - m["p10_s"]) / m["median_s"] for m in points]
        if statistics.median(errors) <= max(0.10, 1.5 * statistics.median(spreads)):
            break
    assert statistics.median(errors) <= max(0.10, 1.5 * statistics.median(spreads)), (errors, spreads)


def test_no_cuda_is_a_clear_error(runner, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "p.json"
    r = runner.invoke(app, ["calibrate", "run", "--device", "cuda", "--out", str(out)])
    assert r.exit_code == 2 and "no CUDA" in r.output and not out.exists()


def test_missing_torch_says_how_to_install(runner, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)
    r = runner.invoke(app, ["calibrate", "run", "--device", "cpu", "--out", str(tmp_path / "p.json")])
    assert r.exit_code == 2 and "pip install" in r.output and "torch" in r.output


def test_bad_files_leave_nothing_behind(runner, tmp_path):
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"hello": 1}))
    out = tmp_path / "out.json"
    r = runner.invoke(app, ["calibrate", "fit", str(foreign), "--out", str(out)])
    assert r.exit_code == 2 and "not a clustersim raw" in r.output and not out.exists()
    truncated = tmp_path / "all_reduce_perf.txt"
    truncated.write_text(
        "#       size         count      type   redop    root     time   algbw   busbw #wrong\n"
        "        1024           256     float     sum      -1     5.0    0.2    0.3      0\n"
    )
    r = runner.invoke(
        app, ["calibrate", "import-nccl-tests", str(truncated), "--ranks", "2", "--out", str(out)]
    )
    assert r.exit_code == 2 and "truncated" in r.output and not out.exists()
    assert not list(tmp_path.glob(".out.json.*"))  # no temporary left over
