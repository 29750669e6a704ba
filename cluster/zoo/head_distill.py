"""`specserve distill --method eagle3` (or ``medusa``, or ``mtp``): heads for a target, trained on a
corpus, measured, written.

What it made is measured the way it will serve: on held-out documents of the corpus, each prompt
decoded greedily by the target alone and with the head (the in-process engine, k = its TTT steps),
giving its acceptance alpha, alpha per draft position, tokens per target pass and its cost ratio c
(the head's time per drafted token over a target-only pass). The caller (the command) turns alpha
and c into the verdict: whether the routing policy will serve it.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specserve.workers.engine import SpecEngine
from specserve.workers.heads.eagle3 import Eagle3Head, config_for
from specserve.workers.heads.format import FACTS, save_head
from specserve.workers.heads.medusa import MedusaHeads, save_medusa
from specserve.workers.heads.mtp import MtpModule, mtp_config_for, save_mtp
from specserve.workers.loading import DTYPES, ModelSpec, load_model, load_tokenizer
from specserve.workers.request import GenerationParams
from specserve.workers.stats import SpecStats
from specserve.workers.vocabulary import choose_vocabulary

from .distill import documents_from_files, held_out_split
from .head_training import (Features, head_from_target, init_linear, target_features, train_head,
                            training_sequences)
from .medusa_training import medusa_from_target, train_medusa
from .presets import HeadTraining, MedusaTraining

log = logging.getLogger("specserve.heads")
@dataclass(frozen=True)
class HeadEvaluation:
    prompts: int = 8  # held-out prompts, each decoded greedily with and without the head
    prompt_tokens: int = 32  # the start of a held-out document
    max_tokens: int = 64


def distill_head(target_source: str, corpus_files: list[str], out_dir: str, settings: HeadTraining = HeadTraining(),
                 evaluation: HeadEvaluation = HeadEvaluation()) -> dict:
    """Train, measure and write a head for ``target_source``; returns the facts written beside it."""
    return _distill(target_source, corpus_files, evaluation, settings.ttt_steps,
                    lambda target, tokenizer, documents: train_head_on(target, tokenizer, documents, settings),
                    lambda target, tokenizer, head: SpecEngine(target, tokenizer, {}, heads={"head": head}),
                    lambda target, head: save_head(head, out_dir, target_source,
                                                   list(target.config.architectures or []), settings.ttt_steps),
                    out_dir)


def distill_medusa(target_source: str, corpus_files: list[str], out_dir: str,
                   settings: MedusaTraining = MedusaTraining(), evaluation: HeadEvaluation = HeadEvaluation()) -> dict:
    """Train, measure and write Medusa heads for ``target_source``; returns the facts written beside them."""
    return _distill(target_source, corpus_files, evaluation, settings.num_heads,
                    lambda target, tokenizer, documents: train_medusa_on(target, tokenizer, documents, settings),
                    lambda target, tokenizer, heads: SpecEngine(target, tokenizer, {}, medusa={"head": heads}),
                    lambda target, heads: save_medusa(heads, out_dir), out_dir)


def distill_mtp(target_source: str, corpus_files: list[str], out_dir: str, settings: HeadTraining = HeadTraining(),
                evaluation: HeadEvaluation = HeadEvaluation()) -> dict:
    """Train an MTP module for ``target_source`` (a directory) and write the target carrying it to
    ``out_dir``, with what was measured beside it."""
    if not Path(target_source).is_dir():
        raise ValueError(f"--method mtp writes the target carrying its module: give the target as a Hugging Face "
                         f"directory, not {target_source!r}")
    if Path(out_dir).resolve() == Path(target_source).resolve():
        raise ValueError(f"--out {out_dir} is the target's own directory: give another one for the target carrying "
                         f"its module")
    return _distill(target_source, corpus_files, evaluation, settings.ttt_steps,
                    lambda target, tokenizer, documents: train_mtp_on(target, tokenizer, documents, settings),
                    lambda target, tokenizer, module: SpecEngine(target, tokenizer, {}, heads={"head": module}),
                    lambda target, module: save_mtp(module, target_source, out_dir), out_dir)


def _distill(target_source: str, corpus_files: list[str], evaluation: HeadEvaluation, k: int, train, serve, save,
             out_dir: str) -> dict:
    """Heads trained on the corpus's training documents (``train``), measured on its held-out ones
    as ``serve`` serves them at ``k``, written (``save``) with what was measured beside them."""
    started = time.perf_counter()
    tokenizer = load_tokenizer(target_source)
    target = load_model(ModelSpec(target_source))
    documents, held_out = held_out_split(documents_from_files(corpus_files))
    heads, facts = train(target, tokenizer, documents)
    facts |= measure_head(serve(target, tokenizer, heads), held_out, k, evaluation)
    facts |= {"target": target_source, "held_out_documents": len(held_out) if held_out is not documents else 0,
              "seconds": round(time.perf_counter() - started, 1)}
    save(target, heads)
    (Path(out_dir) / FACTS).write_text(json.dumps(facts, indent=2) + "\n")
    return facts


def train_head_on(target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, documents: list[str],
                  settings: HeadTraining) -> tuple[Eagle3Head, dict]:
    """A head for ``target`` trained on ``documents`` (and the target's own continuations of them),
    in the target's dtype, and what its training was."""
    sequences = training_sequences(target, tokenizer, documents, settings)
    vocabulary, coverage = choose_vocabulary(sequences, target.config.vocab_size, settings.draft_vocab_size)
    config = config_for(target.config, len(vocabulary), settings.aux_layers)
    log.info("eagle3 head: %d training sequences of %d tokens; draft vocabulary %d of %d tokens (%.1f%% of the "
             "training tokens); aux layers %s", len(sequences), settings.sequence_tokens, len(vocabulary),
             target.config.vocab_size, 100 * coverage, list(config.aux_layers))
    features = target_features(target, sequences, config.aux_layers, DTYPES[settings.feature_dtype])
    log.info("eagle3 head: the target's features hold %.1f MiB", features.nbytes / 2**20)
    head = head_from_target(target, config, vocabulary, settings.seed)
    loss = train_head(head, features, head.lm_head.weight.detach(), settings)
    facts = {"method": "eagle3", "draft_vocab_size": len(vocabulary), "vocabulary_coverage": round(coverage, 4),
             "aux_layers": list(config.aux_layers), "ttt_steps": settings.ttt_steps,
             "training_sequences": len(sequences), "training_tokens": int(sequences.numel()),
             "feature_mib": round(features.nbytes / 2**20, 1), "steps": settings.budget.steps,
             "final_loss": round(loss, 4), "parameters": head.parameters_of_its_own(), "seed": settings.seed}
    return head.to(target.dtype).eval().requires_grad_(False), facts


def train_medusa_on(target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, documents: list[str],
                    settings: MedusaTraining) -> tuple[MedusaHeads, dict]:
    """Medusa heads for ``target`` trained on ``documents`` (and its own continuations of them), in
    the target's dtype, and what their training was."""
    sequences = training_sequences(target, tokenizer, documents, settings, label="medusa heads")
    layer = MedusaHeads.reads_layer(target.config)
    features = target_features(target, sequences, (), DTYPES[settings.feature_dtype])
    log.info("medusa heads: %d heads of %d residual blocks on the target's layer %d; %d training sequences; the "
             "features hold %.1f MiB", settings.num_heads, settings.num_layers, layer, len(sequences),
             features.nbytes / 2**20)
    output = target.get_output_embeddings()
    heads = medusa_from_target(output, target.config.get_text_config().hidden_size, settings)
    loss = train_medusa(heads, features, output.weight.detach(), settings)
    facts = {"method": "medusa", "num_heads": settings.num_heads, "num_layers": settings.num_layers,
             "reads_layer": layer, "training_sequences": len(sequences), "training_tokens": int(sequences.numel()),
             "feature_mib": round(features.nbytes / 2**20, 1), "steps": settings.budget.steps,
             "final_loss": round(loss, 4), "parameters": sum(p.numel() for p in heads.parameters()),
             "seed": settings.seed}
    return heads.to(target.dtype).eval().requires_grad_(False), facts


def train_mtp_on(target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, documents: list[str],
                 settings: HeadTraining) -> tuple[MtpModule, dict]:
    """An MTP module for the frozen ``target`` (DeepSeek's train with the model; a served model's
    backbone stays as it is), trained as an EAGLE-3 head is (training-time test over its own
    outputs, the target's distribution over its whole vocabulary), in the target's dtype."""
    sequences = training_sequences(target, tokenizer, documents, settings, label="mtp module")
    features = target_features(target, sequences, (), DTYPES[settings.feature_dtype])
    log.info("mtp module: %d training sequences of %d tokens; the target's last hidden states hold %.1f MiB",
             len(sequences), settings.sequence_tokens, features.nbytes / 2**20)
    torch.manual_seed(settings.seed)
    module = MtpModule(mtp_config_for(target.config), target.get_input_embeddings())  # shared, frozen
    init_linear(module)
    output = target.get_output_embeddings().weight.detach()
    with torch.no_grad():
        module.lm_head.weight.copy_(output)  # the model's output head, shared as published modules do
    module.embed_tokens.requires_grad_(False)
    module.lm_head.requires_grad_(False)
    module.float()
    # The feature it reads is the target's last hidden state itself.
    loss = train_head(module, Features(features.tokens, features.last, features.last), output, settings)
    facts = {"method": "mtp", "ttt_steps": settings.ttt_steps, "training_sequences": len(sequences),
             "training_tokens": int(sequences.numel()), "feature_mib": round(features.nbytes / 2**20, 1),
             "steps": settings.budget.steps, "final_loss": round(loss, 4),
             "parameters": module.parameters_of_its_own(), "seed": settings.seed}
    return module.to(target.dtype).eval().requires_grad_(False), facts


def measure_head(engine: SpecEngine, documents: list[str], k: int, evaluation: HeadEvaluation) -> dict:
    """Greedy decoding of held-out prompts with draft "head" of ``engine`` (an EAGLE-3 head or
    Medusa heads) and without: what it accepts and costs."""
    tokenizer = engine.tokenizer
    prompts = [ids[: evaluation.prompt_tokens] for document in documents
               if len(ids := tokenizer.encode(document, add_special_tokens=False)) > evaluation.prompt_tokens]
    prompts = prompts[: evaluation.prompts]
    if not prompts:
        raise ValueError(f"no held-out document is longer than {evaluation.prompt_tokens} tokens: give more text")
    on, off = SpecStats(), SpecStats()
    identical = 0
    for prompt in prompts:
        plain = engine.generate(prompt, GenerationParams(max_tokens=evaluation.max_tokens, speculation=False)).complete()
        drafted = engine.generate(prompt, GenerationParams(max_tokens=evaluation.max_tokens, k=k), draft="head").complete()
        identical += plain.token_ids == drafted.token_ids
        off.add(plain.stats)
        on.add(drafted.stats)
    return {"held_out_alpha": round(on.alpha, 4),
            "held_out_alpha_per_position": [round(a, 4) for a in on.alpha_per_position],
            "held_out_tokens_per_pass": round(on.tokens_per_pass, 3), "cost_ratio": round(on.cost_ratio(off), 4),
            "held_out_prompts": len(prompts), "greedy_identical": identical == len(prompts)}
