"""Regenerate the Python stubs from the .proto files: `python -m specserve.proto.generate`.

The stubs are committed (so installing specserve needs no protoc) and a test regenerates them into
a temporary directory and fails when they differ. protoc sees ``proto/`` as ``specserve/proto/`` so
the generated imports are ``specserve.proto.v1...``, the installed package's own names.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
PROTO_FILES = ("v1/specserve.proto", "v1/internal.proto")
IMPORT_PREFIX = "specserve/proto"


def generate(out_dir: Path) -> list[Path]:
    """Write the stubs under out_dir, laid out as under proto/; return their paths relative to it."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as raw:
        argv = ["protoc", f"-I{IMPORT_PREFIX}={PROTO_ROOT}", f"--python_out={raw}", f"--pyi_out={raw}",
                f"--grpc_python_out={raw}", *(f"{PROTO_ROOT}/{name}" for name in PROTO_FILES)]
        if protoc.main(argv) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(argv)}")
        produced = Path(raw) / IMPORT_PREFIX
        written = []
        for path in sorted(produced.rglob("*.py*")):
            relative = path.relative_to(produced)
            (out_dir / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out_dir / relative)
            written.append(relative)
        return written


if __name__ == "__main__":
    for name in generate(PROTO_ROOT):
        print(f"wrote proto/{name}")
    sys.exit(0)
