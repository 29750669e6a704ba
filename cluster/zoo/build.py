"""`specserve zoo build`: corpora, task classifier, tokenizer, target, drafts, evaluation, manifest.

Each stage writes into a ``.partial`` directory (or file) and renames it into place when complete, so
an interrupted build leaves only whole stages behind and the next call resumes after the last one. The
manifest is written last: its presence means the zoo is complete, and a second build returns at once,
after adding any cheap stage introduced since the zoo was built (the task classifier).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from specserve.workers.heads.format import FACTS as HEAD_FACTS
from specserve.workers.heads.format import load_head_of, save_head

from .corpora import TASKS, Corpus, build_corpus, prompt_of
from .distill import DistillSet, build_distill_set, distill_draft
from .evaluate import eval_prompts, greedy_acceptance, perplexity
from .head import HEAD, HEAD_PATH, head_acceptance, head_entry, head_settings, with_head
from .head_distill import train_head_on
from .presets import GENERAL_DRAFT, ZooPreset, stage_seed
from .rollout import continue_all
from .task_classifier import train_from_corpora
from .tokenizer import CHAT_TEMPLATE, train_tokenizer
from .training import new_model, parameter_count, pretrain, token_stream
from .zoo import CLASSIFIER, MANIFEST, Zoo, corpus_file, read_corpus

log = logging.getLogger("specserve.zoo")

TOKENIZER_CHARS_PER_TASK = 2_000_000  # BPE merges settle long before the whole corpus is seen
DEMO_PROMPTS_PER_TASK = 16  # held-out prompts kept as text for demos and benchmarks
BUILD_CONFIG = "build.json"  # the preset a directory is being built from, written before any stage


def build_zoo(preset: ZooPreset, out: Path) -> Zoo:
    """Build (or finish building) ``preset`` into ``out``; return the complete zoo."""
    _claim(out, preset)
    if (out / MANIFEST).exists():
        _classifier(out, preset)  # stages added after zoos were built: they get them here
        _add_head(out, preset)
        _chat_template(out)
        return Zoo.open(out)
    started, seconds = time.perf_counter(), {}
    with _timed(seconds, "corpora"):
        corpora = {task: _corpus(out, preset, task) for task in TASKS}
    with _timed(seconds, "classifier"):
        _classifier(out, preset, corpora)
    with _timed(seconds, "tokenizer"):
        tokenizer = _tokenizer(out, preset, corpora)
    with _timed(seconds, "target"):
        target = _target(out, preset, tokenizer, corpora)
    with _timed(seconds, "distill_data"):
        data = {task: _distill_data(out, preset, tokenizer, target, corpora[task]) for task in TASKS}
    with _timed(seconds, "drafts"):
        built = {name: _draft(out, preset, tokenizer, data, name)  # the general one first: the others start from it
                 for name in sorted(preset.draft_names, key=lambda name: name != GENERAL_DRAFT)}
        drafts = {name: built[name] for name in preset.draft_names}
    with _timed(seconds, "evaluation"):
        evaluation = _evaluate(preset, tokenizer, target, drafts, corpora)
    with _timed(seconds, "head"):
        head, acceptance = _head(out, preset, tokenizer, target, corpora)
    seconds["total"] = time.perf_counter() - started
    manifest = {
        "format": 1,
        "preset": preset.name,
        "seed": preset.seed,
        "config": asdict(preset),
        "tasks": list(TASKS),
        "target": {"path": "target", "parameters": parameter_count(target), "perplexity": evaluation["perplexity"]},
        "drafts": {
            name: {"path": f"drafts/{name}", "parameters": parameter_count(model),
                   "trained_on": list(TASKS) if name == GENERAL_DRAFT else [name],
                   **({"started_from": GENERAL_DRAFT} if name != GENERAL_DRAFT and preset.specialize_general else {})}
            for name, model in drafts.items()
        },
        "task_drafts": {task: [task, GENERAL_DRAFT] for task in TASKS},  # allowed drafts, preferred first
        "acceptance": evaluation["acceptance"],  # task -> draft -> greedy alpha on held-out prompts
        "build_seconds": {k: round(v, 1) for k, v in seconds.items()},  # of this call (0 for cached stages)
    }
    manifest = with_head(manifest, head, acceptance)
    _chat_template(out)  # after every stage that trains: none of them sees it
    prompts = {task: [prompt_of(doc, task) for doc in corpora[task].held_out[:DEMO_PROMPTS_PER_TASK]] for task in TASKS}
    (out / "prompts.json").write_text(json.dumps(prompts, indent=1))
    _write_atomically(out / MANIFEST, json.dumps(manifest, indent=2))
    log.info("zoo %s complete in %s (%.0f s)", preset.name, out, seconds["total"])
    return Zoo.open(out)


# Settings added to the presets after zoos were built, with what a zoo built before them did: a
# complete zoo that differs from its preset only there is used as built (with a warning).
BUILT_BEFORE = {"specialize_general": False}


def _claim(out: Path, preset: ZooPreset) -> None:
    """Record which preset this directory is built from, or refuse one built from another.

    Resuming reuses every finished stage, so stages of two presets (or of an edited preset) must never
    meet in one directory: the corpora of one would silently feed the target of the other.
    """
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a directory for the zoo")
    wanted = json.loads(json.dumps(asdict(preset)))  # compared as JSON: tuples become lists
    claim = out / BUILD_CONFIG
    if claim.exists():
        found = {**BUILT_BEFORE, **json.loads(claim.read_text())}
        later = {key for key in BUILT_BEFORE if found[key] != wanted[key]}
        if later and (out / MANIFEST).exists() and {**found, **{key: wanted[key] for key in later}} == wanted:
            log.warning("%s was built before %s: it is used as built; delete it (or build to another --out) "
                        "for what the preset builds now", out, ", ".join(sorted(later)))
            return
        if found != wanted:
            raise ValueError(f"{out} holds (part of) zoo {found['name']!r} built with other settings; "
                             f"choose another --out for {preset.name!r}, or delete {out}")
        return
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty and is not a zoo; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    _write_atomically(claim, json.dumps(wanted, indent=2))


def _corpus(out: Path, preset: ZooPreset, task: str) -> Corpus:
    path = corpus_file(out, task)
    if not path.exists():
        corpus = build_corpus(task, stage_seed(preset.seed, f"corpus:{task}"), preset.chars_per_task)
        path.parent.mkdir(exist_ok=True)
        _write_atomically(path, json.dumps({"train": corpus.train, "held_out": corpus.held_out}))
        log.info("corpus %s: %d train, %d held-out documents", task, len(corpus.train), len(corpus.held_out))
    return read_corpus(out, task)


def _tokenizer(out: Path, preset: ZooPreset, corpora: dict[str, Corpus]) -> PreTrainedTokenizerBase:
    path = out / "tokenizer"
    if not path.exists():
        texts = [doc for c in corpora.values() for doc in _first_chars(c.train, TOKENIZER_CHARS_PER_TASK)]
        with _staged(path) as tmp:
            train_tokenizer(texts, preset.vocab_size).save_pretrained(tmp)
    return PreTrainedTokenizerFast.from_pretrained(path)


def _target(out: Path, preset: ZooPreset, tokenizer, corpora: dict[str, Corpus]):
    path = out / "target"
    if not path.exists():
        # Interleave the tasks document by document so every batch sees a mix.
        stream = token_stream(tokenizer, _interleave([corpora[t].train for t in TASKS]))
        model = new_model(preset.target, tokenizer, preset.context_window, stage_seed(preset.seed, "target"))
        log.info("target: %.1fM parameters, %d training tokens available", parameter_count(model) / 1e6, stream.numel())
        loss = pretrain(model, stream, preset.target_budget, preset.seq_len, stage_seed(preset.seed, "target-data"))
        log.info("target trained: loss %.3f", loss)
        with _staged(path) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    return AutoModelForCausalLM.from_pretrained(path).eval()


def _distill_data(out: Path, preset: ZooPreset, tokenizer, target, corpus: Corpus) -> DistillSet:
    path = out / "distill" / f"{corpus.task}.safetensors"
    if not path.exists():
        data = build_distill_set(
            target, tokenizer, corpus.train, total_tokens=preset.distill_tokens,
            on_policy_sequences=preset.on_policy_sequences, on_policy_tokens=preset.on_policy_tokens,
            seed=stage_seed(preset.seed, f"distill:{corpus.task}"), desc=f"labels {corpus.task}",
        )
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_suffix(".partial")
        data.save(tmp)
        os.replace(tmp, path)
    return DistillSet.load(path)


def _draft(out: Path, preset: ZooPreset, tokenizer, data: dict[str, DistillSet], name: str):
    """A draft distilled from the target: the general one on every task's data, a task's on its own,
    from the general draft's weights (``specialize_general``: built first) or from scratch."""
    path = out / "drafts" / name
    if not path.exists():
        train_set = DistillSet.concat(list(data.values())) if name == GENERAL_DRAFT else data[name]
        if name != GENERAL_DRAFT and preset.specialize_general:
            model = AutoModelForCausalLM.from_pretrained(out / "drafts" / GENERAL_DRAFT).train()
        else:
            model = new_model(preset.draft, tokenizer, preset.context_window, stage_seed(preset.seed, f"draft:{name}"))
        loss = distill_draft(model, train_set, preset.draft_budget, stage_seed(preset.seed, f"draft-data:{name}"),
                             desc=f"draft {name}")
        log.info("draft %s: %.2fM parameters, distillation loss %.3f", name, parameter_count(model) / 1e6, loss)
        with _staged(path) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    return AutoModelForCausalLM.from_pretrained(path).eval()


def _head(out: Path, preset: ZooPreset, tokenizer, target, corpora: dict[str, Corpus]) -> tuple[dict, dict]:
    """The zoo's EAGLE-3 head (trained once), its manifest entry and its acceptance per task."""
    path = out / HEAD_PATH
    if not path.exists():
        documents = _interleave([corpora[t].train for t in TASKS])
        head, facts = train_head_on(target, tokenizer, documents, head_settings(preset))
        with _staged(path) as tmp:
            save_head(head, tmp, "target", list(target.config.architectures or []), head_settings(preset).ttt_steps)
            (tmp / HEAD_FACTS).write_text(json.dumps(facts, indent=2))
    head = load_head_of(path, target)
    acceptance = head_acceptance(preset, tokenizer, target, head, corpora)
    log.info("head %s: %.2fM parameters of its own, acceptance %s", HEAD, head.parameters_of_its_own() / 1e6,
             acceptance)
    return head_entry(head, json.loads((path / HEAD_FACTS).read_text())), acceptance


def _add_head(out: Path, preset: ZooPreset) -> None:
    """A zoo built before heads gets its head (and it joins the manifest) on its next build call."""
    manifest = json.loads((out / MANIFEST).read_text())
    if HEAD in manifest["drafts"]:
        return
    log.info("zoo %s: adding its EAGLE-3 head (a stage added since it was built)", preset.name)
    corpora = {task: read_corpus(out, task) for task in TASKS}
    tokenizer = PreTrainedTokenizerFast.from_pretrained(out / "tokenizer")
    target = AutoModelForCausalLM.from_pretrained(out / "target").eval()
    entry, acceptance = _head(out, preset, tokenizer, target, corpora)
    _write_atomically(out / MANIFEST, json.dumps(with_head(manifest, entry, acceptance), indent=2))


def _chat_template(out: Path) -> None:
    """The served target's tokenizer gets the zoo's chat template (``CHAT_TEMPLATE``), so a chat
    request works on the zoo's service; only the target's copy, the one the service reads, and after
    the stages that train (the head's training renders chats where its tokenizer has a template)."""
    path = out / "target"
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    if tokenizer.chat_template:
        return
    tokenizer.chat_template = CHAT_TEMPLATE
    tmp = out / "target-tokenizer.partial"
    shutil.rmtree(tmp, ignore_errors=True)  # left by an interrupted build
    tokenizer.save_pretrained(tmp)
    for file in tmp.iterdir():  # each file replaced at once: the others' content is unchanged
        os.replace(file, path / file.name)
    tmp.rmdir()
    log.info("zoo at %s: its target's tokenizer has the zoo's chat template", out)


def _classifier(out: Path, preset: ZooPreset, corpora: dict[str, Corpus] | None = None) -> None:
    path = out / CLASSIFIER
    if not path.exists():
        corpora = corpora or {task: _corpus(out, preset, task) for task in TASKS}
        train_from_corpora(corpora, preset.seed).save(path)  # atomic, like every stage
        log.info("task classifier: %s", path)


def _evaluate(preset: ZooPreset, tokenizer, target, drafts: dict, corpora: dict[str, Corpus]) -> dict:
    result: dict = {"perplexity": {}, "acceptance": {}}
    for task in TASKS:
        held_out = corpora[task].held_out
        result["perplexity"][task] = round(perplexity(target, token_stream(tokenizer, held_out), preset.seq_len), 3)
        references = continue_all(target, eval_prompts(tokenizer, held_out, preset.eval_prompts), preset.eval_tokens, 0.0)
        result["acceptance"][task] = {
            name: round(greedy_acceptance(draft, references, tokenizer.eos_token_id), 4) for name, draft in drafts.items()
        }
        log.info("task %s: perplexity %.2f, acceptance %s", task, result["perplexity"][task], result["acceptance"][task])
    return result


def _first_chars(docs: list[str], limit: int) -> Iterator[str]:
    total = 0
    for doc in docs:
        if total >= limit:
            return
        total += len(doc)
        yield doc


def _interleave(lists: list[list[str]]) -> list[str]:
    out = []
    for i in range(max(len(x) for x in lists)):
        out += [x[i] for x in lists if i < len(x)]
    return out


@contextlib.contextmanager
def _staged(path: Path) -> Iterator[Path]:
    """Yield a scratch directory that becomes ``path`` only if the block completes."""
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)  # left by an interrupted build
    tmp.mkdir(parents=True)
    yield tmp
    os.replace(tmp, path)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(text)
    os.replace(tmp, path)


@contextlib.contextmanager
def _timed(seconds: dict, stage: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    seconds[stage] = time.perf_counter() - start
