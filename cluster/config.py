"""The service's typed configuration: one model per component, each default defined here once.

`deploy/serve_config.yaml` carries a `ServiceConfig` as its application's `args`; `specserve serve`
and KubeRay deploy that same file. Unknown keys are errors, so a typo in the YAML is not silently
ignored.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from specserve.workers.request import DEFAULT_K, MAX_K
from specserve.workers.zoo.presets import GENERAL_DRAFT

NAMESPACE = "specserve"  # the Ray namespace of the registry and the draft pool
TARGET_DEVICE = "specserve_target_device"  # custom resources standing in for devices without GPUs
DRAFT_DEVICE = "specserve_draft_device"
DEFAULT_PORT = 50051  # the client API (gRPC's customary port)


class _Config(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelsConfig(_Config):
    """Where the models come from: a zoo (preset name or directory), or explicit sources.

    `target` and `drafts` (Hugging Face directories or hub ids) override the zoo's; with no zoo both
    are required.
    """

    zoo: str | None = "demo"
    target: str | None = None
    drafts: dict[str, str] = Field(default_factory=dict)
    dtype: str = "auto"  # bfloat16 on CUDA, float32 on CPU

    @model_validator(mode="after")
    def _has_models(self) -> ModelsConfig:
        if self.zoo is None and (self.target is None or not self.drafts):
            raise ValueError("models: give a zoo, or both target and drafts")
        return self


class WorkerConfig(_Config):
    """How a model process runs: its device, its threads and (on CPU) its cores."""

    # "auto": one GPU each when the cluster has GPUs, else one unit of `device_resource`.
    device: str = Field("auto", pattern="^(auto|gpu|resource)$")
    device_resource: str
    gpus: float = Field(1.0, gt=0)  # per process when on GPUs (fractions share a GPU)
    threads: int = Field(1, ge=1)  # torch intra-op threads
    # Cores to pin the model's compute thread to on CPU (os.sched_setaffinity), so processes that
    # stand for separate devices do not fight over the same cores. Empty: no pinning.
    cpus: tuple[int, ...] = ()
    max_sessions: int = Field(64, ge=1)  # concurrent sessions (streams) this process accepts


class TargetConfig(WorkerConfig):
    device_resource: str = TARGET_DEVICE
    replicas: int = Field(1, ge=1)


class DraftPoolConfig(WorkerConfig):
    device_resource: str = DRAFT_DEVICE
    workers: int = Field(2, ge=1)
    drafts: tuple[str, ...] = ()  # the drafts every worker serves; empty: all of them


class RouterConfig(_Config):
    host: str = "0.0.0.0"
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)  # 0: any free port (tests)
    max_concurrent_requests: int = Field(32, ge=1)  # beyond it: RESOURCE_EXHAUSTED
    default_k: int = Field(DEFAULT_K, ge=1, le=MAX_K)
    default_task: str = GENERAL_DRAFT  # for requests that name no task
    # Greedy requests: draft the next proposal while the target verifies this one (router/session.py).
    lookahead: bool = True
    # The drafts allowed to serve each task, preferred first. Empty: the zoo's own table.
    tasks: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    # How often workers re-register and how long an entry lives without that.
    heartbeat_seconds: float = Field(2.0, gt=0)


class ServiceConfig(_Config):
    models: ModelsConfig = ModelsConfig()
    target: TargetConfig = TargetConfig()
    draft_pool: DraftPoolConfig = DraftPoolConfig()
    router: RouterConfig = RouterConfig()
    namespace: str = NAMESPACE


def load_yaml(path: Path) -> dict:
    import yaml

    try:
        return yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not valid YAML: {exc}") from exc
