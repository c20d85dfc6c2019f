#!/bin/bash
# On the GPU machine (kit staged, device_env.sh sourced), from the repo root whose .gpu/work holds
# this checkout's src/ and benchmarks/: build the three shape presets into $HF_HOME on the GPU
# and keep, under $1, each one's config.json and safetensors headers (header-only files, for
# re-planning anywhere). DeepSeek-V2-Lite is cut to 13 of its 27 layers: the three full models
# would need 55 GB of the machine's 64 GB disk.
#   bash benchmarks/gpu/build_models.sh $OUT/models
set -euo pipefail
DEST=$1; mkdir -p $DEST
W=${W:-.gpu/work}
export PYTHONPATH=$PWD/$W/src:$PYTHONPATH
t0=$(date +%s.%N)
python3 - <<'PY'   # one process for the three (what `tandem model shape P` does, per preset)
import time
from pathlib import Path
from tandem.models.shapes import build_shape_model
for preset, layers in (("llama-3.1-8b", None), ("deepseek-v2-lite", 13), ("gemma-3-4b", None)):
    t = time.monotonic()
    m = build_shape_model(Path("/root/hf"), preset, layers=layers, device="cuda")
    print(f"BUILT {m.repo_id} {m.num_hidden_layers} layers {m.parameter_count:,} params "
          f"{m.size_bytes:,} B in {time.monotonic() - t:.1f} s", flush=True)
PY
t1=$(date +%s.%N)
python3 - "$DEST" <<'PY'
import json, struct, sys
from pathlib import Path
dest = Path(sys.argv[1])
for repo in Path("/root/hf/hub").glob("models--tandem-shapes--*"):
    snap = repo / "snapshots" / (repo / "refs" / "main").read_text().strip()
    out = dest / repo.name.split("--", 2)[2]
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text((snap / "config.json").read_text())
    size = 0
    for f in sorted(snap.glob("*.safetensors")):
        raw = f.open("rb").read(8)
        n = struct.unpack("<Q", raw)[0]
        (out / f.name).write_bytes(raw + f.open("rb").read(8 + n)[8:])
        size += f.stat().st_size
    print(out.name, size, "bytes of safetensors")
PY
echo "build seconds: $(python3 -c "print(round($t1-$t0,1))")"
df -h / | tail -1
