"""Distilling small drafts from a target: the zoo's drafts, and a feature users run on their own data.

A draft is trained to match the target's next-token distribution (forward KL; DistillSpec), on
two kinds of sequences: text the target itself sampled from prompts of the task (on-policy data,
which DistillSpec found to matter) and windows of the task's corpus. The target's distribution is
computed once per sequence and kept sparse (its top ``TOP_LABELS`` tokens, renormalised), because
the target's forward pass is the expensive part and drafts train on the same set for several epochs.

`specserve distill` starts its draft from the target itself by default (``init="target"``): the
target's embeddings, final norm, head and first ``TARGET_INIT_LAYERS`` layers (an early exit of the
target, as LayerSkip drafts are), embeddings and head frozen. On a real model the vocabulary is
most of a small draft (49k tokens x 576 = 28M parameters on SmolLM2-135M): a fresh small draft must
learn it from a few minutes of text, an early exit starts out speaking the target's language.
When it ends it measures what the draft is worth: its greedy acceptance on held-out text of the
task (documents it never trained on) and its cost per token against the target's.
"""

from __future__ import annotations

import copy
import json
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from specserve.workers.loading import ModelSpec, load_model, load_tokenizer
from specserve.workers.vocabulary import DEFAULT_MAX_VOCAB, choose_vocabulary, prune_head, write_vocabulary

from .evaluate import eval_prompts, greedy_acceptance
from .presets import ModelShape, TrainBudget
from .rollout import continue_all
from .training import fit, fixed_length_prompts, new_model, parameter_count, random_windows, token_stream

log = logging.getLogger("specserve.zoo")
TOP_LABELS = 64  # target probabilities kept per position; a small target's mass beyond them is negligible
PROMPT_TOKENS = 24  # prompt length for on-policy samples (BOS + the start of a training document)
LABEL_BATCH = 16  # sequences per target pass when computing labels
ON_POLICY_TEMPERATURE = 1.0  # the target's own distribution: what the draft will be asked to predict
USER_DOCUMENT_CHARS = 2_000  # user corpus files are cut into documents of about this size
USER_ON_POLICY_TOKENS = 96  # `specserve distill`: length of each target sample
USER_ON_POLICY_EVERY = 2_000  # `specserve distill`: one target sample per this many distillation tokens
# An early exit of the target: its first layers (each costs ~1/L of a target step beside the head).
# SmolLM2-135M on Python code (held-out acceptance, cost per token, expected speedup): 2 layers at
# 3e-4, 0.22 / 0.18 / 1.03x; 4 layers at 1e-3, 0.38 / 0.24 / 1.11x (docs/pages/benchmarks.md).
TARGET_INIT_LAYERS = 4
TARGET_INIT_LEARNING_RATE = 1e-3
USER_HELD_OUT_FRACTION = 0.1  # of the corpus documents, never trained on: the held-out acceptance
USER_EVAL_PROMPTS = 16  # held-out prompts, each continued greedily by the target
USER_EVAL_TOKENS = 64  # tokens of each continuation the draft is scored on
STEP_TIMING_RUNS = 20  # one-token forward passes timed per model for the cost ratio


@dataclass(frozen=True)
class DistillSet:
    """Sequences and the target's sparse next-token distribution after every position."""

    tokens: torch.Tensor  # [N, T] int64
    label_ids: torch.Tensor  # [N, T, TOP_LABELS] int32
    label_probs: torch.Tensor  # [N, T, TOP_LABELS] float16, rows sum to 1

    def save(self, path: Path) -> None:
        # safetensors, not pickle: a zoo directory may be shared between machines.
        save_file({"tokens": self.tokens, "label_ids": self.label_ids, "label_probs": self.label_probs}, str(path))

    @classmethod
    def load(cls, path: Path) -> DistillSet:
        t = load_file(str(path))
        return cls(t["tokens"], t["label_ids"], t["label_probs"])

    @classmethod
    def concat(cls, sets: list[DistillSet]) -> DistillSet:
        return cls(*(torch.cat([getattr(s, f) for s in sets]) for f in ("tokens", "label_ids", "label_probs")))


@torch.inference_mode()
def soft_labels(target: PreTrainedModel, sequences: torch.Tensor, desc: str = "labels") -> DistillSet:
    """The target's top-``TOP_LABELS`` distribution after every position of ``sequences`` [N, T]."""
    ids, probs = [], []
    for i in tqdm(range(0, sequences.shape[0], LABEL_BATCH), desc=desc, unit="batch", leave=False, disable=None):
        with torch.autocast(target.device.type, dtype=torch.bfloat16):
            logits = target(input_ids=sequences[i : i + LABEL_BATCH].to(target.device)).logits  # [b, T, V]
        top = torch.softmax(logits.float(), dim=-1).topk(TOP_LABELS, dim=-1)
        ids.append(top.indices.to(torch.int32).cpu())
        probs.append((top.values / top.values.sum(-1, keepdim=True)).half().cpu())
    return DistillSet(sequences, torch.cat(ids), torch.cat(probs))


def build_distill_set(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    documents: list[str],
    *,
    total_tokens: int,
    on_policy_sequences: int,
    on_policy_tokens: int,
    seed: int,
    desc: str = "labels",
) -> DistillSet:
    """About ``total_tokens`` tokens of target samples and corpus windows, labelled by the target."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(documents), generator=generator).tolist()
    prompts = fixed_length_prompts(tokenizer, (documents[i] for i in order), on_policy_sequences, PROMPT_TOKENS)
    sampled = continue_all(target, prompts, on_policy_tokens, ON_POLICY_TEMPERATURE, generator)  # [n, T]
    seq_len = sampled.shape[1]
    corpus_count = max(0, total_tokens // seq_len - sampled.shape[0])
    stream = token_stream(tokenizer, documents)
    corpus = random_windows(stream, corpus_count, seq_len, generator) if corpus_count else sampled[:0]
    return soft_labels(target, torch.cat([sampled, corpus]), desc=desc)


def draft_from_target(target: PreTrainedModel, layers: int = TARGET_INIT_LAYERS) -> PreTrainedModel:
    """An early exit of ``target``: its embeddings, first ``layers`` layers, final norm and head,
    copied; the embeddings and the head frozen (the vocabulary is known, the layers adapt)."""
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = min(layers, target.config.num_hidden_layers)
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[: config.num_hidden_layers]
    draft = type(target)(config)
    missing, unexpected = draft.load_state_dict(target.state_dict(), strict=False)
    if missing:
        raise ValueError(f"cannot start a draft from {type(target).__name__}: no weights for {missing[:3]}")
    for parameter in (draft.get_input_embeddings().weight, draft.get_output_embeddings().weight):
        parameter.requires_grad_(False)
    return draft.float().train()


def distill_draft(draft: PreTrainedModel, data: DistillSet, budget: TrainBudget, seed: int, desc: str) -> float:
    """Train ``draft`` towards the target's distribution in ``data`` (forward KL); return the final loss."""
    generator = torch.Generator().manual_seed(seed)

    def loss_at(step: int) -> torch.Tensor:
        rows = torch.randint(0, data.tokens.shape[0], (budget.batch_size,), generator=generator)
        logits = draft(input_ids=data.tokens[rows]).logits  # [B, T, V]
        log_q = torch.log_softmax(logits.float(), dim=-1).gather(-1, data.label_ids[rows].long())  # [B, T, K]
        # Cross-entropy against the target: forward KL up to the target's (constant) entropy.
        return -(data.label_probs[rows].float() * log_q).sum(-1).mean()

    return fit(draft, budget, loss_at, desc=desc)


def held_out_split(documents: list[str]) -> tuple[list[str], list[str]]:
    """(train, held out): the last USER_HELD_OUT_FRACTION of the documents, at least one, held out
    (none when there is only one document: then the acceptance is measured on training text)."""
    if len(documents) < 2:
        return documents, documents
    held = max(1, round(len(documents) * USER_HELD_OUT_FRACTION))
    return documents[:-held], documents[-held:]


def held_out_acceptance(target: PreTrainedModel, draft: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                        documents: list[str]) -> float:
    """The draft's greedy acceptance on the target's greedy continuations of held-out prompts."""
    prompts = eval_prompts(tokenizer, documents, USER_EVAL_PROMPTS)
    references = continue_all(target, prompts, USER_EVAL_TOKENS, 0.0)
    return greedy_acceptance(draft.eval(), references, tokenizer.eos_token_id)


@torch.inference_mode()
def step_seconds(model: PreTrainedModel, context: int = 64) -> float:
    """The median time of a one-token forward pass after ``context`` cached tokens (decoding)."""
    ids = torch.randint(3, model.config.vocab_size, (1, context + STEP_TIMING_RUNS + 1))
    cache = DynamicCache(config=model.config)
    model(input_ids=ids[:, :context], past_key_values=cache, use_cache=True)
    times = []
    for i in range(context, context + STEP_TIMING_RUNS):
        started = time.perf_counter()
        model(input_ids=ids[:, i : i + 1], past_key_values=cache, use_cache=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def default_draft_shape(target_config) -> ModelShape:
    """A draft about a quarter of the target's width, two layers: small enough to cost c < 0.1."""
    hidden = max(64, (target_config.hidden_size // 4) // 32 * 32)
    return ModelShape(hidden, 2, hidden * 8 // 3 // 32 * 32, max(2, hidden // 64), tie_embeddings=True)


def documents_from_files(paths: list[str]) -> list[str]:
    """User corpus files (UTF-8 text) as documents of about USER_DOCUMENT_CHARS, cut at line ends."""
    documents: list[str] = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read corpus file {path}: {exc}") from exc
        current = ""
        for line in text.splitlines(keepends=True):
            current += line
            if len(current) >= USER_DOCUMENT_CHARS:
                documents.append(current)
                current = ""
        if current.strip():
            documents.append(current)
    if not documents:
        raise ValueError("the corpus files hold no text")
    return documents


def distill_to_directory(
    target_dir: str,
    task: str,
    corpus_files: list[str],
    out_dir: str,
    *,
    budget: TrainBudget,
    distill_tokens: int,
    seed: int,
    shape: ModelShape | None = None,
    init: str = "target",
    draft_vocab: int | None = None,
    keep_reduced: Callable[[dict, dict], bool] | None = None,
) -> dict:
    """`specserve distill`: a draft for ``task`` from a target (a directory or GGUF file) and the
    user's text; ``init``: "target" (an early exit of the target) or "fresh" (a small new model of
    ``shape``, by default ``default_draft_shape``).

    Writes an ordinary Hugging Face model directory (with the target's tokenizer, so the draft passes
    the tokenizer check) and returns the facts also written to its ``specserve_draft.json``, among
    them its held-out acceptance and its cost per token over the target's.

    A reduced vocabulary (FR-Spec, workers/vocabulary.py): a target with a vocabulary above
    DEFAULT_MAX_VOCAB, or ``draft_vocab`` tokens, gets the trained draft measured twice, with its
    whole head and with the head cut to the most frequent tokens of its training text; the cut is
    kept (``specserve_vocab.json``) when ``draft_vocab`` asked for it, or when ``keep_reduced(whole,
    reduced)`` prefers its measurement (the caller prices them: the cost model is the router's).
    """
    if init not in ("target", "fresh"):
        raise ValueError(f"init must be target or fresh, got {init!r}")
    tokenizer = load_tokenizer(target_dir)
    target = load_model(ModelSpec(target_dir))
    if draft_vocab is not None and not 0 < draft_vocab <= target.config.vocab_size:
        raise ValueError(f"the draft vocabulary must be 1..{target.config.vocab_size} tokens (the target's), "
                         f"got {draft_vocab}")
    train, held_out = held_out_split(documents_from_files(corpus_files))
    log.info("distill %s: %d documents to train on, %d held out; the target labels ~%d tokens", task, len(train),
             len(held_out) if held_out is not train else 0, distill_tokens)
    data = build_distill_set(
        target, tokenizer, train, total_tokens=distill_tokens,
        on_policy_sequences=max(1, distill_tokens // USER_ON_POLICY_EVERY), on_policy_tokens=USER_ON_POLICY_TOKENS, seed=seed,
    )
    if init == "target":
        torch.manual_seed(seed)
        draft = draft_from_target(target)
        budget = replace(budget, learning_rate=min(budget.learning_rate, TARGET_INIT_LEARNING_RATE))
    else:
        draft = new_model(shape or default_draft_shape(target.config), tokenizer, target.config.max_position_embeddings,
                          seed, vocab_size=target.config.vocab_size)
    log.info("distill %s: training a %s draft of %.1fM parameters for %d steps", task,
             "target-initialised" if init == "target" else "fresh", parameter_count(draft) / 1e6, budget.steps)
    loss = distill_draft(draft, data, budget, seed, desc=f"draft {task}")
    out = Path(out_dir)
    draft.save_pretrained(out)
    tokenizer.save_pretrained(out)
    log.info("distill %s: measuring held-out acceptance and the cost per token", task)
    target_seconds = step_seconds(target)
    measured = {"vocab_size": target.config.vocab_size, **_measure(target, draft, tokenizer, held_out, target_seconds)}
    facts = {"task": task, "target": str(target_dir), "init": init, "parameters": parameter_count(draft),
             "distill_tokens": int(data.tokens.numel()), "final_loss": loss, "seed": seed,
             "held_out_documents": len(held_out) if held_out is not train else 0, **measured}
    if draft_vocab is not None or target.config.vocab_size > DEFAULT_MAX_VOCAB:
        ids, coverage = choose_vocabulary(data.tokens, target.config.vocab_size, draft_vocab)
        log.info("distill %s: measuring it again with its head cut to %d tokens (%.1f%% of its training text)",
                 task, len(ids), 100 * coverage)
        reduced = {"vocab_size": len(ids), "vocabulary_coverage": round(coverage, 4),
                   **_measure(target, prune_head(draft, ids), tokenizer, held_out, target_seconds)}
        facts["measured"] = [measured, reduced]
        if draft_vocab is not None or (keep_reduced is not None and keep_reduced(measured, reduced)):
            write_vocabulary(out, ids, coverage)
            facts |= reduced
    (out / "specserve_draft.json").write_text(json.dumps(facts, indent=2))
    return facts


def _measure(target: PreTrainedModel, draft: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
             held_out: list[str], target_seconds: float) -> dict:
    return {"held_out_alpha": round(held_out_acceptance(target, draft, tokenizer, held_out), 4),
            "cost_ratio": round(step_seconds(draft) / target_seconds, 4)}
