"""The host-path zoo: models whose forward pass costs next to nothing, so that what a service
spends around the pass (messages, bookkeeping, scheduling) is what a benchmark of it measures.

It is derived from a built zoo (its tokenizer, corpora, prompts and task classifier, so requests,
routing and detokenizing cost what they cost on that zoo) with:
- a target of real Llama modules at tiny widths (4 layers, about 160k parameters on the demo
  tokenizer), initialised, not trained, its layers' output projections zero: every layer runs its
  kernels and adds exactly nothing, so the target is a bigram model (its sharpened logits read off
  the token's own embedding), as good as any for timing the path around its pass;
- every draft the same function in one such layer (the target's embeddings, norm and head): its
  logits are the target's bit for bit, so every greedy proposal is accepted, and its pass costs
  about a third of the target's (c ~ 0.3 here): the case where speculation must win if the host
  path is cheap;
- an EAGLE-3 head trained for a few seconds on the tiny target (it drafts from the target's hidden
  states: the path that moves them is what costs);
- Medusa heads trained as briefly (``medusa``: served by the target replica, guessing in its verify
  pass; in no task's table, asked for by name);
- an MTP module trained as briefly, carried by a copy of the target (``mtp``: drafting on the draft
  workers from the target's last hidden states; in no task's table either).
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

from specserve.workers.heads.format import FACTS as HEAD_FACTS
from specserve.workers.heads.format import load_head_of, save_head
from specserve.workers.heads.medusa import save_medusa
from specserve.workers.heads.mtp import MTP, save_mtp

from .head import HEAD, HEAD_PATH, HEAD_TRAINING, head_entry
from .head_distill import train_head_on, train_medusa_on, train_mtp_on
from .other_tokenizer import OTHER_TOKENIZER, ensure_other_tokenizer_draft
from .presets import GENERAL_DRAFT, HeadTraining, MedusaTraining, ModelShape, TrainBudget
from .training import new_model, parameter_count
from .zoo import CLASSIFIER, MANIFEST, Zoo

log = logging.getLogger("specserve.zoo")

HOST_PATH_TARGET = ModelShape(hidden_size=32, num_layers=4, intermediate_size=64, num_heads=2, tie_embeddings=False)
HOST_PATH_DRAFT = ModelShape(hidden_size=32, num_layers=1, intermediate_size=64, num_heads=2, tie_embeddings=False)
HOST_PATH_HEAD = HeadTraining(sequence_tokens=64, train_tokens=6_000, on_policy_share=0.75, chat_share=0.0,
                              budget=TrainBudget(steps=300, batch_size=8, learning_rate=3e-3), seed=0)
HOST_PATH_MEDUSA = MedusaTraining(sequence_tokens=64, train_tokens=6_000, on_policy_share=0.75, chat_share=0.0,
                                  budget=TrainBudget(steps=300, batch_size=8, learning_rate=3e-3), seed=0)
MEDUSA = "medusa"  # its Medusa heads' name among the drafts
MEDUSA_PATH = "heads/medusa"
MTP_PATH = "heads/mtp"  # a copy of the target (hard links) carrying the module
SEED = 0
# An initialised model's logits are near zero, its distributions near uniform: a head trained on
# them by KL matches them without learning their argmax. Sharpened, the target has a mind of its own.
LOGIT_SCALE = 30.0


def _bigram(model, tokenizer):
    """``model`` with every layer's output projections zero (each layer adds exactly nothing to
    the token's embedding); with a tokenizer, its head sharpened and end-of-text never its argmax."""
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        if tokenizer is not None:
            model.lm_head.weight.mul_(LOGIT_SCALE)
            model.lm_head.weight[tokenizer.eos_token_id].zero_()  # greedy never ends a request early
    return model.eval()


def host_path_dir(source: Zoo) -> Path:
    """Where the host-path zoo derived from ``source`` lives: beside it."""
    return source.root.parent / f"{source.root.name}-host-path"


def ensure_host_path_zoo(source: Zoo, out: Path | None = None) -> Zoo:
    """The host-path zoo derived from ``source`` (built on first use, in seconds)."""
    out = out or host_path_dir(source)
    if (out / MANIFEST).exists() and MTP in json.loads((out / MANIFEST).read_text())["drafts"]:
        return Zoo.open(out)  # (one built before it had an MTP module is built again)
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
    target = _bigram(new_model(HOST_PATH_TARGET, tokenizer, context_window, SEED), tokenizer)
    target.save_pretrained(partial / "target")
    tokenizer.save_pretrained(partial / "target")
    draft = new_model(HOST_PATH_DRAFT, tokenizer, context_window, SEED + 1)
    draft.load_state_dict({name: tensor for name, tensor in target.state_dict().items()
                           if not name.startswith("model.layers.")}, strict=False)
    draft = _bigram(draft, None)
    drafts = {}
    for name in source.draft_names:
        if name == HEAD:
            continue
        draft.save_pretrained(partial / "drafts" / name)
        tokenizer.save_pretrained(partial / "drafts" / name)
        drafts[name] = {"path": f"drafts/{name}", "parameters": parameter_count(draft),
                        "same_function_as": "target"}
    documents = [doc for task in source.tasks for doc in source.corpus(task).train[:40]]
    head, facts = train_head_on(target, tokenizer, documents, HOST_PATH_HEAD)
    save_head(head, partial / HEAD_PATH, "target", list(target.config.architectures or []), HOST_PATH_HEAD.ttt_steps)
    (partial / HEAD_PATH / HEAD_FACTS).write_text(json.dumps(facts, indent=2))
    drafts[HEAD] = head_entry(load_head_of(partial / HEAD_PATH, target), facts)
    medusa, facts = train_medusa_on(target, tokenizer, documents, HOST_PATH_MEDUSA)
    save_medusa(medusa, partial / MEDUSA_PATH)
    (partial / MEDUSA_PATH / HEAD_FACTS).write_text(json.dumps(facts, indent=2))
    drafts[MEDUSA] = {"path": MEDUSA_PATH, "parameters": facts["parameters"], "method": "medusa"}
    module, facts = train_mtp_on(target, tokenizer, documents, HOST_PATH_HEAD)
    save_mtp(module, partial / "target", partial / MTP_PATH)
    (partial / MTP_PATH / HEAD_FACTS).write_text(json.dumps(facts, indent=2))
    drafts[MTP] = {"path": MTP_PATH, "parameters": facts["parameters"], "method": "mtp"}
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
    log.info("host-path zoo in %s: target %d parameters, drafts copies of it, EAGLE-3 and Medusa heads and an MTP "
             "module trained", out,
             parameter_count(target))
    return Zoo.open(out)


def zoo_variants(zoo: Zoo) -> dict[str, Path]:
    """``zoo_heads`` and a draft of another tokenizer (cluster/zoo/other_tokenizer.py), by name."""
    return zoo_heads(zoo) | {OTHER_TOKENIZER: ensure_other_tokenizer_draft(zoo)}


def zoo_heads(zoo: Zoo, names: tuple[str, ...] = (MEDUSA, MTP)) -> dict[str, Path]:
    """Medusa heads and an MTP module of ``zoo``'s target (a copy of it carrying one), those of
    ``names``: its own (the host-path zoo's), else distilled beside it on first use from its
    corpora (``<zoo>-medusa``, ``<zoo>-mtp``; a few minutes each on the demo zoo's target)."""
    distill = {MEDUSA: _medusa, MTP: _mtp}
    return {name: _beside(zoo, name, distill[name]) for name in names}


def _medusa(zoo: Zoo, target, tokenizer, documents: list[str], out: Path) -> dict:
    heads, facts = train_medusa_on(target, tokenizer, documents, MedusaTraining())
    save_medusa(heads, out)
    return facts


def _mtp(zoo: Zoo, target, tokenizer, documents: list[str], out: Path) -> dict:
    # The budget the zoo's own EAGLE-3 head trained on (its preset's), or distill's default.
    settings = HEAD_TRAINING.get(zoo.manifest.get("preset", ""), HeadTraining())
    module, facts = train_mtp_on(target, tokenizer, documents, settings)
    save_mtp(module, zoo.target_dir, out)
    return facts


def _beside(zoo: Zoo, name: str, distill) -> Path:
    """The zoo's own draft ``name``, else ``distill``'s, made once beside the zoo."""
    if name in zoo.draft_names:
        return zoo.draft_dir(name)
    out = zoo.root.parent / f"{zoo.root.name}-{name}"
    if not (out / "config.json").exists():
        from specserve.workers.loading import ModelSpec, load_model

        print(f"distilling {name} for {zoo.root} into {out} (once, minutes)", flush=True)
        target = load_model(ModelSpec(str(zoo.target_dir)))
        tokenizer = PreTrainedTokenizerFast.from_pretrained(zoo.target_dir)
        documents = [doc for task in zoo.tasks for doc in zoo.corpus(task).train]
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        facts = distill(zoo, target, tokenizer, documents, partial)
        (partial / HEAD_FACTS).write_text(json.dumps(facts, indent=2))
        shutil.rmtree(out, ignore_errors=True)
        partial.rename(out)
    return out
