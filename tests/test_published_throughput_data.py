"""The published GPU throughput data (clustersim/validation/data/gpu_throughput.yaml): every row names
its source and catalog entries, and the numbers pass the checks a mis-copied cell would fail."""

import copy
from collections import defaultdict
from importlib import resources
from pathlib import Path

import pytest

from clustersim import catalog
from clustersim.errors import InputError
from clustersim.io import load_yaml
from clustersim.validation.published import datasets
from clustersim.validation.throughput_data import load_gpu_throughput, parse_gpu_throughput

ROWS = load_gpu_throughput().rows


def _raw() -> dict:
    text = resources.files("clustersim.validation").joinpath("data", "gpu_throughput.yaml").read_text()
    return load_yaml(text)


def test_rows_are_sourced_and_name_catalog_entries():
    assert 15 <= len(ROWS) <= 60
    for r in ROWS:
        assert r.gpu in catalog.gpus() and r.model in catalog.models()
        # a repository path (a README table or a result log) and the version it was read at
        assert r.source.startswith(("NVIDIA/DeepLearningExamples ", "mlcommons/training_results_"))
        assert ".md" in r.source or ".txt" in r.source
        assert r.source_version and r.notes and r.throughput > 0
        assert r.nodes == 1 and r.gpus in (1, 8)  # single GPU or single node
        assert r.precision in catalog.gpu(r.gpu).peak_tflops
        assert r.gpu_memory_gb <= catalog.gpu(r.gpu).memory_gib + 1


def test_rows_are_distinct():
    keys = [(r.source, r.gpus, r.precision, r.micro_batch, r.seq_len) for r in ROWS]
    assert len(keys) == len(set(keys))


def test_a_spread_of_gpus_precisions_and_models():
    assert {r.gpu for r in ROWS} >= {"V100-SXM2", "A100-40GB", "A100-80GB", "H100-SXM"}
    assert {r.precision for r in ROWS} >= {"fp32", "tf32", "fp16"}
    assert {r.model for r in ROWS} == {"BERT-Large", "ResNet-50"}
    assert len({r.micro_batch for r in ROWS}) >= 8


def test_mixed_precision_beats_full_precision_in_every_published_pair():
    """Each table publishes fp16 beside FP32/TF32 at the same GPU count and sequence length; a swapped
    column would put the slower number under fp16."""
    pairs = defaultdict(dict)
    for r in ROWS:
        pairs[(r.source, r.gpus, r.seq_len)][r.precision] = r.throughput
    checked = 0
    for by_precision in pairs.values():
        full = by_precision.get("tf32") or by_precision.get("fp32")
        if full and "fp16" in by_precision:
            assert 1.5 < by_precision["fp16"] / full < 6, by_precision
            checked += 1
    assert checked >= 20


def test_eight_gpus_scale_sublinearly_over_one():
    """Published weak scaling is 6.7-7.95x on one 8-GPU node; above 8x, or far below, is a copying error."""
    by_gpus = defaultdict(dict)
    for r in ROWS:
        by_gpus[(r.source, r.precision, r.seq_len, r.micro_batch)][r.gpus] = r.throughput
    ratios = [g[8] / g[1] for g in by_gpus.values() if 1 in g and 8 in g]
    assert len(ratios) >= 20
    assert all(6.0 < x <= 8.0 for x in ratios), ratios


def test_bert_pretraining_rows_keep_the_lamb_batch_per_gpu():
    """The DeepLearningExamples pre-training tables keep the accumulated batch per GPU fixed per phase
    (8192/4096 on DGX A100 80GB, 4096/2048 on DGX-1 32G), whatever the precision's micro-batch."""
    expected = {
        ("A100-80GB", 128): 8192,
        ("A100-80GB", 512): 4096,
        ("V100-SXM2", 128): 4096,
        ("V100-SXM2", 512): 2048,
    }
    seen = 0
    for r in ROWS:
        if r.optimizer == "lamb" and "21.11" in r.framework:
            assert r.micro_batch * r.gradient_accumulation == expected[(r.gpu, r.seq_len)], r
            seen += 1
    assert seen == 16


def test_the_file_is_not_taken_for_a_validate_dataset():
    assert "gpu_throughput" not in datasets()


def _first_row(raw: dict) -> dict:
    return raw["tables"][0]["rows"][0]


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        (lambda raw: raw["tables"][0].update(gpu="V100-SXM3"), "tables[0].rows[0].gpu", "unknown GPU"),
        (lambda raw: raw["tables"][0].update(model="BERT-large"), "tables[0].rows[0].model", "unknown model"),
        (lambda raw: raw["tables"][0].pop("source"), "tables[0].rows[0].source", "missing"),
        (lambda raw: _first_row(raw).update(throughput=0), "tables[0].rows[0].throughput", "greater than 0"),
        (lambda raw: _first_row(raw).update(precision="fp8"), "tables[0].rows[0].precision", "no fp8"),
        (lambda raw: _first_row(raw).update(seq_len=1024), "tables[0].rows[0].seq_len", "exceeds"),
        (lambda raw: _first_row(raw).update(image_size=224), "tables[0].rows[0].seq_len", "not image_size"),
        (lambda raw: _first_row(raw).update(execution="jit"), "tables[0].rows[0].execution", ""),
        (lambda raw: _first_row(raw).update(gpus=12, nodes=8), "tables[0].rows[0]", "whole number"),
        (lambda raw: raw["tables"][0].update(rows=[]), "tables[0].rows", "non-empty"),
    ],
)
def test_a_bad_entry_is_one_line_naming_file_and_key(change, key, words):
    raw = copy.deepcopy(_raw())
    change(raw)
    with pytest.raises(InputError) as info:
        parse_gpu_throughput(raw)
    err = info.value
    assert err.source == "gpu_throughput.yaml" and err.key.startswith(key), (err.key, err.message)
    assert words in err.message and "\n" not in str(err)


def test_bf16_on_a_gpu_without_it_is_refused():
    raw = copy.deepcopy(_raw())
    v100 = next(t for t in raw["tables"] if t["gpu"] == "V100-SXM2")
    v100["rows"][0]["precision"] = "bf16"
    with pytest.raises(InputError, match="V100-SXM2 has no bf16"):
        parse_gpu_throughput(raw)


def test_a_row_overrides_its_table():
    raw = copy.deepcopy(_raw())
    raw["tables"][0]["rows"][0]["notes"] = "row note"
    rows = parse_gpu_throughput(raw).rows
    assert rows[0].notes == "row note" and rows[1].notes == raw["tables"][0]["notes"]


def test_the_docs_page_lists_every_row():
    page = (Path(__file__).resolve().parent.parent / "docs" / "validation-gpu-throughput.md").read_text()
    lines = [
        line for line in page.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()
    ]
    assert len(lines) == len(ROWS)
    for line, r in zip(lines, ROWS):
        cells = [c.strip() for c in line.split("|")[1:-1]]
        assert (cells[1], cells[3], int(cells[4]), cells[5]) == (r.model, r.gpu, r.gpus, r.precision)
        assert float(cells[10].replace(",", "")) == pytest.approx(r.throughput, abs=0.005)


def test_batch_norm_on_a_transformer_row_is_refused():
    raw = copy.deepcopy(_raw())
    bert = next(t for t in raw["tables"] if t["model"] == "BERT-Large")
    bert["rows"][0]["batch_norm"] = "fused"
    with pytest.raises(InputError, match="a transformer row has none") as info:
        parse_gpu_throughput(raw)
    assert info.value.key.endswith("batch_norm")


def test_every_row_has_a_short_source_label():
    """validate's table names each row's source in a few words: MLPerf's round, the DeepLearningExamples
    container, or the framework a step was measured with; rows that differ only in it are told apart."""
    labels = {row.source_label for row in load_gpu_throughput().rows}
    assert labels == {
        "DLE 20.06",
        "DLE 21.03",
        "DLE 21.11",
        *(f"MLPerf v{v}" for v in ("1.0", "1.1", "2.0", "2.1", "3.0", "3.1")),
    }
    assert {row.source_label for row in load_gpu_throughput("gpu_steps").rows} == {"PyTorch 2.11"}
