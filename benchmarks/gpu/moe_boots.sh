#!/bin/bash
# On the GPU machine, after the kit's staging (../shared/gpu/README.md), from the repo root with
# shape_dirs.py's output in .gpu/shapes: boot the given specs with vLLM's dummy loader and the
# probe plugin (vllm_probe.py), keeping state in /root/boots between calls; the logs and probe
# snapshots come back as $OUT/boots.tgz.
#   DEADLINE=430 bash benchmarks/gpu/moe_boots.sh deepseek-v3-4l:0.90:eager:1 ...
set -uo pipefail
source .gpu/kit/device_env.sh
python3 benchmarks/gpu/vllm_probe.py /root/probe
export PYTHONPATH=/root/probe:$PWD/src:$PYTHONPATH
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
python3 benchmarks/gpu/boots.py --out /root/bootsout --state /root/boots --deadline "${DEADLINE:-540}" \
  --limit "${LIMIT:-300}" --shapes "$PWD/.gpu/shapes" --probe "$@" 2>&1 | tee -a "$OUT/boots.log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/boots.log"
tar -C /root/boots -czf "$OUT/boots.tgz" .
ls -la "$OUT"
