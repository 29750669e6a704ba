"""Multi-token prediction (MTP) modules: the heads some models are trained with to predict the token
after next (DeepSeek-V3, GLM-4.5, Qwen3-Next), drafting for the model that carries them.

At position i the module reads the model's final hidden state h_i (after its final norm, as vLLM
feeds it) and the embedding of the token after it:

    x   = eh_proj([enorm(embed(x_{i+1})), hnorm(h_i)])      2H -> H
    h'  = a decoder layer over x (its own KV cache)
    x_{i+2} ~ softmax(head(norm(h')))                       the model's output head, shared

and drafts on recurrently, h' standing in for the model's hidden state at the next position (vLLM
runs one module so for every drafted token). That is a head fed by the target like EAGLE-3's
(eagle3.py's ``FedHead``) with one hidden state for three and a plain decoder layer for EAGLE-3's
2H-wide one: it serves through the same path (proposer.py; on a draft worker or in process).

The layout is DeepSeek-V3's (GLM-4.5's too), read from the checkpoint's own keys (every
.safetensors file of its directory; L is the model's num_hidden_layers): config.json's
``num_nextn_predict_layers`` >= 1 and keys model.layers.{L}.{enorm, hnorm, eh_proj, input_layernorm,
self_attn.*, post_attention_layernorm, mlp.*, shared_head.norm, shared_head.head, embed_tokens};
an embedding or output head the module's keys lack is the model's (model.embed_tokens, lm_head, or
the embeddings where they are tied). With several modules the first drafts every token. Only
Llama-shaped layers run here (dense, no biases, the default rope, no q/k norms): DeepSeek-V3's own
(MLA, mixture-of-experts) are refused in one line that says so, and so is Qwen3-Next's module
(``mtp_num_hidden_layers``: gated attention, (1 + w) norms, its normed output fed on), which is
recognised, not built. ``specserve distill --method mtp`` writes a model that carries one
(cluster/zoo/head_distill.py).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from transformers import PretrainedConfig

from ..loading import ModelLoadError, load_config
from .checkpoint import CONFIG, FACTS, LAYER_TYPES, HeadFormatError, read_json, rope_type
from .eagle3 import MLP, Attention, FedHead, HeadConfig, RMSNorm, config_for

MTP = "mtp"  # the draft a model that carries a module serves as (cluster/models.py adds it)
MTP_WEIGHTS = "mtp.safetensors"  # what specserve writes beside a model's own weights
DEEPSEEK = "num_nextn_predict_layers"  # config.json's count of modules in DeepSeek-V3's layout (the one run here)
QWEN3_NEXT = "mtp_num_hidden_layers"  # Qwen3-Next's: recognised, refused


class MtpConfig(HeadConfig):
    """An MTP module's shape: the model's own, reading one hidden state (its last: ``aux_layers`` =
    (L,)) and predicting over its whole vocabulary."""

    AUX_STATES: ClassVar[int] = 1
    KIND: ClassVar[str] = "an MTP module"


class MtpLayer(nn.Module):
    """The module's projection of (embedding, hidden state) and its decoder layer."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        c = config
        self.enorm = RMSNorm(c.hidden_size, c.rms_norm_eps)  # the token's embedding
        self.hnorm = RMSNorm(c.hidden_size, c.rms_norm_eps)  # the hidden state
        self.eh_proj = nn.Linear(2 * c.hidden_size, c.hidden_size, bias=False)  # embedding first, as published
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c, c.hidden_size)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def inputs(self, embeds: torch.Tensor, feature: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention's input [..., H] and the residual (the projection, before the layer's norm)."""
        x = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(feature)], -1))
        return self.input_layernorm(x), x

    def finish(self, attended: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        h = attended + residual
        return h + self.mlp(self.post_attention_layernorm(h))


class MtpModule(FedHead):
    """The module under specserve's names (``embed_tokens``, ``layers.0.*``, ``norm``, ``lm_head``);
    ``checkpoint_key`` maps them to DeepSeek-V3's keys."""

    def __init__(self, config: MtpConfig, embed_tokens: nn.Embedding | None = None) -> None:
        super().__init__()
        c = config
        self.config = c
        self.embed_tokens = embed_tokens if embed_tokens is not None else nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([MtpLayer(c)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """The model's last hidden state is the feature itself (hnorm, in the layer, norms it)."""
        return aux.to(self.weight.dtype)


def mtp_config_for(target: PretrainedConfig) -> MtpConfig:
    """A module of ``target``'s own shape (a transformers config of the Llama family)."""
    t = target.get_text_config()
    return config_for(target, t.vocab_size, (t.num_hidden_layers,), kind=MtpConfig)


def _text(doc: dict) -> dict:
    return doc.get("text_config") or doc


def carries(doc: dict) -> str | None:
    """The key by which a model's config.json says it carries a module (DEEPSEEK, QWEN3_NEXT), or None."""
    text = _text(doc)
    return next((key for key in (DEEPSEEK, QWEN3_NEXT) if (text.get(key) or 0) >= 1), None)


def is_mtp(directory: str | Path) -> bool:
    """Whether ``directory`` holds a model that carries an MTP module."""
    try:
        return carries(json.loads((Path(directory) / CONFIG).read_text())) is not None
    except (OSError, ValueError, AttributeError, TypeError):
        return False


def read_mtp_config(directory: str | Path, target: PretrainedConfig | None = None) -> MtpConfig:
    """The module's shape, from its model's config.json, checked against ``target`` (the model it
    will draft for: the one that carries it, or the same model served from elsewhere)."""
    where = Path(directory)
    doc = _text(read_json(where / CONFIG))
    if carries(doc) is None:
        raise HeadFormatError(f"{where}: its config.json names no MTP module ({DEEPSEEK} >= 1)")
    model_type = doc.get("model_type", "llama")
    checks = [
        (carries(doc) == DEEPSEEK, f"its module is Qwen3-Next's ({QWEN3_NEXT}: gated attention, (1 + w) norms); "
                                   f"specserve runs modules in DeepSeek-V3's layout with Llama-shaped layers"),
        (model_type in LAYER_TYPES, f"its layers are {model_type!r}'s; specserve runs MTP modules of Llama-shaped "
                                    f"layers ({', '.join(LAYER_TYPES)})"),
        (not doc.get("attention_bias") and not doc.get("mlp_bias"), "its layers have biases"),
        (rope_type(doc) == "default", f"its rope is {rope_type(doc)!r}; specserve runs the default rope"),
        (doc.get("hidden_act", "silu") == "silu", f"its activation is {doc.get('hidden_act')!r}, not silu"),
    ]
    for ok, why in checks:
        if not ok:
            raise HeadFormatError(f"{where}: specserve cannot run this model's MTP module: {why}")
    try:
        config = mtp_config_for(load_config(str(where)))
    except (KeyError, TypeError, ValueError, AttributeError, ModelLoadError) as exc:
        raise HeadFormatError(f"{where}: {CONFIG} does not give an MTP module's shape: {exc}") from None
    if target is not None:
        t = target.get_text_config()
        own = (config.hidden_size, config.vocab_size, config.aux_layers[0])
        if own != (t.hidden_size, t.vocab_size, t.num_hidden_layers):
            raise HeadFormatError(f"{where}: this MTP module is for another model (hidden size {own[0]}, vocabulary "
                                  f"{own[1]}, {own[2]} layers); the target has {t.hidden_size}, {t.vocab_size} and "
                                  f"{t.num_hidden_layers}")
    return config


def checkpoint_key(name: str, layers: int) -> str:
    """Where the module's weight ``name`` lies in a checkpoint of DeepSeek-V3's layout."""
    prefixes = {"layers.0.": f"model.layers.{layers}.", "norm.": f"model.layers.{layers}.shared_head.norm.",
                "lm_head.": f"model.layers.{layers}.shared_head.head.",
                "embed_tokens.": f"model.layers.{layers}.embed_tokens."}
    prefix = next(prefix for prefix in prefixes if name.startswith(prefix))
    return prefixes[prefix] + name.removeprefix(prefix)


MODEL_KEYS = {"embed_tokens.weight": "model.embed_tokens.weight", "lm_head.weight": "lm_head.weight"}


class _Checkpoint:
    """The tensors of a directory's .safetensors files by key, each read only when asked for."""

    def __init__(self, where: Path) -> None:
        self.files: dict[str, Path] = {}
        for path in sorted(where.glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    if key in self.files:  # which would load is a matter of file names: say so instead
                        raise HeadFormatError(f"{where}: {key} is in both {self.files[key].name} and {path.name}")
                    self.files[key] = path

    def __contains__(self, key: str) -> bool:
        return key in self.files

    def get(self, key: str) -> torch.Tensor:
        with safe_open(str(self.files[key]), framework="pt") as f:
            return f.get_tensor(key)


def load_mtp(directory: str | Path, target: PretrainedConfig, embeddings: Callable[[], nn.Embedding],
             dtype: torch.dtype, device: torch.device) -> MtpModule:
    """The MTP module of the model in ``directory``, checked against ``target``; the target's own
    ``embeddings()`` only where the checkpoint holds none."""
    where = Path(directory)
    config = read_mtp_config(where, target)
    doc = _text(read_json(where / CONFIG))
    layers = config.aux_layers[0]
    checkpoint = _Checkpoint(where)
    module = MtpModule(config)
    wanted = module.state_dict()
    used = {checkpoint_key(name, layers) for name in wanted}
    own = f"model.layers.{layers}."  # further modules (layers L+1, ...) are not read: the first drafts
    foreign = sorted(key for key in checkpoint.files if key.startswith(own) and key not in used)
    if foreign:
        raise HeadFormatError(f"{where}: specserve cannot run this model's MTP module: its layer holds "
                              f"{foreign[:3]}, which a Llama-shaped layer does not")
    weights, missing = {}, []
    for name, slot in wanted.items():
        key = checkpoint_key(name, layers)
        if key not in checkpoint:
            key = MODEL_KEYS.get(name)
            if name == "lm_head.weight" and key not in checkpoint and doc.get("tie_word_embeddings"):
                key = MODEL_KEYS["embed_tokens.weight"]
        if key in checkpoint:
            weights[name] = checkpoint.get(key)
        elif name == "embed_tokens.weight":
            weights[name] = embeddings().weight.detach()
        else:
            missing.append(checkpoint_key(name, layers))
            continue
        if weights[name].shape != slot.shape:
            raise HeadFormatError(f"{where}: {key} is {list(weights[name].shape)}, the module's config says "
                                  f"{list(slot.shape)}")
    if missing:
        raise HeadFormatError(f"{where}: the MTP module's weights are missing from its checkpoint: {missing[:4]}")
    module.load_state_dict(weights)
    return module.to(device=device, dtype=dtype).eval().requires_grad_(False)


def save_mtp(module: MtpModule, model_dir: str | Path, out_dir: str | Path) -> None:
    """Write the model in ``model_dir`` carrying ``module`` into ``out_dir`` (DeepSeek-V3's layout):
    its files as they are (hard links where the file system allows), its config.json with
    ``num_nextn_predict_layers`` 1, the module's weights in a file of their own, which transformers
    does not load with the model (its weights file or index names its own)."""
    source, out = Path(model_dir), Path(out_dir)
    if out.resolve() == source.resolve():
        raise ValueError(f"{out} is the model's own directory: write the model carrying its module elsewhere")
    out.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.name not in (CONFIG, MTP_WEIGHTS, FACTS):
            _link_or_copy(path, out / path.name)
    doc = read_json(source / CONFIG)
    if "text_config" in doc:  # where carries() reads it
        doc["text_config"] = doc["text_config"] | {DEEPSEEK: 1}
    else:
        doc[DEEPSEEK] = 1
    (out / CONFIG).write_text(json.dumps(doc, indent=2) + "\n")
    layers = module.config.aux_layers[0]
    weights = {checkpoint_key(name, layers): tensor.detach().contiguous() for name, tensor in module.state_dict().items()}
    save_file(weights, str(out / MTP_WEIGHTS))


def _link_or_copy(source: Path, destination: Path) -> None:
    destination.unlink(missing_ok=True)
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)
