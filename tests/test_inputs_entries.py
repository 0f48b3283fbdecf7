"""The input battery, hardware and models: a GPU or a model is the same validated type whichever way it
comes in (an inline scenario entry, a ``--catalog`` file, ``models import`` of a Hugging Face config),
so each bad value below is refused the same way on every path, naming the file and the key the user
wrote; the shipped catalogs pass the same checks."""

from __future__ import annotations

import json

import pytest

from tests.inputs_support import (
    DELETE,
    GPU,
    LLAMA2_7B,
    RESNET,
    SCENARIO,
    TRANSFORMER,
    changed,
    invoke,
    refused,
    write_json,
    write_yaml,
)

INF = float("inf")

# (key in a GPU entry, bad value, key the error must name, words it must say)
BAD_GPU = [
    ("hbm_gbs", INF, "hbm_gbs", "finite"),
    ("hbm_gbs", 0, "hbm_gbs", "greater than 0"),
    ("hbm_gbs", True, "hbm_gbs", "true"),
    ("hbm_gbs", 1e12, "hbm_gbs", "beyond"),
    ("memory_gib", 1e300, "memory_gib", "beyond"),
    ("memory_gib", -80, "memory_gib", "greater than 0"),
    ("peak_tflops", {"fp32": -19.5}, "peak_tflops.fp32", "greater than 0"),
    ("peak_tflops", {"fp32": 19.5, "bf16": 0}, "peak_tflops.bf16", "greater than 0"),
    ("peak_tflops", {}, "peak_tflops", "fp32"),
    ("peak_tflops", {"fp16": 312.0}, "peak_tflops", "fp32"),
    ("peak_tflops", {"fp32": 1e308}, "peak_tflops.fp32", "beyond"),
    ("peak_tflops", {"fp32": True}, "peak_tflops.fp32", "true"),
    ("peak_tflops", {"fp32": 19.5, "int3": 5}, "peak_tflops.int3", ""),
    ("matmul_efficiency", {"fp32": 1.5}, "matmul_efficiency.fp32", "less than or equal to 1"),
    ("matmul_efficiency", {"fp16": 0}, "matmul_efficiency.fp16", "greater than or equal to 0.01"),
    ("matmul_efficiency", {"fp16": 1e-300}, "matmul_efficiency.fp16", "greater than or equal to 0.01"),
    ("matmul_efficiency", {"fp32": True}, "matmul_efficiency.fp32", "true"),
    ("matmul_efficiency", {"fp8": 0.8}, "matmul_efficiency", "peak_tflops does not give"),
    ("nvlink", {"links": 12, "gbs_per_link": INF}, "nvlink.gbs_per_link", "finite"),
    ("nvlink", {"links": 12, "gbs_per_link": 0}, "nvlink.gbs_per_link", "links"),
    ("nvlink", {"links": True, "gbs_per_link": 20}, "nvlink.links", "true"),
    ("nvlink", {"links": 2.5, "gbs_per_link": 20}, "nvlink.links", "not a whole number: 2.5"),
    ("nvlink", {"links": 1000, "gbs_per_link": 20}, "nvlink.links", "beyond"),
    ("nvlink", {"links": 12, "gbs_per_link": 1e9}, "nvlink.gbs_per_link", "beyond"),
    ("price_per_gpu_hour", INF, "price_per_gpu_hour", "finite"),
    ("price_per_gpu_hour", 1e9, "price_per_gpu_hour", "beyond"),
    ("pcie_gen", True, "pcie_gen", "true"),
    ("dies_per_package", 1.5, "dies_per_package", "not a whole number: 1.5"),
    ("cuda_name", {"pattern": "A100("}, "cuda_name.pattern", "regular expression"),
    ("cuda_name", {"pattern": "A100", "min_memory_gib": -1}, "cuda_name.min_memory_gib", "greater than"),
]


def _gpu_inline(tmp_path, key, value):
    gpu = {"name": "X100", **changed(GPU, key, value)}
    path = write_yaml(tmp_path / "s.yaml", changed(SCENARIO, "cluster.gpu", gpu))
    return invoke("run", path, "--samples", "0"), path, f"cluster.gpu.{key}"


def _gpu_catalog(tmp_path, key, value):
    cat = write_yaml(tmp_path / "cat.yaml", {"X100": changed(GPU, key, value)})
    path = write_yaml(tmp_path / "s.yaml", changed(SCENARIO, "cluster.gpu", "X100"))
    return invoke("run", path, "--samples", "0", "--catalog", cat), cat, f"X100.{key}"


GPU_PATHS = {"inline": _gpu_inline, "catalog": _gpu_catalog}


@pytest.mark.parametrize("entry", sorted(GPU_PATHS))
@pytest.mark.parametrize("key,value,where,words", BAD_GPU, ids=[f"{k}={v!r}" for k, v, *_ in BAD_GPU])
def test_a_bad_gpu_is_refused_on_every_path(tmp_path, entry, key, value, where, words):
    r, source, prefix = GPU_PATHS[entry](tmp_path, key, value)
    full = prefix.rsplit(".", 1)[0] + "." + where
    refused(r, source, full, words)


# (entry, dotted key, bad value, key named, words)
BAD_MODELS = [
    (TRANSFORMER, "family", "mamba", "family", "'mamba'"),
    (TRANSFORMER, "family", ["transformer"], "family", "'list'"),
    (TRANSFORMER, "heads", 15, "heads", "divide"),
    (TRANSFORMER, "kv_heads", 5, "kv_heads", "divide"),
    (TRANSFORMER, "layers", True, "layers", "true"),
    (TRANSFORMER, "hidden", 1024.5, "hidden", "not a whole number: 1024.5"),
    (TRANSFORMER, "default_seq_len", 1024, "default_seq_len", "max_positions"),
    (TRANSFORMER, "vocab", INF, "vocab", ""),
    (TRANSFORMER, "tied_head", 1, "tied_head", "boolean"),
    (RESNET, "blocks", [-3, 0], "blocks.0", "greater than 0"),
    (RESNET, "blocks", [], "blocks", "at least 1"),
    (RESNET, "blocks", [3, True], "blocks.1", "true"),
    (RESNET, "image_size", 8, "image_size", "stages"),
    (RESNET, "width", 0, "width", "greater than 0"),
]


@pytest.mark.parametrize(
    "entry,key,value,where,words", BAD_MODELS, ids=[f"{e['family']}.{k}={v!r}" for e, k, v, *_ in BAD_MODELS]
)
def test_a_bad_catalog_model_is_refused(tmp_path, entry, key, value, where, words):
    cat = write_yaml(tmp_path / "cat.yaml", {"M1": changed(entry, key, value)})
    refused(invoke("models", "list", "--catalog", cat), cat, f"M1.{where}", words)


def test_the_shipped_catalogs_pass_the_same_checks():
    from clustersim import catalog

    assert len(catalog.gpus()) >= 10 and len(catalog.models()) >= 10  # every entry validated on load


# (scenario key, value, key named, words): cross-field rules between a scenario and its model
BAD_SCENARIO_MODEL = [
    ("workload.seq_len", 1024, "workload.seq_len", "512"),  # BERT-Large has 512 positions
]


@pytest.mark.parametrize("key,value,where,words", BAD_SCENARIO_MODEL)
def test_a_scenario_beyond_its_model_is_refused(tmp_path, key, value, where, words):
    path = write_yaml(tmp_path / "s.yaml", changed(SCENARIO, key, value))
    refused(invoke("run", path, "--samples", "0"), path, where, words)


def _import(tmp_path, cfg, *extra):
    folder = tmp_path / "hf"
    folder.mkdir(exist_ok=True)
    path = write_json(folder / "config.json", cfg)
    return invoke("models", "import", path, *extra), path


# (config key, bad value, key named, words)
BAD_HF = [
    ("model_type", "mamba", "model_type", "mamba"),
    ("model_type", "rwkv", "model_type", "rwkv"),
    ("num_attention_heads", 31, "num_attention_heads", "divide"),
    ("num_key_value_heads", 5, "num_key_value_heads", "divide"),
    ("num_hidden_layers", True, "num_hidden_layers", "true"),
    ("intermediate_size", -5, "intermediate_size", "positive"),
    ("intermediate_size", 1.5, "intermediate_size", "integer"),
    ("max_position_embeddings", "long", "max_position_embeddings", "integer"),
    ("tie_word_embeddings", "yes", "tie_word_embeddings", "true or false"),
    ("hidden_act", "relu", "hidden_act", "relu"),
    ("hidden_act", 5, "hidden_act", "activation name"),
    ("model_type", ["llama"], "model_type", "no model_type"),
    # refused before one layer is built (it used to build 10**12 layer objects: 87 s, past 6 GiB)
    ("num_hidden_layers", 10**12, "num_hidden_layers", "DeepNet"),
]


@pytest.mark.parametrize("key,value,where,words", BAD_HF, ids=[f"{k}={v!r}" for k, v, *_ in BAD_HF])
def test_a_bad_hf_config_is_refused_by_its_own_key(tmp_path, key, value, where, words):
    r, path = _import(tmp_path, changed(LLAMA2_7B, key, value))
    refused(r, path, where, words)


@pytest.mark.parametrize("value", [True, 3, "LlamaForCausalLM", {}])
def test_a_config_whose_architectures_is_not_a_list_still_imports(tmp_path, value):
    r, _ = _import(tmp_path, changed(LLAMA2_7B, "architectures", value))
    assert r.exit_code == 0, r.output


def test_a_llama_config_without_hidden_act_imports_as_swiglu_llama(tmp_path):
    """LLaMA's config class defaults hidden_act to silu (transformers LlamaConfig): a config.json that
    leaves it out is still a SwiGLU LLaMA of 6.74 B parameters, not a GELU GPT."""
    r, _ = _import(tmp_path, changed(LLAMA2_7B, "hidden_act", DELETE), "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["entry"]["style"] == "llama"
    assert abs(d["params"] - 6.738e9) / 6.738e9 < 0.01, d["params"]


def test_models_import_refuses_a_name_no_catalog_would_read_back(tmp_path):
    r, _ = _import(tmp_path, LLAMA2_7B, "--name", "my model!", "--out", tmp_path / "m.yaml")
    refused(r, "--name", "not a name")
    assert not (tmp_path / "m.yaml").exists()
