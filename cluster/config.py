"""The service's typed configuration, composed of each component's own (each default defined once).

`deploy/serve_config.yaml` carries a `ServiceConfig` as its application's `args`; `specserve serve`
and KubeRay deploy that same file. Every component owns its config type: ``workers/config.py``
(target replicas, the draft pool), ``router/config.py`` (the router, its timeouts and policy); the
models and the Ray namespace are the assembly's, defined here. Unknown keys are errors, so a typo in
the YAML is not silently ignored.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from specserve.router.config import RouterConfig
from specserve.workers.config import ATTENTION_BLOCK, DraftPoolConfig, FrozenConfig, TargetConfig

NAMESPACE = "specserve"  # the Ray namespace of the registry and the draft pool
DEFAULT_METRICS_PORT = 8080  # Prometheus scrapes each node here (KubeRay's convention for Ray metrics)
# The Serve config `specserve serve` deploys and the KubeRay manifest embeds (in a source checkout).
DEFAULT_CONFIG_FILE = Path(__file__).resolve().parent.parent / "deploy" / "serve_config.yaml"


class ModelsConfig(FrozenConfig):
    """Where the models come from: a zoo (preset name or directory), or explicit sources.

    `target` and `drafts` (Hugging Face directories, GGUF files or hub ids) override the zoo's; with
    no zoo a target is required, and with no drafts it is served by the draft-free proposers alone
    (router.draft_free). `priors` is a profile written by `specserve validate --profile`: a JSON
    object {task: {draft: acceptance}} the routing policy starts from, over the zoo's own.
    `on_replica` names drafts that are heads fed by the target's hidden states (an MTP module, an
    EAGLE-3 head) which the target replicas serve, drafting after each verify pass with no trip to
    a draft worker, as vLLM and SGLang run them; the others are the draft pool's. `quantize` serves
    draft models with int8 weights (a quarter of float32's bytes).
    """

    zoo: str | None = "demo"
    target: str | None = None
    drafts: dict[str, str] = Field(default_factory=dict)
    dtype: str = "auto"  # bfloat16 on CUDA, float32 on CPU
    priors: str | None = None  # path of a profile JSON; None: the zoo's own measurements alone
    on_replica: tuple[str, ...] = ()  # heads the target replicas serve (draft "mtp": a target's own module)
    # Draft models served with quantized weights: name -> "int8" (workers/quantization.py). A draft
    # only: the output stays the target's, and only alpha (and the memory) moves.
    quantize: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _has_models(self) -> ModelsConfig:
        if self.zoo is None and self.target is None:
            raise ValueError("models: give a zoo, or a target (and drafts, or none to serve it with the draft-free "
                             "proposers alone)")
        return self


class ServiceConfig(FrozenConfig):
    models: ModelsConfig = ModelsConfig()
    target: TargetConfig = TargetConfig()
    draft_pool: DraftPoolConfig = DraftPoolConfig()
    router: RouterConfig = RouterConfig()
    namespace: str = NAMESPACE

    @model_validator(mode="after")
    def _idle_outlasts_the_routers_waits(self) -> ServiceConfig:
        """A worker evicts a session idle for session_idle_seconds; the router must never leave one
        idle that long in normal operation, or a recovery would cost a second one."""
        waits = self.router.timeouts
        target_waits = waits.target_wait_seconds + waits.target_full_wait_seconds
        if self.draft_pool.session_idle_seconds <= target_waits:
            raise ValueError(
                f"draft_pool.session_idle_seconds ({self.draft_pool.session_idle_seconds:g}) must exceed "
                f"router.timeouts.target_wait_seconds + target_full_wait_seconds ({target_waits:g}): a request's "
                f"draft session idles while the request waits for a target replica (one to come back, then one "
                f"with room), and would be evicted mid-wait")
        draft_wait = waits.draft_prefill_seconds + waits.draft_step_seconds
        if self.target.session_idle_seconds <= draft_wait:
            raise ValueError(
                f"target.session_idle_seconds ({self.target.session_idle_seconds:g}) must exceed "
                f"router.timeouts.draft_prefill_seconds + draft_step_seconds ({draft_wait:g}): a request's target "
                f"session idles while its draft is reopened on another worker, and would be evicted mid-wait")
        return self

    @model_validator(mode="after")
    def _a_tree_fits_a_pass(self) -> ServiceConfig:
        """A token tree's step is one segment, never cut: its nodes and the token before them, after
        at most a prompt's last attention block. A step that fits no pass would wait for ever."""
        rows = self.router.tree_max_tokens + 1 + ATTENTION_BLOCK - 1
        if rows > self.target.batching.max_tokens_per_pass:
            raise ValueError(
                f"router.tree_max_tokens ({self.router.tree_max_tokens}) needs target.batching.max_tokens_per_pass "
                f"of at least {rows} (the tree, the token before it and up to {ATTENTION_BLOCK - 1} prompt tokens "
                f"in one segment), not {self.target.batching.max_tokens_per_pass}: raise it or lower the tree's")
        return self


def load_yaml(path: Path) -> dict:
    import yaml

    try:
        return yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not valid YAML: {exc}") from exc
