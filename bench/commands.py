"""The bench's commands that the ``specserve`` command line lists without importing them (each
module imports torch and Ray at its top): their names, modules and lines of help. The scripts (the
last group) parse their own arguments; each also runs as ``python -m specserve.bench.MODULE``."""

from __future__ import annotations

from specserve.cluster.commands.lazy import LazyCommand

HOST_PATH = LazyCommand("host-path", "specserve.bench.host_path",
                        "the service's CPU per token in each process, on models whose pass costs next to nothing")
SHARED_PREFIX = LazyCommand("shared-prefix", "specserve.bench.shared_prefix",
                            "prefix caching: one long system prompt, many questions, the cache on and off")
JSON_SCHEMA = LazyCommand("json-schema", "specserve.bench.json_schema",
                          "structured output: speculation's speedup with and without a JSON schema")

# Operators' tools
SOAK = LazyCommand("soak", "specserve.bench.soak", "minutes of mixed traffic while workers are killed and frozen at "
                   "random; every output checked against target-only", script=True)
SHIFT = LazyCommand("shift", "specserve.bench.shift", "one task's traffic moves to another corpus and the service "
                    "catches up (an alert, a head distilled from its traffic, promoted as a canary), every step timed", script=True)
PLAN_CHECK = LazyCommand("plan-check", "specserve.bench.plan_check", "the capacity planner calibrated on one "
                         "`specserve bench` run and scored on others", script=True)
GPU_BENCH = LazyCommand("gpu-bench", "specserve.bench.gpu", "in-process timings on a CUDA device, one report (what "
                        "`make gpu-check` runs)", script=True)
CARRY = LazyCommand("carry", "specserve.bench.carry", "a zoo rounded to bfloat16, small enough to carry to a lent GPU "
                    "machine", script=True)
# Studies
REAL_MODEL = LazyCommand("real-model", "specserve.bench.real_model", "speculation on a real pretrained model (a "
                         "directory or GGUF): draft-free proposers and auto through the service", script=True)
TEXT_DRAFT = LazyCommand("text-draft", "specserve.bench.text_draft", "train a draft for any target by its text, in "
                         "a tokenizer of its own or the target's", script=True)
BRIDGE_MODES = LazyCommand("bridge-modes", "specserve.bench.bridge_modes", "a draft of another tokenizer two ways, "
                           "the token intersection served and conversion through text, side by side", script=True)
QUANTIZED_DRAFTS = LazyCommand("quantized-drafts", "specserve.bench.quantized", "each task's draft with int8 weights "
                               "beside its float self: memory, alpha and speedup in process", script=True)
CASCADES = LazyCommand("cascades", "specserve.bench.cascade", "each task's draft, prompt lookup, and the draft under "
                       "prompt lookup at each min-p, side by side in process", script=True)
