"""A zoo made small enough to carry to a lent GPU machine: its weights rounded to bfloat16.

A lent GPU machine takes at most 64 MiB with each command (the working tree included) and can
download nothing. The demo zoo is 146 MB with its corpora and distillation data, 62 MB without
them, 32 MB in bfloat16 (44 MB with its corpora and classifier, which the benches read). Rounding changes no identity check (both sides of a comparison run the
same weights) and shifts acceptance slightly; the float32 rows of a GPU run then use the rounded
weights cast up.

    specserve carry --zoo ~/.cache/specserve/zoo/demo --out .gpu_zoo/demo

`.ci/gpu-carry` runs this and fetches the wheels the machine lacks (docs/pages/gpu.md).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

# What no GPU check reads: the distillation sets. The corpora (12 MB of text, ~2 MB in the xz that
# .ci/gpu-carry packs) and the task classifier stay: the benches read them (the host-path zoo takes
# its prompts and classifier from this zoo; routing classifies prompts).
LEFT_BEHIND = ("distill",)


def carry(zoo: Path, out: Path) -> int:
    """Copy ``zoo`` to ``out`` without what is left behind, floating-point weights in bfloat16;
    the bytes written."""
    written = 0
    for path in sorted(zoo.rglob("*")):
        relative = path.relative_to(zoo)
        if path.is_dir() or relative.parts[0] in LEFT_BEHIND:
            continue
        target = out / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".safetensors":
            tensors = {name: (t.to(torch.bfloat16) if t.is_floating_point() else t).contiguous()
                       for name, t in load_file(path).items()}
            save_file(tensors, target, metadata={"format": "pt"})
        else:
            shutil.copy(path, target)
        written += target.stat().st_size
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="specserve carry", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zoo", type=Path, required=True, help="a built zoo's directory")
    parser.add_argument("--out", type=Path, required=True, help="where the carried copy goes (replaced)")
    args = parser.parse_args(argv)
    if not (args.zoo.expanduser() / "manifest.json").is_file():
        raise SystemExit(f"{args.zoo} holds no built zoo (no manifest.json): `make demo` builds the demo zoo")
    shutil.rmtree(args.out, ignore_errors=True)
    written = carry(args.zoo.expanduser(), args.out)
    print(f"{args.out}: {written / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
