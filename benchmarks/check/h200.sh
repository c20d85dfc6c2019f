#!/bin/bash
# On the two-GPU H200 machine: tandem check --fabric (NCCL, one rank per GPU, as two nodes),
# then a plain torchrun all-reduce benchmark, in one run. Results land in $OUT.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -5
python3 -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count(), 'nccl', torch.cuda.nccl.version())"
for cluster in netns loopback; do
  echo "=== tandem check --fabric ($cluster) ==="
  timeout 300 python3 -m tandem.cli check benchmarks/check/h200-recipe.yaml \
      --cluster benchmarks/check/h200-$cluster.yaml --fabric --json > "$OUT/check-$cluster.json" 2> "$OUT/check-$cluster.err"
  echo "exit $?"; tail -5 "$OUT/check-$cluster.err"
  python3 - "$OUT/check-$cluster.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as exc:
    print("no report:", exc); sys.exit(0)
f = r["fabric"]
print("findings:", [(x["severity"], x["rule"], x["message"][:120]) for x in r["findings"]])
if f:
    print("ok", f["ok"], "backend", f["backend"], "world", f["world_size"], "nccl", f.get("nccl_version"),
          "transports", f["transports"], "network", f["nccl_network"], "error", f["error"])
    for s in f["sizes"]:
        print(f"  {s['bytes']:>11}  {s['time_us']:>10.1f} us  busbw {s['busbw_gbps']:8.2f} GB/s")
    print("  peak busbw", f["peak_busbw_gbps"], "GB/s; 8-byte latency", f["small_message_latency_us"], "us")
    print("  rank0 env", f["rank_env"].get("0"))
PY
done
echo "=== plain torchrun all-reduce ==="
timeout 200 torchrun --nproc-per-node 2 benchmarks/check/plain_allreduce.py 2>&1 | grep -v "^W" | tee "$OUT/plain.txt" | grep PLAIN_ALLREDUCE | python3 -c "
import json,sys
d=json.loads(sys.stdin.read().split('PLAIN_ALLREDUCE ',1)[1])
for s in d['sizes']: print(f\"  {s['bytes']:>11}  {s['time_us']:>10.1f} us  busbw {s['busbw_gbps']:8.2f} GB/s\")
print('  peak busbw', d['peak_busbw_gbps'], 'GB/s; 8-byte latency', d['small_message_latency_us'], 'us')"
