"""`calibrate run` on a GPU, checked without one: every tensor a collective sees is on the sweep's
device (a torch.distributed stand-in refuses others, as NCCL does), one GPU records launch latency
only, the worker's own error reaches the message, and local measurements survive a failed sweep."""

import copy
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from clustersim.calibration import collectives, run  # noqa: E402
from clustersim.calibration.fit import build_profile  # noqa: E402
from clustersim.calibration.profile import parse_profile  # noqa: E402
from clustersim.errors import InputError  # noqa: E402

RAW_H200 = Path(__file__).resolve().parents[1] / ".." / "shared" / "gpu" / "h200-calibrate-raw.json"


class _Torch:
    """torch, except that tensors made for device "cuda" are CPU tensors labelled "cuda" (this
    machine has no GPU); tensors made without a device are labelled "cpu"."""

    float64 = torch.float64

    class cuda:  # noqa: N801 - mirrors torch.cuda
        @staticmethod
        def synchronize():
            return None

    @staticmethod
    def _make(factory, *args, device=None, **kwargs):
        t = factory(*args, **kwargs)
        t.claimed_device = torch.device(device or "cpu").type
        return t

    def ones(self, *a, device=None, **k):
        return self._make(torch.ones, *a, device=device, **k)

    def empty(self, *a, device=None, **k):
        return self._make(torch.zeros, *a, device=device, **k)

    def zeros(self, *a, device=None, **k):
        return self._make(torch.zeros, *a, device=device, **k)

    def tensor(self, *a, device=None, **k):
        return self._make(torch.tensor, *a, device=device, **k)


class _Dist:
    """A one-process torch.distributed for a group of ``world`` ranks that refuses, like NCCL, any
    tensor that is not on ``device``."""

    class ReduceOp:
        MAX = "max"

    def __init__(self, device: str, world: int):
        self.device, self.world, self.calls = device, world, 0

    def _check(self, *tensors):
        for t in tensors:
            where = getattr(t, "claimed_device", "cpu")
            if where != self.device:
                raise RuntimeError(f"No backend type associated with device type {where}")
        self.calls += 1

    def get_rank(self):
        return 0

    def get_world_size(self):
        return self.world

    def get_global_rank(self, group, r):
        return r

    def all_gather_object(self, out, obj):
        out[:] = [copy.deepcopy(obj) for _ in out]

    def new_group(self, ranks):
        return object()

    def barrier(self, group=None):
        return None

    def all_reduce(self, x, op=None, group=None):
        self._check(x)

    def broadcast(self, x, src=0, group=None):
        self._check(x)

    def all_gather(self, out, x, group=None):
        self._check(x, *out)
        for o in out:
            o.copy_(x)

    def reduce_scatter_tensor(self, out, x, group=None):
        self._check(out, x)

    def all_to_all_single(self, out, x, group=None):
        self._check(out, x)


def test_the_stand_in_refuses_a_cpu_tensor_on_a_gpu_group():
    with pytest.raises(RuntimeError, match="device type cpu"):
        _Dist("cuda", 2).all_reduce(torch.ones(1))


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_every_collective_tensor_is_on_the_sweep_device(device):
    dist = _Dist(device, 2)
    result = collectives.sweep(
        dist, _Torch(), device, quick=True, min_bytes=4096, max_bytes=8192, repeat=2, warmup=1
    )
    assert result["collectives_skipped"] == {}
    assert {r["op"] for r in result["collectives"]} == set(collectives.OPS)
    assert all(r["ranks"] == 2 and r["median_s"] > 0 for r in result["collectives"])
    assert dist.calls > 0


def test_one_gpu_measures_launch_latency_only():
    dist = _Dist("cuda", 1)
    result = collectives.sweep(dist, _Torch(), "cuda", quick=True, min_bytes=4096, max_bytes=4096)
    assert result["collectives"] == []  # no 1x1 "bus bandwidth"
    assert collectives.launch_latency(_Torch(), dist) > 0


def test_one_rank_records_are_never_fitted_as_bandwidth():
    """A raw file from one GPU that holds 1x1 all-reduce timings (as the H200 one does) keeps its
    launch latency and fits no collective."""
    if not RAW_H200.exists():
        pytest.skip(f"the H200 measurements are not here ({RAW_H200})")
    raw = json.loads(RAW_H200.read_text())
    assert any(r["nodes"] * r["gpus_per_node"] == 1 for r in raw["collectives"])
    profile = parse_profile(build_profile(raw), "h200")
    assert profile.collectives == [] and profile.network is None
    assert profile.launch_latency_s == pytest.approx(raw["launch_latency_s"])
    assert profile.device == "H200" and profile.matmul_tflops["bf16"] > 100


TORCHRUN_FAILURE = """\
gemm bf16 4096: 812.3 TFLOP/s
[rank0]: Traceback (most recent call last):
[rank0]:   File "/x/clustersim/calibration/collectives.py", line 164, in _sweep_group
[rank0]:     dist.all_reduce(probe, op=dist.ReduceOp.MAX, group=group)
[rank0]: RuntimeError: No backend type associated with device type cpu
E1126 00:21:07.123000 1 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1)
Traceback (most recent call last):
  File "/usr/bin/torchrun", line 8, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
clustersim.calibration.collectives FAILED
"""


def test_the_worker_error_is_in_the_message():
    assert run.worker_error(TORCHRUN_FAILURE.splitlines()) == (
        "RuntimeError: No backend type associated with device type cpu"
    )
    assert run.worker_error(["Aborted (core dumped)", ""]) == "Aborted (core dumped)"


def test_a_failed_sweep_keeps_the_local_measurements(tmp_path, monkeypatch):
    local = {
        "gemm": [
            {
                "precision": "fp32",
                "m": 256,
                "n": 256,
                "k": 256,
                "flops": 2 * 256**3,
                "bytes": 3 * 4 * 256**2,
                "median_s": 1e-3,
                "p10_s": 1e-3,
                "p90_s": 1e-3,
                "repeats": 3,
            }
        ]
    }
    monkeypatch.setattr(run, "run_local", lambda *a, **k: dict(local))

    def fail(*a, **k):
        raise InputError(
            "the collective sweep failed (torchrun exit 1): RuntimeError: boom", key="collectives"
        )

    monkeypatch.setattr(run, "run_collective_sweep", fail)
    out, raw_out = tmp_path / "p.json", tmp_path / "raw.json"
    with pytest.raises(InputError) as err:
        run.calibrate("cpu", out, True, 2, raw_out)
    assert "RuntimeError: boom" in str(err.value) and str(raw_out) in str(err.value)
    # no profile without its collectives (it would be priced as whole); the raw file keeps the rest,
    # and `calibrate fit` on it gives the local-only profile
    assert not out.exists()
    assert json.loads(raw_out.read_text())["gemm"] == local["gemm"]
    assert run.fit_file(raw_out, out).matmul_tflops["fp32"] == pytest.approx(2 * 256**3 / 1e-3 / 1e12)
    # without --raw-out the measurements go beside the profile, named after it
    with pytest.raises(InputError) as err:
        run.calibrate("cpu", out, True, 2, None)
    kept = tmp_path / "p.raw.json"
    assert str(kept) in str(err.value) and json.loads(kept.read_text())["gemm"] == local["gemm"]
