"""Medusa heads (Cai et al., 2024): K small heads on the target's last hidden state, head i guessing
the token i + 2 places ahead of the position it reads (the target's own output guesses the next).

Each head is residual blocks (x + SiLU(W x + b)) and an output layer over the target's vocabulary;
no head reads another's guess, so one row of hidden state gives all K guesses at once, with no
cache and no pass per token. That is what they are for: drafting costs K small matrix products on
the row the verify pass computed anyway (vLLM's format, which this reads and writes:

    config.json          model_type "medusa", architectures ["MedusaModel"], hidden_size,
                         vocab_size, num_heads, num_hidden_layers (residual blocks per head),
                         truncated_vocab_size null (specserve writes and runs the whole vocabulary)
    model.safetensors    blocks.{i}.layers.{j}.weight [H, H] and .bias [H], lm_heads.{i}.weight [V, H]

Training them (``specserve distill --method medusa``: heads on the frozen target, as Medusa-1) is
the training layer's: cluster/zoo/medusa_training.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from .format import CONFIG, WEIGHTS, HeadFormatError

MODEL_TYPE = "medusa"


@dataclass(frozen=True)
class MedusaConfig:
    hidden_size: int
    vocab_size: int
    num_heads: int  # K: head i (0-based) guesses the token i + 2 after the position it reads
    num_layers: int = 1  # residual blocks per head (Medusa's default)

    def __post_init__(self) -> None:
        if self.num_heads < 1 or self.num_layers < 0:
            raise ValueError(f"Medusa heads need num_heads >= 1 and num_hidden_layers >= 0, got {self.num_heads} "
                             f"and {self.num_layers}")


class ResidualBlock(nn.Module):
    def __init__(self, hidden_size: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + nn.functional.silu(layer(x))
        return x


class MedusaHeads(nn.Module):
    def __init__(self, config: MedusaConfig) -> None:
        super().__init__()
        self.config = config
        self.blocks = nn.ModuleList(ResidualBlock(config.hidden_size, config.num_layers)
                                    for _ in range(config.num_heads))
        self.lm_heads = nn.ModuleList(nn.Linear(config.hidden_size, config.vocab_size, bias=False)
                                      for _ in range(config.num_heads))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> every head's logits, [K, ..., V]."""
        return torch.stack([lm_head(block(hidden)) for block, lm_head in zip(self.blocks, self.lm_heads, strict=True)])

    @staticmethod
    def reads_layer(target: PretrainedConfig) -> int:
        """The target's hidden state the heads read: its last (after the final norm, which
        transformers' ``hidden_states`` gives last), an index into ``hidden_states``."""
        return target.get_text_config().num_hidden_layers


def is_medusa(directory: str | Path) -> bool:
    try:
        return json.loads((Path(directory) / CONFIG).read_text()).get("model_type") == MODEL_TYPE
    except (OSError, ValueError, AttributeError):
        return False


def save_medusa(heads: MedusaHeads, directory: str | Path) -> None:
    c = heads.config
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"model_type": MODEL_TYPE, "architectures": ["MedusaModel"], "hidden_size": c.hidden_size,
           "vocab_size": c.vocab_size, "num_heads": c.num_heads, "num_hidden_layers": c.num_layers,
           "truncated_vocab_size": None}
    (out / CONFIG).write_text(json.dumps(doc, indent=2) + "\n")
    save_file({name: tensor.detach().contiguous() for name, tensor in heads.state_dict().items()}, str(out / WEIGHTS))


def read_medusa_config(directory: str | Path, target: PretrainedConfig) -> MedusaConfig:
    """The heads' config, checked against ``target``'s: they read its hidden states and guess over
    its vocabulary (specserve runs the whole of it)."""
    where = Path(directory)
    try:
        doc = json.loads((where / CONFIG).read_text())
        config = MedusaConfig(doc["hidden_size"], doc["vocab_size"], doc["num_heads"], doc.get("num_hidden_layers", 1))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HeadFormatError(f"{where}: not a readable Medusa config ({exc})") from None
    if doc.get("truncated_vocab_size") not in (None, config.vocab_size):
        raise HeadFormatError(f"{where}: a truncated vocabulary ({doc['truncated_vocab_size']} tokens) is not "
                              f"supported; specserve runs Medusa heads over the whole vocabulary")
    t = target.get_text_config()
    if (config.hidden_size, config.vocab_size) != (t.hidden_size, t.vocab_size):
        raise HeadFormatError(f"{where}: these heads are for another target (hidden size {config.hidden_size}, "
                              f"vocabulary {config.vocab_size}); the target has {t.hidden_size} and {t.vocab_size}")
    return config


def load_medusa(directory: str | Path, target: PreTrainedModel) -> MedusaHeads:
    """The heads in ``directory`` for ``target`` (loaded in this process: its dtype and device),
    checked against it."""
    where = Path(directory)
    heads = MedusaHeads(read_medusa_config(where, target.config))
    try:
        weights = {name: tensor for f in sorted(where.glob("*.safetensors")) for name, tensor in load_file(str(f)).items()}
        heads.load_state_dict(weights)
    except (OSError, RuntimeError) as exc:
        raise HeadFormatError(f"{where}: weights do not match the config: {str(exc).splitlines()[0]}") from None
    return heads.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)
