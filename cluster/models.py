"""Which models the service runs: the zoo's, or explicit sources, and the drafts each task may use."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from specserve.router.config import RouterConfig
from specserve.workers.proposer_kinds import CASCADE, DRAFT_FREE, RESERVED, TREE, VERSION_MARK
from specserve.workers.heads.format import HeadFormatError, is_head, read_config, read_facts
from specserve.workers.heads.medusa import is_medusa, read_medusa_config
from specserve.workers.heads.mtp import MTP, is_mtp, read_mtp_config
from specserve.workers.loading import ModelSpec, load_config, load_tokenizer
from specserve.workers.quantization import check_quantization
from specserve.workers.token_bridge import bridge_if_needed
from specserve.cluster.zoo.zoo import GENERAL_DRAFT

from .config import ModelsConfig

log = logging.getLogger("specserve.models")


@dataclass(frozen=True)
class ModelSet:
    target: str  # a Hugging Face directory or hub id
    drafts: dict[str, str]  # draft name -> source
    tasks: dict[str, tuple[str, ...]]  # task -> proposers allowed to serve it (drafts preferred first, then draft-free ones)
    dtype: str
    # task -> draft -> acceptance measured before serving: the routing policy's priors. The zoo's
    # held-out evaluation (for the zoo's own drafts only), then a `specserve validate` profile over it.
    priors: dict[str, dict[str, float]] = field(default_factory=dict)
    draft_free: tuple[str, ...] = ()  # the draft-free proposers configured (router.draft_free)
    trees: dict[str, tuple[str, ...]] = field(default_factory=dict)  # task -> its token tree's members
    cascades: dict[str, str] = field(default_factory=dict)  # task -> the draft model its cascade runs
    on_replica: frozenset[str] = frozenset()  # heads fed by hidden states that the target replicas serve
    quantize: dict[str, str] = field(default_factory=dict)  # draft model -> its weights' quantization

    @property
    def medusa(self) -> frozenset[str]:
        """The drafts that are Medusa heads: the target replicas serve them, not the draft pool."""
        return frozenset(name for name, source in self.drafts.items() if is_medusa(source))

    @property
    def on_verifier(self) -> frozenset[str]:
        """The drafts the target replicas serve, whose proposals come with each verdict: Medusa heads
        and the heads ``models.on_replica`` names."""
        return self.medusa | self.on_replica

    @property
    def proposers(self) -> tuple[str, ...]:
        """Every name a request may ask for: the drafts, the draft-free proposers configured, the tree,
        the cascade."""
        return (*self.drafts, *self.draft_free, *((TREE,) if self.trees else ()), *((CASCADE,) if self.cascades else ()))

    def spec(self, source: str, threads: int) -> ModelSpec:
        return ModelSpec(source, dtype=self.dtype, threads=threads)

    def draft_spec(self, name: str, threads: int) -> ModelSpec:
        """How the draft pool loads draft ``name``: as ``spec``, quantized where ``models.quantize`` says."""
        return ModelSpec(self.drafts[name], dtype=self.dtype, threads=threads, quantize=self.quantize.get(name))


def resolve_models(models: ModelsConfig, router: RouterConfig) -> ModelSet:
    """Sources and the task table, checked for consistency before anything is deployed."""
    target, drafts, tasks, priors = models.target, dict(models.drafts), dict(router.tasks), {}
    listed = bool(tasks)  # an operator's table: its tasks and drafts (trees only where named)
    if models.zoo is not None:
        from .local import open_zoo

        zoo = open_zoo(models.zoo)
        own = not target  # the zoo's drafts were distilled from (and evaluated against) the zoo's target
        target = target or str(zoo.target_dir)
        drafts = {name: str(zoo.draft_dir(name)) for name in zoo.draft_names} | drafts
        if own:
            priors = {task: {d: a for d, a in row.items() if d not in models.drafts}
                      for task, row in zoo.manifest.get("acceptance", {}).items()}
        tasks = tasks or {task: tuple(names) for task, names in zoo.manifest["task_drafts"].items()}
        if GENERAL_DRAFT in drafts:  # prompts of no particular task
            tasks.setdefault(GENERAL_DRAFT, (GENERAL_DRAFT,))
    # A target that carries an MTP module specserve runs drafts with it: draft "mtp", after each
    # task's own drafts (an operator's table serves it where it names it).
    carried = (not listed or any(MTP in names for names in tasks.values())) and carried_mtp(target, drafts)
    tasks = tasks or {name: (name,) for name in drafts}  # explicit drafts, no table: one task per draft
    if carried:
        drafts[MTP] = str(target)
        if not listed:  # a target alone: one task, the default, served by its module
            tasks = {task: (*names, MTP) for task, names in tasks.items()} or {router.default_task: (MTP,)}
    if not tasks:  # no drafts at all: one task, served by the draft-free proposers
        if not router.draft_free:
            raise ValueError("no drafts and router.draft_free is empty: nothing to speculate with; give drafts "
                             "(models.drafts) or leave router.draft_free at its default")
        tasks = {router.default_task: ()}
    taken = sorted(set(drafts) & set(RESERVED))
    if taken:
        raise ValueError(f"draft names {taken} are reserved for specserve's own proposers; rename those drafts")
    if marked := sorted(name for name in drafts if VERSION_MARK in name):  # a version's name: draft@version
        raise ValueError(f"draft names {marked} hold {VERSION_MARK!r}, which names a draft's versions (canaries); "
                         f"rename those drafts")
    if unknown_tasks := [task for task in router.as_written if task not in tasks]:
        raise ValueError(f"router.as_written names tasks {unknown_tasks}; tasks: {', '.join(sorted(tasks))}")
    for task, names in tasks.items():
        unknown = [name for name in names if name not in drafts and name not in RESERVED]
        if unknown or not (names or router.draft_free and task not in router.as_written):
            raise ValueError(f"router.tasks[{task!r}] names drafts {unknown or '[]'}; known drafts: "
                             f"{', '.join(sorted(drafts))} (draft-free: {', '.join(DRAFT_FREE)})")
        if not_offered := [name for name in names if name in DRAFT_FREE and name not in router.draft_free]:
            raise ValueError(f"router.tasks[{task!r}] names {not_offered}, which router.draft_free does not offer")
    # The draft-free proposers serve beside every task's drafts (router/config.py says why), unless
    # the operator took the task's entry as written.
    tasks = {task: tuple(names) if task in router.as_written else (*names, *(p for p in router.draft_free if p not in names))
             for task, names in tasks.items()}
    trees = {}  # a task's tree (its first draft and the draft-free proposers), for a request that asks for one
    for task, names in tasks.items():
        # Medusa heads propose a tree of their own, which a token tree would verify as a chain; a head
        # the replicas serve proposes with the verdict, not when a tree asks.
        own = next((name for name in names if name in drafts and not is_medusa(drafts[name])
                    and name not in models.on_replica), None)
        if own and router.draft_free:
            trees[task] = (own, *router.draft_free)
            # AUTO serves it only where offered. No prior: it accepts at least what its draft does,
            # but its width and the draft's time cost what only serving it measures.
            if TREE not in names and router.trees and not listed:
                tasks[task] = tuple(names) + (TREE,)
        elif TREE in names:
            raise ValueError(f"router.tasks[{task!r}] names {TREE!r}, which needs a draft and router.draft_free")
    cascades = {}  # a task's cascade: its first draft model (heads draft in passes of their own)
    for task, names in tasks.items():
        if model := next((name for name in names if name in drafts and is_draft_model(name, drafts[name])), None):
            cascades[task] = model
            # AUTO serves it only where offered. No prior: it proposes what its draft does, and past
            # k where prompt lookup agrees, at a cost only serving it measures.
            if CASCADE not in names and router.cascades and not listed:
                tasks[task] = tuple(names) + (CASCADE,)
        elif CASCADE in names:
            raise ValueError(f"router.tasks[{task!r}] names {CASCADE!r}, which needs a draft model (not heads) "
                             f"among the task's drafts")
    if router.default_task not in tasks:
        raise ValueError(f"router.default_task {router.default_task!r} is not a task; tasks: {', '.join(sorted(tasks))}")
    for name, source in drafts.items():  # heads: distill's held-out acceptance, where they serve
        alpha = read_facts(source).get("held_out_alpha") if is_head(source) or is_medusa(source) else None
        for task, names in tasks.items():
            if alpha is not None and name in names:
                priors.setdefault(task, {}).setdefault(name, float(alpha))
    if models.priors:
        for task, row in read_priors(models.priors, tasks, drafts).items():
            priors[task] = priors.get(task, {}) | row
    fed = sorted(name for name, source in drafts.items() if is_head(source))
    if not_drafts := [name for name in models.on_replica if name not in drafts]:
        raise ValueError(f"models.on_replica names {not_drafts}, which are not among the drafts served "
                         f"({', '.join(sorted(drafts)) or 'none'}; a target's own MTP module is draft {MTP!r} where "
                         f"a task serves it)")
    if not_heads := [name for name in models.on_replica if name not in fed]:
        raise ValueError(f"models.on_replica names {not_heads}, which are no heads fed by the target's hidden states "
                         f"(an MTP module, an EAGLE-3 head); those among the drafts: {', '.join(fed) or 'none'}")
    _check_quantized(models.quantize, drafts)
    return ModelSet(target=str(target), drafts=drafts, tasks=tasks, dtype=models.dtype, priors=priors,
                    draft_free=router.draft_free, trees=trees, cascades=cascades,
                    on_replica=frozenset(models.on_replica), quantize=dict(models.quantize))


def _check_quantized(quantize: dict[str, str], drafts: dict[str, str]) -> None:
    """``models.quantize`` names draft models only, each with a quantization offered."""
    for name, kind in quantize.items():
        if name not in drafts:
            raise ValueError(f"models.quantize names {name!r}, which is no draft here; the drafts are "
                             f"{', '.join(drafts) or 'none'} (a target is not quantized: that would serve "
                             f"another model)")
        if not is_draft_model(name, drafts[name]):
            raise ValueError(f"models.quantize names {name!r}, which is a head of the target's (EAGLE-3, Medusa, "
                             f"MTP), not a draft model; only draft models are served quantized so far")
        try:
            check_quantization(kind)
        except ValueError as exc:
            raise ValueError(f"models.quantize.{name}: {exc}") from None


def is_draft_model(name: str, source: str) -> bool:
    """A draft model (a causal LM on the draft workers), not heads of the target's (EAGLE-3,
    Medusa, its MTP module)."""
    return name != MTP and not is_head(source) and not is_medusa(source)


def carried_mtp(target: str | None, drafts: dict[str, str]) -> bool:
    """Whether ``target`` carries an MTP module specserve runs, to serve as draft "mtp" (a draft of
    that name given already is served instead). One it cannot run is said and left out: the target
    serves as it did."""
    if not target or MTP in drafts or not is_mtp(target):
        return False
    try:
        read_mtp_config(target)
    except HeadFormatError as exc:
        log.warning("the target's MTP module is not served: %s", exc)
        return False
    return True


def read_priors(path: str, tasks: dict[str, tuple[str, ...]], drafts: dict[str, str]) -> dict[str, dict[str, float]]:
    """A profile written by `specserve validate --profile` ({task: {draft: acceptance}}), checked
    against the models it will start the policy of: known tasks, known drafts, acceptances in [0, 1]."""
    where = f"models.priors ({path})"
    try:
        doc = json.loads(Path(path).expanduser().read_text())
    except FileNotFoundError:
        raise ValueError(f"{where}: no such file; write a profile with `specserve validate --profile FILE`") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where}: not a readable JSON profile: {exc}") from None
    if not isinstance(doc, dict) or not all(isinstance(row, dict) for row in doc.values()):
        raise ValueError(f"{where}: expected a JSON object {{task: {{draft: acceptance}}}}, as `specserve validate "
                         f"--profile` writes")
    for task, row in doc.items():
        if task not in tasks:
            raise ValueError(f"{where}: unknown task {task!r}; these models' tasks: {', '.join(sorted(tasks))}")
        for draft, alpha in row.items():
            if draft not in drafts:
                raise ValueError(f"{where}: task {task!r} names unknown draft {draft!r}; drafts: "
                                 f"{', '.join(sorted(drafts)) or 'none'} (the draft-free proposers take no prior: "
                                 f"the router scores them on its traffic)")
            if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 <= alpha <= 1:
                raise ValueError(f"{where}: the acceptance of draft {draft!r} on task {task!r} must be a number in "
                                 f"[0, 1], got {alpha!r}")
    return {task: {draft: float(alpha) for draft, alpha in row.items()} for task, row in doc.items()}


def check_medusa(models: ModelSet) -> None:
    """Medusa heads for another target are refused in one line before the replicas load them."""
    if models.medusa:
        target = load_config(models.target)
        for name in sorted(models.medusa):
            try:
                read_medusa_config(models.drafts[name], target)
            except HeadFormatError as exc:
                raise HeadFormatError(f"draft {name!r}: {exc}") from None


def head_layers(models: ModelSet) -> dict[str, tuple[int, ...]]:
    """The drafts that are EAGLE-3 heads, each checked against the target (a head for another target
    is refused in one line), with the target hidden states it reads."""
    heads = {name: source for name, source in models.drafts.items() if is_head(source)}
    if not heads:
        return {}
    target = load_config(models.target)
    layers = {}
    for name, source in heads.items():
        try:
            layers[name] = read_config(source, target).aux_layers
        except HeadFormatError as exc:
            raise HeadFormatError(f"draft {name!r}: {exc}") from None
    return layers


def check_tokenizers(models: ModelSet) -> PreTrainedTokenizerBase:
    """The target's tokenizer, once every draft's is checked against it: token ids cross between the
    models, so a draft of another vocabulary drafts through the tokens the two share (logged with a
    note; refused where they share too few: workers/token_bridge.py), and a source that is no model
    fails to load. An EAGLE-3 head has the target's vocabulary by construction (``head_layers``
    checks it), and so have Medusa heads (checked as the replicas load them)."""
    tokenizer = load_tokenizer(models.target)
    for name, source in models.drafts.items():
        if is_head(source) or name in models.medusa:
            continue
        bridge_if_needed(tokenizer, source, load_config(source).vocab_size, name)
    return tokenizer
