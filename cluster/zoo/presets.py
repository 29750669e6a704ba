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

from specserve.workers.request import GENERAL_TASK

from .corpora import TASKS

GENERAL_DRAFT = GENERAL_TASK  # the draft distilled on every task's data, the fallback for unknown tasks


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
