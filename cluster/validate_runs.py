"""What `specserve validate` decodes, and how: a prompt (and the prompts file), one request, its
result, and the decoders that run requests in this process or through a service."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specserve.workers.sampling import SamplingParams
from specserve.workers.proposer_kinds import CASCADE, TREE
from specserve.workers.request import GenerationParams
from specserve.workers.stats import SpecStats

ZOO_PROMPTS_PER_TASK = 2  # held-out prompts per task when no --prompts file is given
DEFAULT_GREEDY_TOKENS = 64


@dataclass(frozen=True)
class Prompt:
    text: str
    task: str | None = None  # None: the default task in process; through a service, it classifies the prompt


@dataclass(frozen=True)
class Run:
    """One request (greedy at temperature 0)."""

    prompt: Prompt
    speculation: bool
    draft: str | None = None  # with speculation: the draft (None: the service's choice)
    temperature: float = 0.0
    max_tokens: int = DEFAULT_GREEDY_TOKENS
    seed: int = 0


@dataclass(frozen=True)
class Decoded:
    token_ids: list[int]
    seconds: float  # wall time of the request
    stats: SpecStats
    task: str  # the task it was served as
    draft: str  # the draft that served it; "": the target alone
    k: int  # the k it started with; 0: the target alone


Decoder = Callable[[Run], Decoded]


def engine_decoder(engine, k: int, members: Callable[[str, str], tuple[str, ...]] = lambda name, task: ()) -> Decoder:
    """Runs on the in-process engine (``workers/engine.py``), every speculative one at ``k``;
    ``members(draft, task)``: what a run's draft runs where it is a tree or a cascade."""
    def decode(run: Run) -> Decoded:
        params = GenerationParams(max_tokens=run.max_tokens, sampling=SamplingParams(temperature=run.temperature),
                                  seed=run.seed, k=k, speculation=run.speculation)
        named = members(run.draft, run.prompt.task or "") if run.draft in (TREE, CASCADE) else ()
        start = time.perf_counter()
        done = engine.generate(run.prompt.text, params, draft=run.draft, members=named).complete()
        return Decoded(done.token_ids, time.perf_counter() - start, done.stats, run.prompt.task or "",
                       done.draft or "", k if done.draft else 0)
    return decode


def service_decoder(client, k: int | None) -> Decoder:
    """Runs through a service's client API: speculation ON or OFF, the draft and (None) k the policy's."""
    from specserve.proto.v1 import specserve_pb2 as pb

    from .client import stats_from_message

    def decode(run: Run) -> Decoded:
        request = pb.GenerateRequest(prompt=run.prompt.text, task=run.prompt.task or "", max_tokens=run.max_tokens,
                                     temperature=run.temperature, seed=run.seed,
                                     draft=(run.draft or "") if run.speculation else "",
                                     speculation=pb.SPECULATION_ON if run.speculation else pb.SPECULATION_OFF)
        if k is not None:
            request.k = k
        start = time.perf_counter()
        response = client.generate(request)
        s = response.stats
        return Decoded(list(response.token_ids), time.perf_counter() - start, stats_from_message(s), s.task, s.draft,
                       s.k if s.draft else 0)
    return decode


# --- the prompts file --------------------------------------------------------------------------------


def read_prompts(path: Path) -> list[Prompt]:
    """JSON lines ({"prompt": ..., "task": ...}, the task optional) when the first non-blank line starts
    with "{"; otherwise plain text, one prompt per non-blank line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"--prompts {path}: no such file") from None
    except UnicodeDecodeError:
        raise ValueError(f"--prompts {path}: not UTF-8 text") from None
    except OSError as exc:
        raise ValueError(f"--prompts {path}: cannot read it ({exc.strerror or exc})") from None
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise ValueError(f'--prompts {path} holds no prompts: give one per line, or JSON lines {{"prompt": ..., '
                         f'"task": ...}}')
    if not lines[0][1].lstrip().startswith("{"):
        return [Prompt(line) for _, line in lines]
    return [_json_prompt(f"--prompts {path}, line {number}", line) for number, line in lines]


def _json_prompt(where: str, line: str) -> Prompt:
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg}); a file whose first line starts with {{ is read as "
                         f"JSON lines, one object per line") from None
    if not isinstance(doc, dict):
        raise ValueError(f'{where}: expected an object {{"prompt": ..., "task": ...}}, got {type(doc).__name__}')
    if unknown := sorted(set(doc) - {"prompt", "task"}):
        raise ValueError(f'{where}: unknown keys {unknown}; a line holds "prompt" and, optionally, "task"')
    prompt, task = doc.get("prompt"), doc.get("task")
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f'{where}: "prompt" must be a non-empty string')
    if task is not None and (not isinstance(task, str) or not task):
        raise ValueError(f'{where}: "task" must be a non-empty string when given')
    return Prompt(prompt, task)
