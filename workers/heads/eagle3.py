"""An EAGLE-3 head: one Llama decoder layer that drafts from the target's own hidden states.

Glossary (Li et al., 2025; the layout vLLM and SGLang load)
- aux hidden states: the target's hidden states after three of its layers (a low, a middle and a
  high one; ``aux_layers``, as indices into transformers' ``hidden_states``), concatenated: [T, 3Ht].
- fused feature ``g_i``: ``fc`` of position i's aux hidden states, [T, H].
- step 0 at position i: the layer's input is the next token's embedding and ``g_i``
  (``[norm(embed(x_{i+1})), norm(g_i)]``, 2H wide); its output predicts x_{i+2}.
- later steps (drafting on): position i+1 takes the token just drafted and, in place of a target
  feature, the head's own output before its final norm at position i (``prenorm``).
- draft vocabulary: the head predicts over ``draft_vocab_size`` target tokens only; draft id d is
  target id ``d + d2t[d]``, and ``t2d`` marks the target ids it covers.

The head keeps its own KV cache (``HeadCache``): positions fed by the target stay; the entries of
a proposal's later steps are dropped after the verdict by moving the length back (rollback is
bookkeeping, as for every cache here).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn


@dataclass(frozen=True)
class HeadConfig:
    """The shape of a head and of the target it reads (format.py maps it to and from config.json)."""

    hidden_size: int  # H: the head's width (the target's, in every published head)
    target_hidden_size: int  # Ht: the width of each aux hidden state
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    aux_layers: tuple[int, ...]  # indices into the target's hidden_states (0: its embeddings)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    # The variants published heads use (speculators' keys of the same names):
    norm_before_residual: bool = True  # the residual around attention is the normed feature (else the raw one)
    norm_before_fc: bool = False  # one RMSNorm over the 3Ht aux hidden states before fc (``input_norm``)
    fc_norm: bool = False  # an RMSNorm per aux hidden state before fc (``fc_norm.{0,1,2}``)
    norm_output: bool = False  # the next position's feature is the normed output, not the one before the norm
    AUX_STATES: ClassVar[int] = 3  # the target's hidden states a position's feature is made of
    KIND: ClassVar[str] = "an EAGLE-3 head"

    def __post_init__(self) -> None:
        if len(self.aux_layers) != self.AUX_STATES:
            raise ValueError(f"{self.KIND} reads {self.AUX_STATES} of the target's hidden states, got layers "
                             f"{list(self.aux_layers)}")
        if self.norm_before_fc and self.fc_norm:
            raise ValueError("norm_before_fc and fc_norm are two ways to norm fc's input: set one")
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size must be 1..{self.vocab_size} (the target's vocabulary), got "
                             f"{self.draft_vocab_size}")


def config_for(target, draft_vocab_size: int, aux_layers: tuple[int, ...] | None = None,
               kind: type[HeadConfig] = HeadConfig) -> HeadConfig:
    """A head of the target's own shape (a transformers config of the Llama family); ``kind``: an
    EAGLE-3 head's config or another head's of the same shape (mtp.py's)."""
    t = target.get_text_config()
    heads = t.num_attention_heads
    if aux_layers and (beyond := [layer for layer in aux_layers if not 0 <= layer <= t.num_hidden_layers]):
        raise ValueError(f"aux layers {beyond} do not exist in a target of {t.num_hidden_layers} layers "
                         f"(its hidden_states are 0..{t.num_hidden_layers})")
    return kind(hidden_size=t.hidden_size, target_hidden_size=t.hidden_size,
                      intermediate_size=t.intermediate_size, num_attention_heads=heads,
                      num_key_value_heads=getattr(t, "num_key_value_heads", None) or heads,
                      head_dim=getattr(t, "head_dim", None) or t.hidden_size // heads, vocab_size=t.vocab_size,
                      draft_vocab_size=draft_vocab_size,
                      aux_layers=tuple(aux_layers or default_aux_layers(t.num_hidden_layers)),
                      rms_norm_eps=getattr(t, "rms_norm_eps", 1e-6), rope_theta=rope_theta(t),
                      max_position_embeddings=t.max_position_embeddings)


def rope_theta(config) -> float:
    """transformers 5 keeps it in ``rope_parameters``; older configs at the top level."""
    parameters = getattr(config, "rope_parameters", None) or {}
    return float(parameters.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0)


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """vLLM's choice for a target of ``num_layers`` layers: a low, the middle and a high one."""
    if num_layers < 4:  # a tiny target: its first, middle and last layers' outputs
        return 1, max(1, num_layers // 2), num_layers
    return 2, num_layers // 2, num_layers - 3


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype) * self.weight


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of x [..., T, D] at ``positions`` [T] (Llama's, halves rotated)."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / theta ** (torch.arange(0, half, dtype=torch.float32, device=x.device) / half)
    angles = positions.to(x.device, torch.float32)[:, None] * inv_freq  # [T, D/2]
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(x.dtype), torch.cat([angles.sin()] * 2, -1).to(x.dtype)
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


class HeadCache:
    """One request's keys and values of the head's layer: [kv heads, capacity, head dim] each."""

    def __init__(self, config: HeadConfig, capacity: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = (config.num_key_value_heads, capacity, config.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0  # positions written and standing

    @property
    def capacity(self) -> int:
        return self.keys.shape[1]


class Attention(nn.Module):
    def __init__(self, config: HeadConfig, width: int) -> None:
        super().__init__()
        c = config
        self.config = c
        self.q_proj = nn.Linear(width, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(width, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(width, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [..., T, width] -> queries [..., Hq, T, D], keys and values [..., Hkv, T, D], rotated."""
        c = self.config
        split = lambda t, heads: t.unflatten(-1, (heads, c.head_dim)).transpose(-3, -2)  # noqa: E731
        q = rotate(split(self.q_proj(x), c.num_attention_heads), positions, c.rope_theta)
        k = rotate(split(self.k_proj(x), c.num_key_value_heads), positions, c.rope_theta)
        return q, k, split(self.v_proj(x), c.num_key_value_heads)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: HeadCache) -> torch.Tensor:
        """x [T, width] at ``positions`` (the cache's next T slots); each row attends to every slot
        before it and to itself."""
        return self.o_proj(self.attend(*self.project(x, positions), cache))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: HeadCache) -> torch.Tensor:
        """One session's rows: queries [Hq, T, D], keys and values [Hkv, T, D] written to the
        cache's next T slots -> attended [T, Hq * D] (before o_proj)."""
        start, stop = cache.length, cache.length + q.shape[1]
        if stop > cache.capacity:
            raise ValueError(f"the head's cache holds {cache.capacity} positions; this step needs {stop}")
        cache.keys[:, start:stop], cache.values[:, start:stop] = k, v
        cache.length = stop
        mask = torch.ones(q.shape[1], stop, dtype=torch.bool, device=q.device).tril(start)
        out = nn.functional.scaled_dot_product_attention(q[None], cache.keys[None, :, :stop],
                                                         cache.values[None, :, :stop], attn_mask=mask,
                                                         enable_gqa=True)[0]  # [Hq, T, D]
        return out.transpose(0, 1).flatten(-2)


class Layer(nn.Module):
    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        c = config
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)  # the token's embedding
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)  # the feature
        self.self_attn = Attention(c, 2 * c.hidden_size)  # EAGLE-3's: over the embedding and the feature side by side
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)
        self.norm_before_residual = c.norm_before_residual

    def inputs(self, embeds: torch.Tensor, feature: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention's input [..., 2H] (embedding first, as vLLM concatenates) and the residual."""
        normed = self.hidden_norm(feature)
        residual = normed if self.norm_before_residual else feature
        return torch.cat([self.input_layernorm(embeds), normed], -1), residual

    def finish(self, attended: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        h = attended + residual
        return h + self.mlp(self.post_attention_layernorm(h))


class MLP(nn.Module):
    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class FedHead(nn.Module):
    """A head fed by the target's hidden states (EAGLE-3's; mtp.py's MTP module): one decoder layer
    (``layers.0``) over a token's embedding and a feature of the position before it, with a cache of
    its own, drafting on from its own output. Subclasses make the feature of the target's hidden
    states (``fuse``) and say which target tokens their logits are over."""

    config: HeadConfig
    embed_tokens: nn.Embedding
    layers: nn.ModuleList
    norm: RMSNorm
    lm_head: nn.Linear

    @property
    def layer(self) -> nn.Module:
        return self.layers[0]

    @property
    def weight(self) -> torch.Tensor:
        """A weight of the head: its dtype and device are the head's."""
        return self.lm_head.weight

    def parameters_of_its_own(self) -> int:
        """Its size beside the target: everything but the embeddings (the target's, or a copy)."""
        return sum(p.numel() for name, p in self.named_parameters() if not name.startswith("embed_tokens."))

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """[..., states x Ht] the target's hidden states of a position -> [..., H] its feature."""
        raise NotImplementedError

    def target_ids(self) -> torch.Tensor:
        """[Vd]: the target id of each of its logits' columns (all of them, in order: a head over the
        target's whole vocabulary)."""
        return torch.arange(self.config.draft_vocab_size, device=self.weight.device)

    def to_target(self, logits: torch.Tensor) -> torch.Tensor:
        """Its logits [T, Vd] -> target-vocabulary logits [T, V] in float32: its distribution as the
        verifier must see it."""
        return logits.float()

    def step(self, ids: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
             cache: HeadCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows [T] of tokens with their features [T, H] at ``positions``, appended to ``cache``:
        (logits over the draft vocabulary [T, Vd], the feature the next position takes [T, H])."""
        return self.step_many([(ids, features, positions, cache)])[0]

    def step_many(self, parts: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor, HeadCache]]
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``step`` for several sessions in one pass: their rows share every matrix product, and each
        attends to its own cache only (what a continuous batch of heads runs on a draft worker)."""
        sizes = [len(ids) for ids, _, _, _ in parts]
        ids, features, positions = (torch.cat([part[i] for part in parts]) for i in range(3))
        x, residual = self.layer.inputs(self.embed_tokens(ids), features)
        attention = self.layer.self_attn
        q, k, v = attention.project(x, positions)  # [heads, T, D]: the sessions' rows side by side
        attended, start = [], 0
        for size, (_, _, _, cache) in zip(sizes, parts, strict=True):
            attended.append(attention.attend(q[:, start : start + size], k[:, start : start + size],
                                             v[:, start : start + size], cache))
            start += size
        logits, hidden = self.output(self.layer.finish(attention.o_proj(torch.cat(attended)), residual))
        return list(zip(logits.split(sizes), hidden.split(sizes), strict=True))

    def output(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's output -> (draft-vocabulary logits, the next position's feature)."""
        normed = self.norm(h)
        return self.lm_head(normed), normed if self.config.norm_output else h


class Eagle3Head(FedHead):
    """The head's weights under the speculators format's names (``fc``, ``layers.0.*``, ``norm``,
    ``lm_head``, ``d2t``, ``t2d``, and ``embed_tokens`` when it has embeddings of its own)."""

    def __init__(self, config: HeadConfig, embed_tokens: nn.Embedding | None = None) -> None:
        super().__init__()
        c = config
        self.config = c
        # Without embeddings of its own a head uses the target's (frozen, shared: not saved with it).
        self.own_embeddings = embed_tokens is None
        self.embed_tokens = embed_tokens if embed_tokens is not None else nn.Embedding(c.vocab_size, c.hidden_size)
        if c.norm_before_fc:
            self.input_norm = RMSNorm(len(c.aux_layers) * c.target_hidden_size, c.rms_norm_eps)
        if c.fc_norm:
            self.fc_norm = nn.ModuleList([RMSNorm(c.target_hidden_size, c.rms_norm_eps) for _ in c.aux_layers])
        self.fc = nn.Linear(len(c.aux_layers) * c.target_hidden_size, c.hidden_size, bias=False)
        self.layers = nn.ModuleList([Layer(c)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))

    def set_vocabulary(self, target_ids: torch.Tensor) -> None:
        """The draft vocabulary: the target ids it covers, in draft-id order (ascending, as published)."""
        target_ids = target_ids.to(torch.long).sort().values
        if target_ids.numel() != self.config.draft_vocab_size:
            raise ValueError(f"the draft vocabulary has {target_ids.numel()} tokens, the head "
                             f"{self.config.draft_vocab_size}")
        self.d2t.copy_(target_ids - torch.arange(target_ids.numel(), device=target_ids.device))
        self.t2d.zero_()
        self.t2d[target_ids] = True

    def target_ids(self) -> torch.Tensor:
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """[..., 3Ht] aux hidden states (low, middle, high) -> [..., H] features."""
        aux = aux.to(self.fc.weight.dtype)
        if self.config.norm_before_fc:
            aux = self.input_norm(aux)
        elif self.config.fc_norm:
            aux = torch.cat([norm(part) for norm, part in zip(self.fc_norm, aux.chunk(3, -1), strict=True)], -1)
        return self.fc(aux)

    def to_target(self, logits: torch.Tensor) -> torch.Tensor:
        """-inf outside the draft vocabulary: the head gives those tokens no mass."""
        full = torch.full((logits.shape[0], self.config.vocab_size), -math.inf, dtype=torch.float32,
                          device=logits.device)
        full[:, self.target_ids()] = logits.float()
        return full
