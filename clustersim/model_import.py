"""A model catalog entry from a Hugging Face transformer ``config.json`` (``clustersim models import``).

Reads the keys every Hugging Face decoder/encoder config carries (hidden_size, num_hidden_layers,
num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, max_position_embeddings,
tie_word_embeddings, hidden_act; GPT-2's n_embd, n_layer, n_head, n_inner, n_positions) and writes an
entry in catalogs/models.yaml's schema. The style follows the architecture: BERT configs are ``bert``;
a gated SiLU MLP (hidden_act silu/swiglu: LLaMA, Mistral, Qwen2 and kin) is ``llama`` (RMSNorm, RoPE, no
position table, no biases); anything else is ``gpt`` (LayerNorm, GeLU MLP with biases, learned
positions when the config has them). Details outside the schema (biases of other families, MoE
experts, sliding windows) are not modelled: the parameter count says how close the entry is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from clustersim.catalog import TransformerArch
from clustersim.errors import InputError

DEFAULT_SEQ_CAP = 4096  # a long-context model's default sequence, not its 128k maximum
GATED_ACTS = ("silu", "swiglu", "swish")


def _get(cfg: dict, *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def _need(cfg: dict, source: str, *keys: str) -> int:
    value = _get(cfg, *keys)
    if value is None:
        raise InputError(f"no {' or '.join(keys)} in the config", source=source)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"expected a positive integer, got {value!r}", source=source, key=keys[0])
    return value


def arch_from_hf_config(cfg: dict, source: str = "config.json") -> dict[str, Any]:
    """The models.yaml entry (a plain dict, validated) for a Hugging Face config."""
    if not isinstance(cfg, dict):
        raise InputError("expected a JSON object (a Hugging Face config.json)", source=source)
    if "num_local_experts" in cfg or "n_routed_experts" in cfg:
        raise InputError(
            "mixture-of-experts configs are not supported (one dense MLP per block)", source=source
        )
    model_type = str(cfg.get("model_type", "")).lower()
    archs = ", ".join(cfg.get("architectures") or []) or model_type or "transformer"
    hidden = _need(cfg, source, "hidden_size", "n_embd", "d_model")
    layers = _need(cfg, source, "num_hidden_layers", "n_layer", "num_layers")
    heads = _need(cfg, source, "num_attention_heads", "n_head")
    vocab = _need(cfg, source, "vocab_size")
    ffn = _get(cfg, "intermediate_size", "n_inner", "ffn_dim") or 4 * hidden
    kv_heads = _get(cfg, "num_key_value_heads", "num_kv_heads")
    positions = _get(cfg, "max_position_embeddings", "n_positions", "n_ctx", default=0)
    act = str(_get(cfg, "hidden_act", "activation_function", default="gelu")).lower()
    if model_type == "bert":
        style = "bert"
    elif act in GATED_ACTS:
        style = "llama"
    else:
        style = "gpt"
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
        entry["token_types"] = _get(cfg, "type_vocab_size", default=2)
    if kv_heads is not None and kv_heads != heads:
        entry["kv_heads"] = kv_heads
    tied = cfg.get("tie_word_embeddings", model_type in ("gpt2", "bert") or style != "llama")
    if style != "bert" and bool(tied) != (style == "gpt"):
        entry["tied_head"] = bool(tied)
    try:
        TransformerArch(**entry)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError(err["msg"], source=source, key=".".join(str(x) for x in err["loc"])) from None
    return entry


def read_hf_config(path: str | Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"cannot read ({exc.strerror or exc})", source=str(path)) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON (line {exc.lineno})", source=str(path)) from None


def default_name(cfg: dict, path: str | Path) -> str:
    """``_name_or_path``'s last part, else the folder holding config.json, else the architecture."""
    named = str(cfg.get("_name_or_path") or "").rstrip("/").split("/")[-1]
    if named:
        return named
    folder = Path(path).resolve().parent.name
    if Path(path).name == "config.json" and folder:
        return folder
    return (cfg.get("architectures") or [Path(path).stem])[0]


def entry_yaml(name: str, entry: dict) -> str:
    return yaml.safe_dump({name: entry}, sort_keys=False, default_flow_style=False)


def append_entry(out: Path, name: str, entry: dict) -> None:
    """Add the entry to a user models file (created if missing, never its folder); an existing name is
    refused; written atomically."""
    from clustersim.io import check_writable_file, write_text_atomically

    check_writable_file(out)
    existing: dict = {}
    if out.exists():
        try:
            existing = yaml.safe_load(out.read_text()) or {}
        except yaml.YAMLError:
            raise InputError("not valid YAML; not appending to it", source=str(out)) from None
        if not isinstance(existing, dict):
            raise InputError("expected a mapping of names to entries", source=str(out))
        if name in existing:
            raise InputError(f"{name!r} is already in this file; choose another --name", source=str(out))
    text = out.read_text() if out.exists() else ""
    if text and not text.endswith("\n"):
        text += "\n"
    write_text_atomically(out, text + entry_yaml(name, entry))
