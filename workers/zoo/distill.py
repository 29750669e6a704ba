"""Distilling small drafts from a target: the zoo's drafts, and a feature users run on their own data.

A draft is trained to match the target's next-token distribution (forward KL; DistillSpec), on
two kinds of sequences: text the target itself sampled from prompts of the task (on-policy data,
which DistillSpec found to matter) and windows of the task's corpus. The target's distribution is
computed once per sequence and kept sparse (its top ``TOP_LABELS`` tokens, renormalised), because
the target's forward pass is the expensive part and drafts train on the same set for several epochs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm
from transformers import LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from ..loading import ModelSpec, load_model, load_tokenizer
from .presets import ModelShape, TrainBudget
from .rollout import continue_all
from .training import fit, fixed_length_prompts, new_model, parameter_count, random_windows, token_stream

TOP_LABELS = 64  # target probabilities kept per position; a small target's mass beyond them is negligible
PROMPT_TOKENS = 24  # prompt length for on-policy samples (BOS + the start of a training document)
LABEL_BATCH = 16  # sequences per target pass when computing labels
ON_POLICY_TEMPERATURE = 1.0  # the target's own distribution: what the draft will be asked to predict
USER_DOCUMENT_CHARS = 2_000  # user corpus files are cut into documents of about this size
USER_ON_POLICY_TOKENS = 96  # `specserve distill`: length of each target sample
USER_ON_POLICY_EVERY = 2_000  # `specserve distill`: one target sample per this many distillation tokens
USER_DISTILL_TOKENS = 100_000  # `specserve distill`: tokens the target labels (--tokens)
USER_DRAFT_BUDGET = TrainBudget(steps=300, batch_size=16, learning_rate=3e-3)  # like the zoo's drafts


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
) -> dict:
    """`specserve distill`: a draft for ``task`` from a target directory and the user's text.

    Writes an ordinary Hugging Face model directory (with the target's tokenizer, so the draft passes
    the tokenizer check) and returns the facts also written to its ``specserve_draft.json``.
    """
    tokenizer = load_tokenizer(target_dir)
    target = load_model(ModelSpec(target_dir))
    documents = documents_from_files(corpus_files)
    data = build_distill_set(
        target, tokenizer, documents, total_tokens=distill_tokens,
        on_policy_sequences=max(1, distill_tokens // USER_ON_POLICY_EVERY), on_policy_tokens=USER_ON_POLICY_TOKENS, seed=seed,
    )
    shape = shape or default_draft_shape(target.config)
    draft: LlamaForCausalLM = new_model(shape, tokenizer, target.config.max_position_embeddings, seed,
                                        vocab_size=target.config.vocab_size)
    loss = distill_draft(draft, data, budget, seed, desc=f"draft {task}")
    out = Path(out_dir)
    draft.save_pretrained(out)
    tokenizer.save_pretrained(out)
    facts = {"task": task, "target": str(target_dir), "parameters": parameter_count(draft),
             "distill_tokens": int(data.tokens.numel()), "final_loss": loss, "seed": seed}
    (out / "specserve_draft.json").write_text(json.dumps(facts, indent=2))
    return facts
