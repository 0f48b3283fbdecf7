"""Shared pieces of the input battery (tests/test_inputs_*.py): valid base inputs, a way to change one
key of them, and the check every refusal must pass (exit code 2, one line, the file and the key, no
traceback)."""

from __future__ import annotations

import copy
import json

import yaml
from typer.testing import CliRunner

from clustersim.cli import app
from tests.conftest import SMALL_SCENARIO

SCENARIO = SMALL_SCENARIO

# An inline GPU / catalog GPU entry in gpus.yaml's schema (A100-80GB's datasheet figures).
GPU = {
    "description": "a test GPU",
    "chip": "A100",
    "peak_tflops": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
    "hbm_gbs": 2039,
    "memory_gib": 80,
    "nvlink": {"links": 12, "gbs_per_link": 20.0},
    "pcie_gen": 4,
}

# A transformer entry in models.yaml's schema (BERT-Large's shape).
TRANSFORMER = {
    "family": "transformer",
    "layers": 24,
    "hidden": 1024,
    "heads": 16,
    "ffn": 4096,
    "vocab": 30522,
    "max_positions": 512,
    "token_types": 2,
    "style": "bert",
    "default_seq_len": 128,
}

RESNET = {
    "family": "resnet",
    "blocks": [3, 4, 6, 3],
    "width": 64,
    "image_size": 224,
    "num_classes": 1000,
}

# meta-llama/Llama-2-7b-hf's config.json as published
LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}


def changed(base: dict, dotted: str | None, value) -> dict:
    """A deep copy of ``base`` with one dotted key set (a value of DELETE removes it)."""
    data = copy.deepcopy(base)
    if dotted is None:
        return data
    node = data
    parts = dotted.split(".")
    for p in parts[:-1]:
        node = node[int(p)] if isinstance(node, list) else node.setdefault(p, {})
    if value is DELETE:
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = value
    return data


DELETE = object()


def write_yaml(path, data) -> str:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def write_json(path, data) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def refused(r, *expected: str) -> str:
    """Exit 2, no traceback, one line containing every expected piece (file, key, words)."""
    out = r.output.strip()
    assert r.exit_code == 2, f"exit {r.exit_code}: {out[-2000:]}\n{r.exception!r}"
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in out
    assert len(out.splitlines()) == 1, out
    for piece in expected:
        assert piece in out, f"{piece!r} not in {out!r}"
    return out
