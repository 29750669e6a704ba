"""Your own models from the command line: ``--target``, ``--draft NAME=SOURCE``, ``--task TASK=DRAFT,...``.

`serve`, `generate --local` and `validate` take the same flags and turn them into the same
``models``/``router.tasks`` settings a Serve config file would carry, so one command serves a
Hugging Face directory, a hub id or a GGUF file with no YAML. A source is anything
``workers/loading.py`` loads; the tokenizer check runs when the models load.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from specserve.workers.proposer_kinds import RESERVED, VERSION_MARK

TARGET_HELP = "target model: a Hugging Face directory, a hub id or a .gguf file (replaces the zoo's target)"
DRAFT_HELP = ("a draft as NAME=SOURCE (a Hugging Face directory, a hub id or a .gguf file; repeatable). "
              "With --target and no --task, each draft serves a task of its own name")
TASK_HELP = ("the drafts that may serve a task, preferred first (repeatable; the first task is the default for "
             "requests that name none). The draft-free proposers (prompt lookup, suffix decoding) serve every task "
             "beside its drafts (a config's router.as_written lists tasks taken exactly as written)")


@dataclass(frozen=True)
class OwnModels:
    """What the flags named; empty when none were given (the zoo or the config file decides)."""

    target: str | None = None
    drafts: dict[str, str] = field(default_factory=dict)
    tasks: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def given(self) -> bool:
        return bool(self.target or self.drafts or self.tasks)

    def overrides(self) -> dict:
        """The Serve config ``args`` these flags stand for. A --target replaces the zoo: its drafts
        were distilled from another model, so they could not serve this one."""
        models: dict = {}
        if self.target:
            models |= {"zoo": None, "target": self.target}
        if self.drafts:
            models["drafts"] = dict(self.drafts)
        out: dict = {"models": models} if models else {}
        if self.tasks:
            out["router"] = {"tasks": {task: list(names) for task, names in self.tasks.items()}}
        # Requests that name no task (and have no classifier: a zoo's) go to the first task given.
        first = next(iter(self.tasks), None) or (next(iter(self.drafts), None) if self.target else None)
        if first:
            out.setdefault("router", {})["default_task"] = first
        return out


def add_model_arguments(parser: argparse.ArgumentParser, choosing: bool = False) -> None:
    """--target, --draft and --task. With ``choosing`` (generate), a --draft or --task value without
    "=" picks the request's draft or task instead of defining one (``split_choice``)."""
    parser.add_argument("--target", metavar="SOURCE", help=TARGET_HELP)
    pick_draft = "; or a NAME alone: use this draft instead of the routing policy's choice" if choosing else ""
    pick_task = ("; or a TASK alone: the prompt's task (code, sql, math, prose; default: the service classifies the "
                 "prompt, local mode uses the general draft)") if choosing else ""
    parser.add_argument("--draft", action="append", default=[], metavar="NAME=SOURCE", help=DRAFT_HELP + pick_draft)
    parser.add_argument("--task", action="append", default=[], metavar="TASK=DRAFT[,DRAFT...]", help=TASK_HELP + pick_task)


def split_choice(values: list[str], flag: str) -> tuple[str | None, list[str]]:
    """(the one value without "=", the NAME=... definitions) of a repeatable flag."""
    chosen = [v for v in values if "=" not in v]
    if len(chosen) > 1:
        raise ValueError(f"{flag} picks one: got {', '.join(chosen)}")
    return (chosen[0] if chosen else None), [v for v in values if "=" in v]


def own_models(target: str | None, drafts: list[str], tasks: list[str]) -> OwnModels:
    """Parse the flags' values; a malformed one raises ValueError naming the flag and the form."""
    named: dict[str, str] = {}
    for value in drafts:
        name, source = pair_of(value, "--draft", "NAME=SOURCE")
        if name in RESERVED:
            raise ValueError(f"--draft {value!r}: {name!r} is reserved for specserve's own proposers; name the draft "
                             f"otherwise")
        if VERSION_MARK in name:
            raise ValueError(f"--draft {value!r}: {VERSION_MARK!r} names a draft's versions (canaries); name the draft "
                             f"otherwise")
        if name in named:
            raise ValueError(f"--draft {name!r} is given twice")
        named[name] = source
    table: dict[str, tuple[str, ...]] = {}
    for value in tasks:
        task, listed = pair_of(value, "--task", "TASK=DRAFT[,DRAFT...]")
        names = tuple(n.strip() for n in listed.split(",") if n.strip())
        if task in table:
            raise ValueError(f"--task {task!r} is given twice")
        table[task] = names
    if table and not target and not named:
        raise ValueError("--task tables drafts of your own: give them with --draft NAME=SOURCE (and --target)")
    return OwnModels(target, named, table)


def pair_of(value: str, flag: str, form: str) -> tuple[str, str]:
    key, sep, rest = value.partition("=")
    if not sep or not key.strip() or not rest.strip():
        raise ValueError(f"{flag} {value!r}: expected {form}")
    return key.strip(), rest.strip()
