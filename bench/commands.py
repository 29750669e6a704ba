"""The bench's commands that the ``specserve`` command line lists without importing them (each
module imports torch and Ray at its top): their names, modules and lines of help."""

from __future__ import annotations

from specserve.cluster.commands.lazy import LazyCommand

HOST_PATH = LazyCommand("host-path", "specserve.bench.host_path",
                        "the service's CPU per token in each process, on models whose pass costs next to nothing")
SHARED_PREFIX = LazyCommand("shared-prefix", "specserve.bench.shared_prefix",
                            "prefix caching: one long system prompt, many questions, the cache on and off")
JSON_SCHEMA = LazyCommand("json-schema", "specserve.bench.json_schema",
                          "structured output: speculation's speedup with and without a JSON schema")
