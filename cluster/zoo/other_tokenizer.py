"""A draft of another tokenizer for a zoo's target: what the cross-tokenizer path is tested and
measured with (workers/token_bridge.py).

Its tokenizer is a byte-level BPE half as large again as the target's, trained on another slice
of the zoo's corpora, its special tokens in another order: every id means another token than the
target's, the short tokens are the target's too (the bytes, the frequent merges), and its longer
merges are not, as between two model families. Logit distillation needs one vocabulary, so the
draft learns the target by its text (sequence-level distillation, Kim & Rush 2016): the target's
greedy continuations of training prompts, decoded and encoded with the draft's own tokenizer,
beside the corpus text itself. ``train_text_draft`` is the recipe for any target (the real-model
bench trains one for SmolLM2 with it, and the same recipe in the target's own tokenizer beside it).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from .presets import ModelShape, TrainBudget
from .rollout import continue_all
from .tokenizer import BOS, EOS, PAD, train_tokenizer
from .training import fit, fixed_length_prompts, new_model, random_windows, token_stream
from .zoo import Zoo

log = logging.getLogger("specserve.zoo")

OTHER_TOKENIZER = "othertok"  # the draft's name (the demo's and the bench's rows)
FACTS = "specserve_other_tokenizer.json"  # what it was built from, and its held-out greedy alpha
VOCAB_FRACTION = 1.5  # its vocabulary against the target's
MIN_STEPS = 300
PROMPT_TOKENS = 16  # of each training prompt the target continues
CORPUS_CHARS = 200_000  # of each task's training text, for the tokenizer and beside the rollouts


def other_tokenizer_dir(zoo: Zoo) -> Path:
    return zoo.root.parent / f"{zoo.root.name}-other-tokenizer"


def read_other_facts(directory: Path) -> dict:
    """What ``ensure_other_tokenizer_draft`` wrote of the draft in ``directory`` ({} for another's)."""
    try:
        return json.loads((Path(directory) / FACTS).read_text())
    except (OSError, ValueError):
        return {}


@dataclass(frozen=True)
class TextDraft:
    """How a draft is taught a target by its text (sequence-level distillation)."""

    shape: ModelShape
    budget: TrainBudget
    context_window: int
    seq_len: int  # training window
    vocab_size: int | None  # its own byte-level BPE of this many tokens; None: the target's tokenizer
    rollouts: int = 64  # the target's greedy continuations of as many prompts from the documents
    new_tokens: int = 48  # each
    seed: int = 0


def train_text_draft(target: PreTrainedModel, target_tokenizer: PreTrainedTokenizerBase, documents: list[str],
                     recipe: TextDraft, out: Path) -> dict:
    """Train a draft on the target's greedy continuations of prompts from ``documents`` and on the
    documents themselves, in its own tokenizer (``recipe.vocab_size``: trained on the documents, its
    special tokens in another order than the zoo's) or the target's, and write it (weights and
    tokenizer) to ``out``; what it was built from, to go into its facts."""
    if recipe.vocab_size is None:
        tokenizer = target_tokenizer
    else:
        tokenizer = train_tokenizer(documents[::-1], recipe.vocab_size, specials=(PAD, EOS, BOS))
    texts = _target_texts(target, target_tokenizer, documents, recipe.rollouts, recipe.new_tokens)
    stream = token_stream(tokenizer, texts + documents)
    model = new_model(recipe.shape, tokenizer, recipe.context_window, recipe.seed,
                      vocab_size=None if recipe.vocab_size else int(target.config.vocab_size))
    generator = torch.Generator().manual_seed(recipe.seed)
    seq_len = min(recipe.seq_len, stream.numel() // 2)
    budget = recipe.budget
    loss = fit(model, budget, lambda step: _loss(model, stream, budget.batch_size, seq_len, generator),
               desc="draft (text)")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"vocab_size": len(tokenizer), "own_tokenizer": recipe.vocab_size is not None, "loss": round(loss, 3),
            "rollouts": recipe.rollouts, "new_tokens": recipe.new_tokens, "steps": budget.steps,
            "training_tokens": int(stream.numel())}


def ensure_other_tokenizer_draft(zoo: Zoo, out: Path | None = None) -> Path:
    """The directory of a draft of another tokenizer for ``zoo``'s target, built there if missing
    (seconds on the tiny zoo, minutes on the demo zoo's): its weights, its tokenizer, and what it
    was built from."""
    out = Path(out or other_tokenizer_dir(zoo))
    if (out / FACTS).exists():
        return out
    config = zoo.manifest["config"]
    steps = max(MIN_STEPS, 3 * config["draft_budget"]["steps"])  # text alone teaches less than the target's logits
    recipe = TextDraft(ModelShape(**config["draft"]), TrainBudget(**{**config["draft_budget"], "steps": steps}),
                       config["context_window"], config["seq_len"], int(config["vocab_size"] * VOCAB_FRACTION))
    documents = [doc for task in zoo.tasks for doc in first_chars(zoo.corpus(task).train, CORPUS_CHARS)]
    target = AutoModelForCausalLM.from_pretrained(zoo.target_dir).eval()
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    facts = train_text_draft(target, PreTrainedTokenizerFast.from_pretrained(zoo.root / "tokenizer"), documents,
                             recipe, tmp)
    alpha = _held_out_alpha(zoo, tmp)
    (tmp / FACTS).write_text(json.dumps({"zoo": str(zoo.root), **facts, "held_out_alpha": round(alpha, 3)}))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    log.info("draft %s: vocabulary %d (the target's %d), loss %.3f, held-out greedy alpha %.3f: %s",
             OTHER_TOKENIZER, facts["vocab_size"], config["vocab_size"], facts["loss"], alpha, out)
    return out


def first_chars(documents: Iterable[str], chars: int) -> list[str]:
    """The first documents, until they hold ``chars`` characters (the one that reaches it kept whole)."""
    kept, held = [], 0
    for doc in documents:
        if held >= chars:
            break
        kept.append(doc)
        held += len(doc)
    return kept


def _target_texts(target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, documents: list[str], rollouts: int,
                  new_tokens: int) -> list[str]:
    """The target's greedy continuations of ``rollouts`` prompts from ``documents``, as text."""
    step = max(1, len(documents) // rollouts)
    prompts = fixed_length_prompts(tokenizer, documents[::step], rollouts, PROMPT_TOKENS)
    rows = continue_all(target, prompts, new_tokens, 0.0)
    return [tokenizer.decode(row, skip_special_tokens=True) for row in rows.tolist()]


def _held_out_alpha(zoo: Zoo, draft: Path, prompts: int = 2, max_tokens: int = 32, k: int = 4) -> float:
    """Greedy acceptance through the bridge on held-out prompts of every task (accepted / proposed)."""
    from specserve.workers.engine import SpecEngine
    from specserve.workers.loading import ModelSpec
    from specserve.workers.request import GenerationParams

    engine = SpecEngine.load(ModelSpec(str(zoo.target_dir)), {OTHER_TOKENIZER: ModelSpec(str(draft))})
    proposed = accepted = 0
    for task in zoo.tasks:
        for prompt in zoo.prompts(task)[:prompts]:
            stats = engine.generate(prompt, GenerationParams(max_tokens=max_tokens, k=k), draft=OTHER_TOKENIZER
                                    ).complete().stats
            proposed, accepted = proposed + stats.proposed, accepted + stats.accepted
    return accepted / max(1, proposed)


def _loss(model, stream: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    batch = random_windows(stream, batch_size, seq_len, generator)
    return model(input_ids=batch, labels=batch).loss
