"""The zoo's EAGLE-3 head: one head for its target, trained on every task's corpus, served as a draft.

It is a stage of the build like the others (``heads/eagle3``, in the speculators format), and a zoo
built before heads existed gets it on its next build call, in the same minutes. Its acceptance per
task is measured as it serves (greedy, through the in-process engine, on held-out prompts of the
task), and it joins every task's drafts after the zoo's own, for the routing policy to price.
"""

from __future__ import annotations

import json
from dataclasses import replace

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specserve.workers.engine import SpecEngine
from specserve.workers.heads.eagle3 import Eagle3Head

from .corpora import TASKS, Corpus
from .head_distill import HeadEvaluation, measure_head
from .presets import HeadTraining
from .presets import TrainBudget, ZooPreset, stage_seed

HEAD = "eagle3"  # its name among the zoo's drafts
HEAD_PATH = "heads/eagle3"
# Per preset (kept out of ZooPreset: a zoo directory is claimed by its preset's fields, and a zoo
# built before heads must still be the same zoo): the budget a head trains on.
HEAD_TRAINING = {
    "tiny": HeadTraining(sequence_tokens=64, train_tokens=12_000,
                         budget=TrainBudget(steps=60, batch_size=8, learning_rate=3e-3)),
    # 160 steps: ~111 s of the demo build with its acceptance (240 steps: 188 s, alpha 0.65-0.93;
    # 160: alpha 0.66-0.88 by task).
    "demo": HeadTraining(sequence_tokens=256, train_tokens=64_000,
                         budget=TrainBudget(steps=160, batch_size=8, learning_rate=2.5e-3)),
    "bench": HeadTraining(sequence_tokens=256, train_tokens=200_000,
                          budget=TrainBudget(steps=600, batch_size=8, learning_rate=1.5e-3)),
}


def head_settings(preset: ZooPreset) -> HeadTraining:
    return replace(HEAD_TRAINING[preset.name], seed=stage_seed(preset.seed, "head"))


def head_acceptance(preset: ZooPreset, tokenizer: PreTrainedTokenizerBase, target: PreTrainedModel, head: Eagle3Head,
                    corpora: dict[str, Corpus]) -> dict[str, float]:
    """Greedy acceptance per task on held-out prompts, drafting as it serves (k = its TTT steps)."""
    evaluation = HeadEvaluation(prompts=preset.eval_prompts, max_tokens=preset.eval_tokens)
    k = head_settings(preset).ttt_steps
    engine = SpecEngine(target, tokenizer, {}, heads={"head": head})
    return {task: measure_head(engine, corpora[task].held_out, k, evaluation)["held_out_alpha"] for task in TASKS}


def head_entry(head: Eagle3Head, facts: dict) -> dict:
    """The head's entry among the manifest's drafts."""
    return {"path": HEAD_PATH, "parameters": head.parameters_of_its_own(), "trained_on": list(TASKS),
            "method": "eagle3", "draft_vocab_size": head.config.draft_vocab_size,
            "vocabulary_coverage": facts.get("vocabulary_coverage"), "final_loss": facts.get("final_loss")}


def with_head(manifest: dict, entry: dict, acceptance: dict[str, float]) -> dict:
    """The manifest with the head among its drafts, last in every task's list."""
    manifest = json.loads(json.dumps(manifest))
    manifest["drafts"][HEAD] = entry
    for task, names in manifest["task_drafts"].items():
        if HEAD not in names:
            names.append(HEAD)
        manifest["acceptance"].setdefault(task, {})[HEAD] = acceptance[task]
    return manifest
