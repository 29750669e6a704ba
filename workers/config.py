"""How a model process runs: the typed configs of target replicas and draft workers.

Each default is defined here once; ``cluster/config.py`` composes these into the service's config.
Unknown keys are errors, so a typo in the YAML is not silently ignored.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .sim_device import SimConfig

# Custom resources standing in for devices without GPUs: only nodes of a kind advertise its resource.
TARGET_DEVICE = "specserve_target_device"
DRAFT_DEVICE = "specserve_draft_device"

# A session's prompt rows attend in blocks of this many region slots, each over the slots up to its
# end, and a prompt is cut into chunks only at such a boundary: what attention computes for a row
# is then fixed by the session alone, not by how its prompt was chunked to share passes. (An SDPA
# call rounds a row differently with more query rows or more keys, even masked ones: one 51-token
# prompt prefilled whole and in chunks of 32 and 19 gave logits 1e-6 apart, enough to move a top-p
# nucleus edge and a sampled token; tests/test_batching.py.)
ATTENTION_BLOCK = 32
# Each block is one more attention call per layer: on the host-path zoo's 16 prompts of 100 tokens
# in one pass, 22 ms unsplit, 29 ms in blocks of 32, 39 in blocks of 16. A prompt's last block and
# its rows with logits go in one segment, so a pass needs room for ATTENTION_BLOCK - 1 + MAX_K + 1
# rows (48; batching.max_tokens_per_pass is at least 64).


class FrozenConfig(BaseModel):
    """The base of every specserve config: immutable, and unknown keys refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class BatchingConfig(FrozenConfig):
    """How a process batches its sessions' steps into forward passes (continuous batching).

    Its device thread runs one pass at a time; each pass takes the steps pending at that moment, up
    to these limits, so sessions join and leave between passes. ``max_sessions_per_pass: 1`` turns
    batching off (one session per pass, first come first served).
    """

    max_sessions_per_pass: int = Field(32, ge=1)
    # Tokens one pass may run over all its sessions. A prompt longer than what is left is cut into
    # chunks that ride along with decode steps (chunked prefill), so it never stalls them.
    max_tokens_per_pass: int = Field(512, ge=64)  # >= a prompt's last attention block and a verify step (48)
    # Prefer passes of one task (code, sql, ...): a step of another task waits at most this long
    # for its task's turn. 0: passes take every pending step (the default; see the bench's load notes).
    same_task_wait_ms: float = Field(0.0, ge=0)
    # On CUDA, passes of up to 16 tokens a session (decode and verify steps, token trees) replay CUDA
    # graphs captured per bucket of sessions, rows a session and key length (workers/graphs.py); other
    # passes run eagerly, and on a CPU every pass does unless ``compiled``.
    cuda_graphs: bool = True
    # Decode passes run the model compiled (torch.compile) at the same bucketed shapes, where no CUDA
    # graph captures them (a CPU): a small model's pass is mostly per-operation overhead, which this
    # removes (the demo zoo's drafts: 2.2x a pass). Compiled at start-up, seconds with inductor's
    # on-disk cache, about a minute without (workers/graphs.py). Draft workers turn it on.
    compiled: bool = False
    # While no new step waits, a pass whose steps all need more passes (a draft's k tokens, a prompt
    # in chunks) is followed by the next on the device thread at once, not after a hop to the event
    # loop and back (1.6-2.4 ms a draft step on the 2-core host). A step that arrives, or is
    # abandoned, ends the run of passes at the next boundary, as it would join or leave a pass.
    back_to_back: bool = True
    # On a simulated device (workers/sim_device.py), plan and launch the next pass while one runs,
    # reading each pass's results when the device would end it (SGLang's overlap scheduler, vLLM's
    # async scheduling): the host's work between passes leaves the device idle no longer. A real
    # device's pass is its math on this thread, so there it changes nothing.
    overlap: bool = True


class WorkerConfig(FrozenConfig):
    """How a model process runs: its device, its threads and (on CPU) its cores."""

    # Every process takes one unit of `device_resource` (only nodes of its kind advertise it), and
    # on GPUs its GPU too. "auto": on GPUs when the nodes of its kind have them (so CPU draft nodes
    # in a GPU cluster keep drafts on CPU); "gpu": always; "resource": the custom resource alone.
    # "sim": placed as "resource", its passes timed as an accelerator's (``sim``; workers/sim_device.py).
    device: str = Field("auto", pattern="^(auto|gpu|resource|sim)$")
    sim: SimConfig = SimConfig()  # read where device is "sim"
    device_resource: str
    gpus: float = Field(1.0, gt=0)  # per process when on GPUs (fractions share a GPU)
    threads: int = Field(1, ge=1)  # torch intra-op threads
    # Cores to pin the model's compute thread to on CPU (os.sched_setaffinity), so processes that
    # stand for separate devices do not fight over the same cores. Empty: no pinning.
    cpus: tuple[int, ...] = ()
    max_sessions: int = Field(64, ge=1)  # concurrent sessions (streams) this process accepts
    # KV cache memory this process may hold over all its sessions. A session reserves what its
    # longest possible sequence needs when it opens; one that does not fit is refused (the router
    # opens it on another replica, or waits for room), so memory is bounded however requests arrive.
    kv_cache_mib: float = Field(4096, gt=0)
    # On a GPU, the KV budget is sized from the card instead (as vLLM's gpu_memory_utilization): this
    # share of the GPU's memory, times the process's `gpus` where it shares the card, less what the
    # process holds after loading its models. null: kv_cache_mib on GPUs too. CPUs use kv_cache_mib.
    gpu_memory_utilization: float | None = Field(0.9, gt=0, le=1)
    # Reuse the keys and values of prompt prefixes other sessions computed (workers/prefix_cache.py):
    # a shared system prompt is prefilled once, and kept while the memory is not needed. Exact: the
    # output is the same with it off.
    prefix_caching: bool = True
    # A session whose router sent nothing for this long is evicted, its cache freed: the router
    # died without closing the stream, or hangs. Routers wait at most a target step or a target
    # wait (router.timeouts) between steps, well under this.
    session_idle_seconds: float = Field(120.0, gt=0)
    batching: BatchingConfig = BatchingConfig()


class ScalingDelays(FrozenConfig):
    """How long a need must last before processes are added or removed. Adding waits less: a process
    takes seconds to minutes to load its models, and sessions meanwhile share passes; removing waits
    long, so a lull between bursts does not throw away capacity the next burst needs."""

    upscale_delay_s: float = Field(10.0, ge=0)
    downscale_delay_s: float = Field(120.0, ge=0)
    metrics_interval_s: float = Field(2.0, gt=0)  # how often processes report their load


class Autoscaling(ScalingDelays):
    """Target replicas added and removed with the load: Serve's autoscaler, with specserve's policy
    (``cluster/autoscaling.py``). A replica's capacity is the widest pass its start-up timings say
    keeps a token within ``tpot_budget_ms`` (one token a session a pass: target-only, the widest
    case); the policy asks for as many replicas as the live sessions fill at that capacity."""

    min_replicas: int = Field(1, ge=1)
    max_replicas: int = Field(4, ge=1)
    tpot_budget_ms: float = Field(50.0, gt=0)

    @model_validator(mode="after")
    def _bounds(self) -> Autoscaling:
        _check_bounds("target.autoscaling", "replicas", self.min_replicas, self.max_replicas)
        return self


class PoolAutoscaling(ScalingDelays):
    """Draft workers added and removed with the load, by the router that owns the pool
    (``cluster/pool.py``, policy in ``cluster/autoscaling.py``). Its signals are the workers' own:
    live sessions per worker, and how long a draft step waits for its first pass. The pool asks for
    the workers that hold the sessions at ``sessions_per_worker`` each, and one more than it has
    while steps wait longer than ``max_queue_wait_ms`` on average (the workers' passes are full)."""

    min_workers: int = Field(1, ge=1)
    max_workers: int = Field(4, ge=1)
    sessions_per_worker: int = Field(16, ge=1)
    max_queue_wait_ms: float = Field(20.0, gt=0)

    @model_validator(mode="after")
    def _bounds(self) -> PoolAutoscaling:
        _check_bounds("draft_pool.autoscaling", "workers", self.min_workers, self.max_workers)
        return self


def _check_bounds(where: str, what: str, least: int, most: int) -> None:
    if most < least:
        raise ValueError(f"{where}: max_{what} ({most}) is below min_{what} ({least})")


class TargetConfig(WorkerConfig):
    device_resource: str = TARGET_DEVICE
    replicas: int = Field(1, ge=1)  # with autoscaling: how many start (within its bounds)
    autoscaling: Autoscaling | None = None  # None: ``replicas``, fixed


class DraftPoolConfig(WorkerConfig):
    device_resource: str = DRAFT_DEVICE
    # Drafts are small: their passes are what compiling speeds up (a target's pass is its weights' reading).
    batching: BatchingConfig = BatchingConfig(compiled=True)
    workers: int = Field(2, ge=1)  # with autoscaling: how many start (within its bounds)
    autoscaling: PoolAutoscaling | None = None  # None: ``workers``, fixed
    drafts: tuple[str, ...] = ()  # the drafts every worker serves; empty: all of them
    # On a GPU, a worker's KV budget is split in shares, one per draft model it serves plus these,
    # kept free for a draft model's new version (a canary; a promoted one while the sessions of the
    # one it replaces end). 0: every share serves; a draft model's version is then refused until
    # memory frees. CPUs grow their pools with the load and need none kept.
    version_pools: int = Field(1, ge=0)
