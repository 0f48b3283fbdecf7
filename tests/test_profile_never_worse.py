"""Calibration makes predictions better, never worse: on every shipped dataset, adding the shipped
profile of the dataset's GPU does not raise the median error over that GPU's rows, and its P10-P90
holds at least 80% of them (16 draws, as `clustersim validate` takes by default)."""

from __future__ import annotations

import statistics

import pytest

from clustersim.calibration.profile import builtin_profiles
from clustersim.errors import InputError
from clustersim.validation import published
from clustersim.validation.gpu_throughput import validate_throughput

GPU_DATASETS = ("gpu_throughput", "gpu_steps")
DATASETS = sorted(published.datasets()) + list(GPU_DATASETS)

# Pairs where the invariant does not hold today, each with what was measured and why; strict, so that
# the test says so when they start to hold.
# Errors quoted here are raw, (predicted - published) / published of the row's metric, as --json gives
# them (validate's tables sign rates the other way: + predicted too slow).
KNOWN = {
    ("gpu_steps", "h100-pytorch-2.11"): "median 4.15% without the profile, 4.35% with it over the 10 H100 "
    "rows (the 5th and 6th: ResNet-50 at 32, +2.3% either way, and BERT-Large at 64, -6.4% against "
    "-8.1%); the profile is closer on 6 rows and its mean error is lower (5.0% against 6.3%). GPT-2 XL "
    "is priced by its own measurement: its device-bound steps within 1.4% (-1.4%, -1.1% against the "
    "defaults' +3.0%, +3.7%), its host-bound micro-batch-1 step 8% slow (+8.2% against -0.7%), measured "
    "in another session of that VM whose host ran it slower (the dataset's own runs of that step took "
    "115.6-133.2 ms, the profile's 126.6 ms: a session's spread, which the band holds). GPT-3 XL, "
    "carried at the profile's GEMM model, within 1.6% (+0.1%, +1.6% against +2.6%, +4.6%); the H100's "
    "measured streaming rate prices ResNet-50 at 128 and 256 1% faster (-8.7%, -7.8% against -8.0%, "
    "-7.1%). The band holds all ten",
    ("onebit_adam_ethernet", "v100-bert-large-published"): "the band holds 9 of 12 rows at 16 draws with "
    "or without the profile (the preset uses it; the same median, 10.0%). Outside: 1-bit Adam on 1 GPU "
    "(published 97 samples/s, predicted 84.2, band 75.1-94.3: the paper's figure has it 8% faster than "
    "its Adam at 90, where at one rank DeepSpeed's 1-bit Adam runs its update as unfused torch "
    "expressions, 88 bytes per parameter against fused Adam's 28, 28 ms more); Adam on 4 GPUs (140 "
    "against 143.1-174.7, a step 60% its measured 240 ms all-reduce, whose band is the collective "
    "model's); Adam on 32 GPUs (130 against 177.3: the figure's Adam rows at 8-32 GPUs are 26-68% "
    "slower than the same paper's Table 1 steps)",
}


def _rows(dataset: str, profile: str | None, samples: int) -> list[tuple[str | None, float, bool | None]]:
    """(GPU, |error|, inside the band) per scored row."""
    if dataset in GPU_DATASETS:
        report = validate_throughput(profile, samples=samples, dataset=dataset)
        return [(r.gpu, abs(r.error), r.inside) for r in report.scored]
    report = published.validate(dataset, profile, samples)
    return [(None, abs(r.error), r.inside) for r in report.rows]


@pytest.mark.parametrize("profile", builtin_profiles())
@pytest.mark.parametrize("dataset", DATASETS)
def test_a_profile_of_the_datasets_gpu_never_makes_it_worse(dataset, profile, request):
    try:
        calibrated = _rows(dataset, f"builtin:{profile}", samples=16)
    except InputError as exc:
        if "does not apply" in exc.message or "matches no row" in exc.message:
            pytest.skip(f"{profile} was measured on none of {dataset}'s GPUs")
        raise
    if (dataset, profile) in KNOWN:
        request.applymarker(pytest.mark.xfail(reason=KNOWN[dataset, profile], strict=True))
    gpus = {gpu for gpu, _, _ in calibrated}
    defaults = [(g, e, i) for g, e, i in _rows(dataset, None, samples=0) if g in gpus]
    assert len(defaults) == len(calibrated)
    median = statistics.median(e for _, e, _ in calibrated)
    assert median <= statistics.median(e for _, e, _ in defaults) + 1e-12
    inside = [i for _, _, i in calibrated]
    assert all(i is not None for i in inside)
    assert sum(inside) >= 0.8 * len(inside)
