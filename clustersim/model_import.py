"""A model catalog entry from a Hugging Face transformer ``config.json`` (``clustersim models import``).

Reads the keys every Hugging Face decoder/encoder config carries (hidden_size, num_hidden_layers,
num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, max_position_embeddings,
tie_word_embeddings, hidden_act; GPT-2's n_embd, n_layer, n_head, n_inner, n_positions) and writes an
entry in catalogs/models.yaml's schema. The style follows the model type (MODEL_TYPES): BERT and
RoBERTa are ``bert``; LLaMA, Mistral and Qwen2 (a gated SiLU MLP) ``llama`` (RMSNorm, RoPE, no position
table, no biases); GPT-2 ``gpt`` (LayerNorm, GeLU MLP with biases, learned positions). Any other model
type is refused by name, and the entry passes the catalog's own checks (catalog.parse_model_entry), its
errors named by the config's keys. Details outside the schema (biases of other families, MoE
experts, sliding windows) are not modelled: the parameter count says how close the entry is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from clustersim.catalog import parse_model_entry
from clustersim.errors import InputError
from clustersim.io import parse_yaml, read_input_text, read_structured_file

DEFAULT_SEQ_CAP = 4096  # a long-context model's default sequence, not its 128k maximum
GATED_ACTS = ("silu", "swiglu", "swish")

# The Hugging Face model types whose architecture the schema's styles describe, and the style of each.
# Each family's config class (transformers/models/<type>/configuration_<type>.py) sets the defaults a
# config.json may leave out: hidden_act "gelu" (BertConfig, RobertaConfig), activation_function
# "gelu_new" (GPT2Config), hidden_act "silu" (LlamaConfig, MistralConfig, Qwen2Config). Any other type
# (mamba, rwkv, t5, a mixture of experts) is another architecture and is refused by name.
MODEL_TYPES = {
    "bert": ("bert", "gelu"),
    "roberta": ("bert", "gelu"),
    "gpt2": ("gpt", "gelu_new"),
    "llama": ("llama", "silu"),
    "mistral": ("llama", "silu"),
    "qwen2": ("llama", "silu"),
}

# Which config key each schema field came from (the first of these the config has), so that an entry
# the schema refuses is reported under the key the config.json spells.
_KEYS = {
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "heads": ("num_attention_heads", "n_head"),
    "vocab": ("vocab_size",),
    "ffn": ("intermediate_size", "n_inner", "ffn_dim"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "max_positions": ("max_position_embeddings", "n_positions", "n_ctx"),
    "token_types": ("type_vocab_size",),
}


def _key(cfg: dict, field: str) -> str:
    keys = _KEYS[field]
    return next((k for k in keys if cfg.get(k) is not None), keys[0])


def _shown(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return repr(value) if isinstance(value, int | float) else f"a {type(value).__name__}"


def _count(cfg: dict, source: str, field: str, required: bool = True) -> int | None:
    """A positive integer the config gives under one of the field's keys (None if optional and absent)."""
    key = _key(cfg, field)
    value = cfg.get(key)
    if value is None:
        if required:
            raise InputError(f"no {' or '.join(_KEYS[field])} in the config", source=source)
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"expected a positive integer, not {_shown(value)}", source=source, key=key)
    return value


def _style(cfg: dict, source: str) -> tuple[str, str, str]:
    """(style, activation, model_type): the model type must be one the schema describes."""
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise InputError(
            f"no model_type in the config (importable: {', '.join(MODEL_TYPES)})",
            source=source,
            key="model_type",
        )
    if model_type.lower() not in MODEL_TYPES:
        raise InputError(
            f"model_type {model_type!r} is not an architecture this importer describes "
            f"(importable: {', '.join(MODEL_TYPES)})",
            source=source,
            key="model_type",
        )
    style, default_act = MODEL_TYPES[model_type.lower()]
    act_key = "activation_function" if "activation_function" in cfg else "hidden_act"
    act = cfg.get(act_key)
    if act is None:
        act = default_act
    if not isinstance(act, str):
        raise InputError(f"expected an activation name, not {_shown(act)}", source=source, key=act_key)
    act = act.lower()
    if (style == "llama") != (act in GATED_ACTS):
        mlp = "a gated SiLU MLP" if style == "llama" else "a GeLU MLP"
        raise InputError(
            f"{act!r} is not the activation of a {model_type} (this schema models {mlp} for it)",
            source=source,
            key=act_key,
        )
    return style, act, model_type.lower()


def arch_from_hf_config(cfg: dict, source: str = "config.json") -> dict[str, Any]:
    """The models.yaml entry (a plain dict, validated) for a Hugging Face config."""
    if not isinstance(cfg, dict):
        raise InputError("expected a JSON object (a Hugging Face config.json)", source=source)
    if "num_local_experts" in cfg or "n_routed_experts" in cfg:
        raise InputError(
            "mixture-of-experts configs are not supported (one dense MLP per block)", source=source
        )
    style, act, model_type = _style(cfg, source)
    listed = cfg.get("architectures")
    archs = ", ".join(str(a) for a in listed) if isinstance(listed, list) and listed else model_type
    hidden = _count(cfg, source, "hidden")
    layers = _count(cfg, source, "layers")
    heads = _count(cfg, source, "heads")
    vocab = _count(cfg, source, "vocab")
    ffn = _count(cfg, source, "ffn", required=False) or 4 * hidden
    kv_heads = _count(cfg, source, "kv_heads", required=False)
    # learned positions (bert, gpt) are a table whose size is part of the model and caps its sequence;
    # RoPE (llama) has none, so only there may the config leave it out
    positions = _count(cfg, source, "max_positions", required=style != "llama") or 0
    entry: dict[str, Any] = {
        "family": "transformer",
        "description": f"imported from {Path(source).name} ({archs}; {style} style, {act} MLP)",
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "ffn": ffn,
        "vocab": vocab,
        # RoPE (llama style) has no position table; learned positions (bert, gpt) do
        "max_positions": 0 if style == "llama" else positions,
        "style": style,
        "default_seq_len": min(positions, DEFAULT_SEQ_CAP) if positions else 2048,
    }
    if style == "bert":
        entry["token_types"] = _count(cfg, source, "token_types", required=False) or 2
    if kv_heads is not None and kv_heads != heads:
        entry["kv_heads"] = kv_heads
    tied = cfg.get("tie_word_embeddings", style != "llama")
    if not isinstance(tied, bool):
        raise InputError(
            f"expected true or false, not {_shown(tied)}", source=source, key="tie_word_embeddings"
        )
    if style != "bert" and tied != (style == "gpt"):
        entry["tied_head"] = tied
    try:
        parse_model_entry(entry, source)
    except InputError as exc:
        field = (exc.key or "").split(".")[0]
        raise InputError(
            exc.message, source=source, key=_key(cfg, field) if field in _KEYS else exc.key
        ) from None
    return entry


def read_hf_config(path: str | Path) -> dict:
    return read_structured_file(Path(path), fmt="json")


def default_name(cfg: dict, path: str | Path) -> str:
    """``_name_or_path``'s last part, else the folder holding config.json, else the architecture."""
    named = str(cfg.get("_name_or_path") or "").rstrip("/").split("/")[-1]
    if named:
        return named
    folder = Path(path).resolve().parent.name
    if Path(path).name == "config.json" and folder:
        return folder
    listed = cfg.get("architectures")
    return str(listed[0]) if isinstance(listed, list) and listed else Path(path).stem


def entry_yaml(name: str, entry: dict) -> str:
    return yaml.safe_dump({name: entry}, sort_keys=False, default_flow_style=False)


def append_entry(out: Path, name: str, entry: dict, config: Path | None = None) -> None:
    """Add the entry to a user models file (created if missing, never its folder); an existing name is
    refused; written atomically (check_append says what is refused)."""
    from clustersim.io import write_text_atomically

    text = check_append(out, name, config)
    if text and not text.endswith("\n"):
        text += "\n"
    write_text_atomically(out, text + entry_yaml(name, entry))


def check_append(out: Path, name: str, config: Path | None = None) -> str:
    """Whether an entry ``name`` can be added to the user models file ``out``, before it is made (a
    measurement that would write it takes minutes): the file is YAML (.yaml or .yml: a catalog is read by
    its suffix), never the ``config`` the entry is made from, and an existing file must be a catalog (GPU
    and model entries) without that name: the entry appended to a scenario would make neither a scenario
    nor a catalog. Returns the file's text ("" for a new file)."""
    from clustersim.catalog import read_user_catalog
    from clustersim.io import check_writable_file

    check_writable_file(out, inputs=(config,))
    if Path(out).suffix.lower() not in (".yaml", ".yml"):
        raise InputError("the entry is written as YAML: give a .yaml or .yml file", source=str(out))
    text = read_input_text(out) if out.exists() else ""
    if text:
        existing = parse_yaml(text, str(out)) or {}
        if not isinstance(existing, dict):
            raise InputError("expected a mapping of names to entries", source=str(out))
        try:
            read_user_catalog(out)
        except InputError as exc:
            where = f"{exc.key}: " if exc.key else ""
            raise InputError(
                f"not a catalog of GPU and model entries ({where}{exc.message}); nothing added: give a new "
                "file or a models catalog",
                source=str(out),
            ) from None
        if name in existing:
            raise InputError(
                f"already has a model named {name!r} (each name once in this file): choose another --name",
                source=str(out),
            )
    return text
