"""EAGLE-3 heads in vLLM's speculators format: a directory with ``config.json`` and safetensors.

What a head written here holds, and what one written elsewhere must hold to load (the keys vLLM
reads, with vLLM's defaults where a key is missing):

    speculators_model_type         "eagle3"
    transformer_layer_config       the decoder layer's shape (a Llama config: hidden_size,
                                   intermediate_size, heads, head_dim, rms_norm_eps, rope, vocab_size
                                   = the target's); one layer, no biases, no rope scaling
    draft_vocab_size               the head's vocabulary (``d2t``, ``t2d`` map it to the target's)
    eagle_aux_hidden_state_layer_ids   the target's hidden_states it reads (default 2, L/2, L-3)
    target_hidden_size             null: the verifier's (= hidden_size)
    norm_before_residual           default true (vLLM's); norm_before_fc, fc_norm, norm_output false
    speculators_config             algorithm "eagle3", proposal_methods [{proposal_type "greedy",
                                   speculative_tokens}], default_proposal_method, verifier
                                   {name_or_path, architectures}

Weights: ``fc``, ``layers.0.*`` (q/k/v over 2H), ``norm``, ``lm_head`` [Vd, H], ``d2t`` [Vd]
(target id = draft id + d2t), ``t2d`` [V] (bool), ``embed_tokens`` or none (then the target's),
``input_norm`` with norm_before_fc, ``fc_norm.{0,1,2}`` with fc_norm. A key specserve does not
implement (several layers, biases, rope scaling, another layer type) is refused in one line.

``is_head``, ``read_config`` and ``load_head`` also take a model that carries an MTP module
(mtp.py): a head fed by the target as well, which serves through the same path.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from ..loading import ModelSpec, load_config, load_model, resolve_device, resolve_dtype

# FACTS and read_facts are not used here: they are this module's API too (the zoo's builds import them).
from .checkpoint import CONFIG, FACTS, LAYER_TYPES, WEIGHTS, HeadFormatError, read_facts, rope_type  # noqa: F401
from .eagle3 import Eagle3Head, FedHead, HeadConfig, default_aux_layers
from .mtp import is_mtp, load_mtp, read_mtp_config

SPECULATIVE_TOKENS = 3  # what the head was trained to draft (its TTT steps): vLLM's k for it
FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def is_head(directory: str | Path) -> bool:
    """Whether ``directory`` holds a head fed by the target's hidden states, served as such (not as a
    causal LM): a speculators EAGLE-3 head, or a model that carries an MTP module (mtp.py)."""
    return is_eagle3(directory) or is_mtp(directory)


def is_eagle3(directory: str | Path) -> bool:
    """Whether ``directory`` holds a speculators EAGLE-3 head."""
    path = Path(directory) / CONFIG
    try:
        return json.loads(path.read_text()).get("speculators_model_type") == "eagle3"
    except (OSError, ValueError, AttributeError):
        return False


def save_head(head: Eagle3Head, directory: str | Path, verifier: str, architectures: list[str],
              speculative_tokens: int = SPECULATIVE_TOKENS) -> None:
    """Write ``head`` as vLLM and SGLang load it, with its embeddings (speculators' trainer writes them
    too): a draft worker then needs nothing of the target's but its config."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG).write_text(json.dumps(config_json(head.config, verifier, architectures, speculative_tokens),
                                         indent=2) + "\n")
    weights = {name: tensor.detach().contiguous() for name, tensor in head.state_dict().items()}
    save_file(weights, str(out / WEIGHTS))


def config_json(c: HeadConfig, verifier: str, architectures: list[str], speculative_tokens: int) -> dict:
    layer = {"model_type": "llama", "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
             "intermediate_size": c.intermediate_size, "num_hidden_layers": 1,
             "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
             "head_dim": c.head_dim, "hidden_act": "silu", "rms_norm_eps": c.rms_norm_eps,
             "max_position_embeddings": c.max_position_embeddings, "rope_theta": c.rope_theta, "rope_scaling": None,
             "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False}
    method = {"proposal_type": "greedy", "speculative_tokens": speculative_tokens, "verifier_accept_k": 1,
              "accept_tolerance": 0.0}
    return {"architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3",
            "draft_vocab_size": c.draft_vocab_size,
            "target_hidden_size": None if c.target_hidden_size == c.hidden_size else c.target_hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(c.aux_layers), **{flag: getattr(c, flag) for flag in FLAGS},
            "embed_requires_grad": False, "tie_word_embeddings": False, "transformer_layer_config": layer,
            "speculators_config": {"algorithm": "eagle3", "proposal_methods": [method],
                                   "default_proposal_method": "greedy",
                                   "verifier": {"name_or_path": verifier, "architectures": architectures}}}


def read_config(directory: str | Path, target: PretrainedConfig) -> HeadConfig:
    """The head's config (an EAGLE-3 head's or an MTP module's) checked against ``target``, the
    verifier it will serve."""
    if is_mtp(directory):
        return read_mtp_config(directory, target)
    return read_eagle3_config(directory, target)[0]


def read_eagle3_config(directory: str | Path, target: PretrainedConfig) -> tuple[HeadConfig, dict]:
    """An EAGLE-3 head's config checked against ``target``, and the raw JSON."""
    where = Path(directory)
    try:
        doc = json.loads((where / CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise HeadFormatError(f"{where}: no readable {CONFIG} ({exc})") from None
    if doc.get("speculators_model_type") != "eagle3":
        raise HeadFormatError(f"{where}: not an EAGLE-3 head (speculators_model_type is "
                              f"{doc.get('speculators_model_type')!r}, expected 'eagle3')")
    layer = doc.get("transformer_layer_config") or {}
    _refuse_unsupported(where, doc, layer)
    t = target.get_text_config()
    hidden = layer.get("hidden_size")
    if hidden != t.hidden_size or layer.get("vocab_size", t.vocab_size) != t.vocab_size:
        raise HeadFormatError(f"{where}: this head is for another target (hidden size {hidden}, vocabulary "
                              f"{layer.get('vocab_size')}); the target has {t.hidden_size} and {t.vocab_size}")
    heads = layer["num_attention_heads"]
    aux = doc.get("eagle_aux_hidden_state_layer_ids")
    try:
        config = HeadConfig(
            hidden_size=hidden, target_hidden_size=doc.get("target_hidden_size") or t.hidden_size,
            intermediate_size=layer["intermediate_size"], num_attention_heads=heads,
            num_key_value_heads=layer.get("num_key_value_heads") or heads,
            head_dim=layer.get("head_dim") or hidden // heads, vocab_size=t.vocab_size,
            draft_vocab_size=doc.get("draft_vocab_size") or t.vocab_size,
            aux_layers=tuple(aux) if aux else default_aux_layers(t.num_hidden_layers),
            rms_norm_eps=layer.get("rms_norm_eps", 1e-6),
            rope_theta=layer.get("rope_theta") or (layer.get("rope_parameters") or {}).get("rope_theta") or 10000.0,
            max_position_embeddings=layer.get("max_position_embeddings", t.max_position_embeddings),
            **{flag: bool(doc.get(flag, flag == "norm_before_residual")) for flag in FLAGS})
    except (KeyError, TypeError, ValueError) as exc:
        raise HeadFormatError(f"{where}: {CONFIG} is not a valid EAGLE-3 head config: {exc}") from None
    if config.target_hidden_size != t.hidden_size:
        raise HeadFormatError(f"{where}: this head reads hidden states of width {config.target_hidden_size}; the "
                              f"target's are {t.hidden_size}")
    if too_deep := [layer_id for layer_id in config.aux_layers if not 0 <= layer_id <= t.num_hidden_layers]:
        raise HeadFormatError(f"{where}: aux layers {too_deep} do not exist in a target of {t.num_hidden_layers} "
                              f"layers")
    return config, doc


def _refuse_unsupported(where: Path, doc: dict, layer: dict) -> None:
    checks = [
        (layer.get("model_type", "llama") in LAYER_TYPES,
         f"its layer is {layer.get('model_type')!r}; specserve runs Llama-shaped layers ({', '.join(LAYER_TYPES)})"),
        (layer.get("num_hidden_layers", 1) == 1, f"it has {layer.get('num_hidden_layers')} layers; specserve runs one"),
        (not layer.get("attention_bias") and not layer.get("mlp_bias"), "its layer has biases"),
        (rope_type(layer) == "default", f"its rope is {rope_type(layer)!r}; specserve runs the default rope"),
        (layer.get("hidden_act", "silu") == "silu", f"its activation is {layer.get('hidden_act')!r}, not silu"),
        (not (doc.get("norm_before_fc") and doc.get("fc_norm")), "it sets both norm_before_fc and fc_norm"),
    ]
    for ok, why in checks:
        if not ok:
            raise HeadFormatError(f"{where}: specserve cannot run this head: {why}")


def load_head(directory: str | Path, target: PretrainedConfig, embeddings: Callable[[], nn.Embedding],
              dtype: torch.dtype, device: torch.device) -> FedHead:
    """The head in ``directory`` (an EAGLE-3 head, or the MTP module of the model there), checked
    against the ``target`` it will serve; a head without embeddings of its own takes ``embeddings()``
    (the target's)."""
    if is_mtp(directory):
        return load_mtp(directory, target, embeddings, dtype, device)
    config, _ = read_eagle3_config(directory, target)
    where = Path(directory)
    files = sorted(where.glob("*.safetensors"))
    if not files:
        raise HeadFormatError(f"{where}: no .safetensors weights")
    weights = {name: tensor for f in files for name, tensor in load_file(str(f)).items()}
    weights = {name.removeprefix("model."): tensor for name, tensor in weights.items()}  # some writers prefix
    own = "embed_tokens.weight" in weights
    head = Eagle3Head(config, None if own else embeddings())
    expected = {name for name in head.state_dict() if own or not name.startswith("embed_tokens.")}
    missing, unknown = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or unknown:
        raise HeadFormatError(f"{where}: weights do not match the config: missing {missing[:4]}, unexpected "
                              f"{unknown[:4]}")
    for name, tensor in weights.items():
        wanted = head.state_dict()[name].shape
        if tensor.shape != wanted:
            raise HeadFormatError(f"{where}: {name} is {list(tensor.shape)}, the config says {list(wanted)}")
    head.load_state_dict(weights, strict=False)
    return head.to(device=device, dtype=dtype).eval().requires_grad_(False)


def load_head_of(directory: str | Path, target: PreTrainedModel) -> FedHead:
    """The head in ``directory`` for a target loaded in this process (its dtype, device, embeddings)."""
    return load_head(directory, target.config, target.get_input_embeddings, target.dtype, target.device)


def load_heads(heads: dict[str, ModelSpec], target: ModelSpec | None) -> dict[str, FedHead]:
    """Heads for a target loaded elsewhere (a draft worker's): its config is read, its embeddings
    only for a head that has none of its own."""
    if target is None:
        raise HeadFormatError(f"heads {sorted(heads)} need their target's config: none was given")
    config = load_config(target.source)
    embeddings = functools.cache(lambda: load_model(target).get_input_embeddings())
    loaded = {}
    for name, spec in heads.items():
        device = resolve_device(spec.device)
        loaded[name] = load_head(spec.source, config, embeddings, resolve_dtype(spec.dtype, device), device)
    return loaded
