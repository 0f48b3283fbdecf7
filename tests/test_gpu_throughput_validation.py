"""`validate --dataset gpu_throughput`: single-GPU and single-node throughputs from the published tables
(validation/data/gpu_throughput.yaml), predicted from the catalog defaults with no per-row factor."""

from __future__ import annotations

import math

import pytest

from clustersim.simulator.uncertainty import DEFAULT_COMPUTE_SIGMA
from clustersim.validation.gpu_throughput import OPTIMIZER, scenario_for, validate_throughput
from clustersim.validation.throughput_data import load_gpu_throughput


def test_every_published_row_is_a_valid_scenario_of_its_own_settings():
    for row in load_gpu_throughput().rows:
        s = scenario_for(row)
        assert s.cluster.world_size == row.gpus and s.cluster.gpu == row.gpu
        assert s.workload.micro_batch == row.micro_batch and s.workload.precision == row.precision
        assert s.workload.gradient_accumulation == row.gradient_accumulation
        assert s.workload.execution == row.execution
        assert s.training.optimizer == OPTIMIZER[row.optimizer]


@pytest.fixture(scope="module")
def report():
    return validate_throughput(samples=0)


def test_default_compute_band_holds_the_published_value_in_most_rows(report):
    """The default compute band (exp(+-1.2816 sigma) around the prediction) was sized from these rows:
    it must hold at least 80% of them, and the median error must stay where the docs say (22%)."""
    half = 1.2816 * DEFAULT_COMPUTE_SIGMA
    inside = [abs(math.log(1 + r.error)) <= half for r in report.scored]
    assert sum(inside) / len(inside) >= 0.8
    assert report.median_abs_error <= 0.23


def test_the_current_bert_pretraining_code_is_predicted_within_ten_percent(report):
    """DeepLearningExamples' current BERT pre-training (fixed-length seq 128 on A100-80GB, compiled):
    the code closest to what the defaults were measured on."""
    rows = [
        r for r in report.scored if r.gpu == "A100-80GB" and r.seq_len == 128 and r.execution == "compiled"
    ]
    assert len(rows) == 4
    assert all(abs(r.error) <= 0.10 for r in rows), [(r.precision, r.error) for r in rows]


def test_with_a_profile_each_row_says_what_priced_its_compute():
    """validate --profile: the model the profile measured is priced from its own measurement, other
    transformers from its rates carried over, a CNN it has no measurement of from the defaults."""
    report = validate_throughput("builtin:h100-pytorch-2.11", samples=0, dataset="gpu_steps")
    by_model = {r.model: r.compute for r in report.rows}
    assert by_model == {
        "GPT-2-1.5B": "measured",
        "BERT-Large": "carried",
        "GPT-3-1.3B": "carried",
        "ResNet-50": "defaults",
    }
