"""Zoo presets: how big each model is and how long each build stage trains.

Budgets are counted in optimiser steps, not seconds, so a build is deterministic for its seed. The
step counts were sized from training throughput measured on the 2-core development machine (bf16
autocast: ~4,600 tokens/s for the 8.7M demo target, ~1,360 tokens/s for the 30M bench target), so
that `demo` builds in about 6 minutes with its EAGLE-3 head (the target's 340 steps are half of it:
see docs/pages/zoo.md) and `bench` in about 45.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .corpora import TASKS
from .zoo import GENERAL_DRAFT


@dataclass(frozen=True)
class ModelShape:
    """A Llama-architecture model's size."""

    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    tie_embeddings: bool  # drafts tie them: at 1-2M parameters the embedding is most of the model


@dataclass(frozen=True)
class TrainBudget:
    steps: int
    batch_size: int
    learning_rate: float


@dataclass(frozen=True)
class ZooPreset:
    name: str
    vocab_size: int
    context_window: int  # max_position_embeddings of every model in the zoo
    seq_len: int  # training window
    chars_per_task: int  # corpus size per task, before the held-out split
    target: ModelShape
    draft: ModelShape
    target_budget: TrainBudget
    draft_budget: TrainBudget  # per draft, the general one included
    # Per task, the target's distribution is computed once over this many tokens (its samples plus
    # corpus text) and drafts train on it for several epochs: the target pass is the costly part.
    distill_tokens: int
    on_policy_sequences: int  # per task: target samples among those tokens (DistillSpec: on-policy data matters)
    on_policy_tokens: int  # length of each such sample
    eval_prompts: int  # held-out prompts per task for the acceptance matrix
    eval_tokens: int  # greedy continuation length scored for acceptance
    seed: int = 0
    # Task drafts start from the general draft's weights and spend their budget specializing on
    # their task: trained from scratch on one task's data, the demo's code and prose drafts lost to
    # the general one on their own tasks (held-out alpha 0.22 vs 0.18 and 0.35 vs 0.39); specialized,
    # 0.57 each with the same steps.
    specialize_general: bool = True

    @property
    def draft_names(self) -> tuple[str, ...]:
        return (*TASKS, GENERAL_DRAFT)


PRESETS: dict[str, ZooPreset] = {
    # Seconds: for the test suite, so training and distillation run in CI. Quality is irrelevant.
    "tiny": ZooPreset(
        name="tiny",
        vocab_size=384,
        context_window=256,
        seq_len=64,
        chars_per_task=120_000,
        target=ModelShape(64, 2, 128, 2, tie_embeddings=False),
        draft=ModelShape(32, 1, 64, 2, tie_embeddings=True),
        target_budget=TrainBudget(steps=40, batch_size=8, learning_rate=3e-3),
        draft_budget=TrainBudget(steps=15, batch_size=8, learning_rate=3e-3),
        distill_tokens=4_000,
        on_policy_sequences=8,
        on_policy_tokens=32,
        eval_prompts=3,
        eval_tokens=16,
        # Task drafts from scratch: 15 steps leave them near-useless (alpha ~0 on their tasks), so the
        # service's routing tests have drafts of clearly different quality to route between.
        specialize_general=False,
    ),
    # ~5 minutes: what `make demo` builds on a fresh machine.
    "demo": ZooPreset(
        name="demo",
        vocab_size=2048,
        context_window=512,
        seq_len=256,
        chars_per_task=3_000_000,
        target=ModelShape(384, 4, 1024, 6, tie_embeddings=False),  # 8.7M parameters
        draft=ModelShape(128, 2, 352, 2, tie_embeddings=True),  # 0.6M parameters
        target_budget=TrainBudget(steps=340, batch_size=8, learning_rate=2e-3),
        draft_budget=TrainBudget(steps=100, batch_size=16, learning_rate=3e-3),
        distill_tokens=48_000,
        on_policy_sequences=32,
        on_policy_tokens=96,
        eval_prompts=12,
        eval_tokens=64,
    ),
    # ~45 minutes: a realistic cost ratio (c ~ 0.05-0.08) for the benchmarks.
    "bench": ZooPreset(
        name="bench",
        vocab_size=4096,
        context_window=1024,
        seq_len=256,
        chars_per_task=12_000_000,
        target=ModelShape(512, 8, 1376, 8, tie_embeddings=False),  # 29.5M parameters
        draft=ModelShape(192, 2, 512, 3, tie_embeddings=True),  # 1.7M parameters
        target_budget=TrainBudget(steps=1100, batch_size=8, learning_rate=1.5e-3),
        draft_budget=TrainBudget(steps=250, batch_size=16, learning_rate=3e-3),
        distill_tokens=200_000,
        on_policy_sequences=128,
        on_policy_tokens=128,
        eval_prompts=24,
        eval_tokens=96,
    ),
}


def stage_seed(seed: int, stage: str) -> int:
    """An independent, reproducible seed per build stage, so adding a stage never shifts another's draws."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{stage}".encode()).digest()[:4], "little")


def get_preset(name: str) -> ZooPreset:
    if name not in PRESETS:
        raise ValueError(f"unknown zoo preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return PRESETS[name]


@dataclass(frozen=True)
class HeadTraining:
    """How a head is distilled (``specserve distill --method eagle3``)."""

    draft_vocab_size: int | None = None  # None: by coverage of the corpus (workers/vocabulary.py)
    aux_layers: tuple[int, ...] | None = None  # None: vLLM's (2, L/2, L-3)
    ttt_steps: int = 3  # speculators' default: the head learns to draft on its own outputs this far
    sequence_tokens: int = 256
    train_tokens: int = 100_000  # target features computed for this many tokens
    # Of the training sequences, the target's own continuations: the corpus alone teaches the head
    # text, not what the target writes. Tiny zoo, sql, 100 steps: corpus windows alone gave alpha
    # 0.51 on held-out prompts (0.98, 0.03, 0.00 by position: the target's greedy output repeats);
    # half its own continuations, 0.99 (0.97, 1.00, 1.00).
    on_policy_share: float = 0.5
    # Of those, with a chat template: the target answering instructions about the corpus in it (a
    # chat-served target writes answers after its template, not continuations of raw text).
    chat_share: float = 0.5
    # 2,000 steps of 4 sequences: 20 passes over the default text. SmolLM2 (2 cores): 13 min of
    # training in a 22-minute distill, held-out alpha 0.55 and 1.91 tokens a pass; 500 steps gave
    # 0.44 and 1.70 (its loss still falling: 3.8 then, 1.05 at 2,000).
    budget: TrainBudget = TrainBudget(steps=2000, batch_size=4, learning_rate=1e-3)
    feature_dtype: str = "bfloat16"  # stored features (workers/loading.py DTYPES): half the memory of float32
    seed: int = 0


@dataclass(frozen=True)
class MedusaTraining:
    """How Medusa heads are distilled (``specserve distill --method medusa``). The text's fields
    mean what HeadTraining's do (training_sequences reads them)."""

    num_heads: int = 3  # guesses per proposal: the tokens 2..num_heads+1 ahead
    num_layers: int = 1  # residual blocks per head
    decay: float = 0.8  # head i's loss weight: decay ** i
    sequence_tokens: int = 256
    train_tokens: int = 100_000
    on_policy_share: float = 0.5
    chat_share: float = 0.5
    budget: TrainBudget = TrainBudget(steps=1000, batch_size=4, learning_rate=1e-3)
    feature_dtype: str = "bfloat16"
    seed: int = 0
