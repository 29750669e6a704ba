"""The host-path zoo: models whose forward pass costs next to nothing, so that what a service
spends around the pass (messages, bookkeeping, scheduling) is what a benchmark of it measures.

It is derived from a built zoo (its tokenizer, corpora, prompts and task classifier, so requests,
routing and detokenizing cost what they cost on that zoo) with:
- a target of real Llama modules at tiny widths (about 150k parameters on the demo tokenizer),
  initialised, not trained: its greedy output is as good as any for timing the path around it;
- every draft a copy of the target, so every greedy proposal is accepted: the best case for
  speculation, where it must win if the host path is cheap;
- an EAGLE-3 head trained for a few seconds on the tiny target (it drafts from the target's hidden
  states: the path that moves them is what costs).
The target's end-of-text logit is pinned to 0 so that greedy requests run to their max_tokens
(a random model's argmax would otherwise end some of them early, by chance).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from ..heads.distill import FACTS as HEAD_FACTS
from ..heads.distill import train_head_on
from ..heads.format import load_head_of, save_head
from ..heads.training import HeadTraining
from .head import HEAD, HEAD_PATH, head_entry
from .presets import GENERAL_DRAFT, ModelShape, TrainBudget
from .training import new_model, parameter_count
from .zoo import CLASSIFIER, MANIFEST, Zoo

log = logging.getLogger("specserve.zoo")

HOST_PATH_TARGET = ModelShape(hidden_size=32, num_layers=2, intermediate_size=64, num_heads=2, tie_embeddings=False)
HOST_PATH_HEAD = HeadTraining(sequence_tokens=64, train_tokens=6_000, on_policy_share=0.75, chat_share=0.0,
                              budget=TrainBudget(steps=300, batch_size=8, learning_rate=3e-3), seed=0)
SEED = 0
LOGIT_SCALE = 30.0
LAYER_SCALE = 0.1


def host_path_dir(source: Zoo) -> Path:
    """Where the host-path zoo derived from ``source`` lives: beside it."""
    return source.root.parent / f"{source.root.name}-host-path"


def ensure_host_path_zoo(source: Zoo, out: Path | None = None) -> Zoo:
    """The host-path zoo derived from ``source`` (built on first use, in seconds)."""
    out = out or host_path_dir(source)
    if (out / MANIFEST).exists():
        return Zoo.open(out)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(source.root / "tokenizer")
    for shared in ("tokenizer", "corpora"):
        shutil.copytree(source.root / shared, partial / shared)
    shutil.copy(source.root / "prompts.json", partial / "prompts.json")
    if source.classifier_path.exists():
        shutil.copy(source.classifier_path, partial / CLASSIFIER)
    context_window = json.loads((source.target_dir / "config.json").read_text())["max_position_embeddings"]
    target = new_model(HOST_PATH_TARGET, tokenizer, context_window, SEED).eval()
    with torch.no_grad():
        # An initialised model's logits are near zero: its distributions near uniform, which a head
        # trained on them by KL matches without learning the argmax. Sharpened, it has a mind of its own.
        target.lm_head.weight.mul_(LOGIT_SCALE)
        # Mostly a bigram model (the layers add little to the token's own embedding), so that a head
        # trained for seconds can predict it: the head's path must carry accepted tokens to be measured.
        for layer in target.model.layers:
            layer.self_attn.o_proj.weight.mul_(LAYER_SCALE)
            layer.mlp.down_proj.weight.mul_(LAYER_SCALE)
        target.lm_head.weight[tokenizer.eos_token_id].zero_()  # greedy never ends a request early
    target.save_pretrained(partial / "target")
    tokenizer.save_pretrained(partial / "target")
    drafts = {}
    for name in source.draft_names:
        if name == HEAD:
            continue
        shutil.copytree(partial / "target", partial / "drafts" / name)
        drafts[name] = {"path": f"drafts/{name}", "parameters": parameter_count(target), "copy_of": "target"}
    documents = [doc for task in source.tasks for doc in source.corpus(task).train[:40]]
    head, facts = train_head_on(target, tokenizer, documents, HOST_PATH_HEAD)
    save_head(head, partial / HEAD_PATH, "target", list(target.config.architectures or []), HOST_PATH_HEAD.ttt_steps)
    (partial / HEAD_PATH / HEAD_FACTS).write_text(json.dumps(facts, indent=2))
    drafts[HEAD] = head_entry(load_head_of(partial / HEAD_PATH, target), facts)
    task_drafts = {task: [name for name in source.manifest["task_drafts"][task] if name in drafts] or [GENERAL_DRAFT]
                   for task in source.tasks}
    for names in task_drafts.values():
        if HEAD not in names:
            names.append(HEAD)
    manifest = {"preset": f"{source.manifest.get('preset', source.root.name)}-host-path", "seed": SEED,
                "derived_from": str(source.root),
                "tasks": source.tasks, "target": {"path": "target", "parameters": parameter_count(target)},
                "drafts": drafts, "task_drafts": task_drafts,
                # A copy of the target accepts every greedy token; the head's was not measured.
                "acceptance": {task: {name: 1.0 if name != HEAD else 0.5 for name in names}
                               for task, names in task_drafts.items()}}
    (partial / MANIFEST).write_text(json.dumps(manifest, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    log.info("host-path zoo in %s: target %d parameters, drafts copies of it, head trained", out,
             parameter_count(target))
    return Zoo.open(out)
