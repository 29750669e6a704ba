"""Which models `specserve validate` runs in this process, and on which prompts: a zoo's models and
held-out prompts, or your own (--target, --draft NAME=SOURCE, --task TASK=...)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from specserve.workers.proposer_kinds import CASCADE, DRAFT_FREE, RESERVED, TREE
from specserve.cluster.zoo.zoo import GENERAL_DRAFT
from specserve.cluster.zoo.zoo import Zoo

from .config import ModelsConfig
from .model_args import OwnModels
from .models import is_draft_model
from .validate_runs import ZOO_PROMPTS_PER_TASK, Prompt

DEFAULT_ZOO = ModelsConfig().zoo  # the service's, as every command's


@dataclass(frozen=True)
class LocalModels:
    target: str
    drafts: dict[str, str]  # name -> source
    tasks: dict[str, tuple[str, ...]]  # task -> its proposers (drafts, draft-free, tree), preferred first
    default_task: str | None  # for prompts without one
    zoo: Zoo | None = None  # when the models are a zoo's
    trees: dict[str, tuple[str, ...]] = field(default_factory=dict)  # task -> its tree's members, its draft first
    cascades: dict[str, str] = field(default_factory=dict)  # task -> the draft model its cascade runs

    def members(self, name: str, task: str) -> tuple[str, ...]:
        """What proposer ``name`` runs for ``task``: a tree's members, a cascade's draft model, or itself."""
        if name == TREE:
            return self.trees[task]
        return (self.cascades[task],) if name == CASCADE else (name,)

    def models_for(self, prompts: list[Prompt], arms: list[list[str]]) -> set[str]:
        """The draft models these runs load: the drafts named, and those the trees and cascades named run."""
        named = {(name, p.task) for p, names in zip(prompts, arms, strict=True) for name in names}
        return {m for name, task in named for m in self.members(name, task) if m in self.drafts}


def local_models(zoo_name: str | None, own: OwnModels, default_task: str | None) -> LocalModels:
    """The zoo's models and task table, or your own (--target, --draft NAME=SOURCE, --task TASK=...).
    As in the service (cluster/models.py): every task is offered the draft-free proposers beside its
    drafts, in a table you wrote too. A task with a draft has a tree (that draft and the draft-free
    proposers), run when named (``tree``), and one with a draft model a cascade (``cascade``)."""
    from .local import open_zoo

    if own.target:
        if zoo_name:
            raise ValueError("--zoo and --target both name the target: give one")
        if not own.drafts:
            raise ValueError("--target alone has nothing to validate: give its drafts with --draft NAME=SOURCE")
        for task, names in own.tasks.items():
            if unknown := [n for n in names if n not in own.drafts and n not in RESERVED]:
                raise ValueError(f"--task {task}= names drafts {unknown}; drafts given: {', '.join(own.drafts)}")
        target, drafts, zoo = own.target, dict(own.drafts), None
        table = {task: (*names, *(p for p in DRAFT_FREE if p not in names)) for task, names in own.tasks.items()}
        table = table or {name: (name, *DRAFT_FREE) for name in drafts}
    else:
        if own.drafts or own.tasks:
            raise ValueError("--draft NAME=SOURCE and --task TASK=... validate your own models: give --target too")
        zoo = open_zoo(zoo_name or DEFAULT_ZOO)
        target, drafts = str(zoo.target_dir), {name: str(zoo.draft_dir(name)) for name in zoo.draft_names}
        table = {task: (*names, *DRAFT_FREE) for task, names in zoo.manifest["task_drafts"].items()}
        if GENERAL_DRAFT in drafts:  # prompts of no particular task, as the service's table has it
            table.setdefault(GENERAL_DRAFT, (GENERAL_DRAFT, *DRAFT_FREE))
    trees = {task: (own_draft, *DRAFT_FREE) for task, names in table.items()
             if (own_draft := next((n for n in names if n in drafts), None))}
    if untreed := [task for task, names in table.items() if TREE in names and task not in trees]:
        raise ValueError(f"--task {untreed[0]}= names {TREE!r}, which needs a draft of that task")
    cascades = {task: model for task, names in table.items()
                if (model := next((n for n in names if n in drafts and is_draft_model(n, drafts[n])), None))}
    if uncascaded := [task for task, names in table.items() if CASCADE in names and task not in cascades]:
        raise ValueError(f"--task {uncascaded[0]}= names {CASCADE!r}, which needs a draft model of that task")
    if default_task is None:  # as the service's: the zoo's general task, or the first of your own
        default_task = next(iter(table)) if own.target else GENERAL_DRAFT if GENERAL_DRAFT in table else None
    return LocalModels(target, drafts, table, default_task, zoo, trees, cascades)


def local_arms(models: LocalModels, prompts: list[Prompt], draft: str | None) -> tuple[list[Prompt], list[list[str]]]:
    """Each prompt with its task resolved, and the proposers it is run with: the one picked, or every
    one its task may use."""
    if draft is not None and draft not in models.drafts and draft not in RESERVED:
        raise ValueError(f"--draft {draft!r} is not a draft of these models: {', '.join(models.drafts)} (or one of "
                         f"{', '.join(RESERVED)})")
    resolved, arms = [], []
    for i, prompt in enumerate(prompts):
        task = prompt.task or models.default_task
        if task is None:
            raise ValueError(f"prompt {i} ({prompt.text[:40]!r}) has no task, and these models have no default "
                             f"task: give each prompt one (JSON lines) or --task TASK")
        if task not in models.tasks:
            raise ValueError(f"prompt {i}: unknown task {task!r}; these models' tasks: {', '.join(models.tasks)} "
                             f"(define one with --task {task}=DRAFT)")
        drafts = [draft] if draft else list(models.tasks[task])
        if not drafts:
            raise ValueError(f"task {task!r} has no proposer to validate: name one with --task {task}=NAME")
        if TREE in drafts and task not in models.trees:
            raise ValueError(f"--draft {TREE}: task {task!r} has no draft model to grow a tree from")
        if CASCADE in drafts and task not in models.cascades:
            raise ValueError(f"--draft {CASCADE}: task {task!r} has no draft model to cascade")
        resolved.append(replace(prompt, task=task))
        arms.append(drafts)
    return resolved, arms


def zoo_prompts(zoo: Zoo) -> list[Prompt]:
    return [Prompt(text, task) for task in zoo.tasks for text in zoo.prompts(task)[:ZOO_PROMPTS_PER_TASK]]
