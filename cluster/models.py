"""Which models the service runs: the zoo's, or explicit sources, and the drafts each task may use."""

from __future__ import annotations

from dataclasses import dataclass

from specserve.router.config import RouterConfig
from specserve.workers.loading import ModelSpec
from specserve.workers.zoo.presets import GENERAL_DRAFT

from .config import ModelsConfig


@dataclass(frozen=True)
class ModelSet:
    target: str  # a Hugging Face directory or hub id
    drafts: dict[str, str]  # draft name -> source
    tasks: dict[str, tuple[str, ...]]  # task -> drafts allowed to serve it, preferred first
    dtype: str

    def spec(self, source: str, threads: int) -> ModelSpec:
        return ModelSpec(source, dtype=self.dtype, threads=threads)


def resolve_models(models: ModelsConfig, router: RouterConfig) -> ModelSet:
    """Sources and the task table, checked for consistency before anything is deployed."""
    target, drafts, tasks = models.target, dict(models.drafts), dict(router.tasks)
    if models.zoo is not None:
        from .local import open_zoo

        zoo = open_zoo(models.zoo)
        target = target or str(zoo.target_dir)
        drafts = {name: str(zoo.draft_dir(name)) for name in zoo.draft_names} | drafts
        tasks = tasks or {task: tuple(names) for task, names in zoo.manifest["task_drafts"].items()}
        if GENERAL_DRAFT in drafts:  # prompts of no particular task
            tasks.setdefault(GENERAL_DRAFT, (GENERAL_DRAFT,))
    tasks = tasks or {name: (name,) for name in drafts}  # explicit drafts, no table: one task per draft
    for task, names in tasks.items():
        unknown = [name for name in names if name not in drafts]
        if unknown or not names:
            raise ValueError(f"router.tasks[{task!r}] names drafts {unknown or '[]'}; known drafts: {', '.join(sorted(drafts))}")
    if router.default_task not in tasks:
        raise ValueError(f"router.default_task {router.default_task!r} is not a task; tasks: {', '.join(sorted(tasks))}")
    return ModelSet(target=str(target), drafts=drafts, tasks=tasks, dtype=models.dtype)
