#!/usr/bin/env bash
# Build the "slim Ray" bundle that runs specserve's Ray Serve service on a GPU machine whose image
# lacks Ray, pydantic, fastapi, ... and which takes at most 64 MiB per command (docs/pages/gpu.md;
# the recipe and what it leaves out of Ray, and why that is safe: ../shared/gpu/README.md).
#   bash make-bundle.sh OUT_DIR [CONSTRAINTS]      # from the project root; default deploy/constraints.txt
# Writes OUT_DIR/ray.tar.xz, deps.tar.xz, transformers.tar.xz: cp312 x86-64 packages at the pins
# of CONSTRAINTS, to untar into one site dir (install.sh). Needs pip reaching PyPI, unzip, strip,
# GNU tar, xz. Wheels are cached in $WHEELS (default ~/.cache/specserve-gpu-wheels); a rerun
# downloads nothing new and writes the same bytes (sorted tar, fixed owner and mtime, xz -T1).
set -Eeuo pipefail
trap 'echo "make-bundle.sh: FAILED (line $LINENO: $BASH_COMMAND)" >&2' ERR
die() { echo "make-bundle.sh: $*" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: make-bundle.sh OUT_DIR [CONSTRAINTS]"
OUT=$1 CONS=${2:-deploy/constraints.txt} PY=${PYTHON:-python3}
[ -f "$CONS" ] || die "no constraints file $CONS (run from the project root, or name it)"
for tool in "$PY" unzip strip tar xz; do command -v "$tool" >/dev/null || die "$tool not found"; done
WHEELS=${WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/specserve-gpu-wheels}
umask 022; export LC_ALL=C
# What Ray core, Ray Serve and specserve import and the GPU image lacks (or holds below our pins).
DEPS="pydantic pydantic-core annotated-types typing-inspection typing-extensions
      fastapi annotated-doc opentelemetry-api starlette uvicorn
      jsonschema jsonschema-specifications referencing rpds-py
      protobuf grpcio grpcio-health-checking grpcio-reflection"
pin() {  # NAME -> NAME==VERSION as CONSTRAINTS pins it (names compared PEP 503-normalized)
  local v; v=$(awk -v n="$1" '{sub(/#.*/, ""); split($0, a, "=="); k = tolower(a[1]); gsub(/[-_.]+/, "-", k)
               gsub(/[ \t]/, "", k); gsub(/[ \t;].*/, "", a[2])} k == n && a[2] != "" {print a[2]; exit}' "$CONS")
  [ -n "$v" ] || die "$1 is not pinned (==) in $CONS"; echo "$1==$v"
}
RAY=$(pin ray); TF=$(pin transformers); SPECS=()
for p in $DEPS; do s=$(pin "$p"); SPECS+=("$s"); done
# The GPU image: CPython 3.12 on x86-64 (glibc >= 2.28). Binary wheels only.
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
mkdir -p "$WHEELS" "$OUT"; OUT=$(cd "$OUT" && pwd) WHEELS=$(cd "$WHEELS" && pwd)
"$PY" -m pip download -q --no-deps "${TARGET[@]}" -d "$WHEELS" "$RAY" "$TF" "${SPECS[@]}"
STAGE=$(mktemp -d); trap 'rm -rf "$STAGE" "$OUT"/*.tar.xz.part' EXIT

# 1. Ray: the wheel unpacked (an untar then installs no console scripts; the dist-info stays for
#    importlib.metadata), less what neither Ray core nor Serve loads.
shopt -s nullglob; whl=("$WHEELS/ray-${RAY#*==}-cp312-cp312-"*.whl); shopt -u nullglob
[ ${#whl[@]} -eq 1 ] || die "expected one cp312 wheel for $RAY in $WHEELS, found ${#whl[@]}"
mkdir "$STAGE/ray" && cd "$STAGE/ray" && unzip -q "${whl[0]}"
# Java workers; the libraries built on Ray that specserve never imports; Cython headers; dev script.
rm -rf ray/jars ray/rllib ray/tune ray/train ray/data ray/llm ray/air ray/workflow ray/serve/llm \
       ray/includes ray/_raylet.pxd ray/setup-dev.py
# The dashboard's web UI (specserve starts Ray without it): only index.html, favicon.ico, an empty
# static/ stay, so a dashboard, were one started, still finds its build folder.
(cd ray/dashboard/client/build && rm -rf speedscope-* static asset-manifest.json && mkdir static)
find ray -type d \( -name tests -o -name examples -o -name __pycache__ \) -prune -exec rm -rf {} +
find ray -name '*.pyi' -delete
# Symbol tables serve debuggers only; the dynamic symbols that the loader and Python use stay.
strip --strip-all ray/core/src/ray/gcs/gcs_server ray/core/src/ray/raylet/raylet
find ray -name '*.so' -exec strip --strip-unneeded {} +
cd - >/dev/null

# 2. The other packages, installed for cp312 from the wheels just fetched (by name, so no
#    direct_url.json records this machine's paths); no scripts, no .pyc, extensions stripped too.
install_to() {  # DIR SPEC...
  local dir=$1; shift
  "$PY" -m pip install -q --no-deps --no-compile --no-index --find-links "$WHEELS" --root-user-action=ignore \
    "${TARGET[@]}" --target "$dir" "$@"
  rm -rf "$dir/bin"; find "$dir" -name '*.so' -exec strip --strip-unneeded {} +
}
install_to "$STAGE/deps" "${SPECS[@]}"
install_to "$STAGE/transformers" "$TF"   # the image holds an older transformers

# 3. The archives: written beside, then moved in place (no half-written archive is left).
pack() {  # NAME: STAGE/NAME's entries -> OUT/NAME.tar.xz
  local f="$OUT/$1.tar.xz"
  (cd "$STAGE/$1" && find . -mindepth 1 -maxdepth 1 -printf '%P\n' | sort \
     | tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@1577836800 -cf - -T -) \
    | xz -9e -T1 > "$f.part"
  mv -f "$f.part" "$f"; size "$1.tar.xz" "$(stat -c %s "$f")" "$(sha256sum < "$f" | cut -c1-16)"
}
size() { awk -v n="$1" -v b="$2" -v x="$3" 'BEGIN {printf "%-18s %9d bytes %5.1f MiB  %s\n", n, b, b / 1048576, x}'; }
for name in ray deps transformers; do pack "$name"; done
size total "$(cat "$OUT"/{ray,deps,transformers}.tar.xz | wc -c)" "(+ working tree + zoo: under 64 MiB a command)"
# The unpacking script travels with the bundle (the ../shared folder does not reach the GPU machine).
cp -f "$(dirname "$0")/install.sh" "$OUT/install.sh"
