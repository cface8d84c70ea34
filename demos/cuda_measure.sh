#!/usr/bin/env bash
# Standard against speculative decoding on MLX's CUDA backend, with cuDNN attention on (MLX's
# default) and off (what mlxspec chooses when it may speculate there: mlxspec/backend.py).
#
# usage: demos/cuda_measure.sh HARNESS [OUT]
#   HARNESS  the measuring script, spec_gpu.py (Qwen3-14B target and Qwen3-0.6B draft shapes,
#            4-bit, bf16, weights built so that the draft agrees with the target's greedy walk at
#            a known rate alpha; it is kept beside this project, not in it)
#   OUT      a folder for results (default /tmp/mlxspec-cuda): OUT/cudnn-on, OUT/mlxspec, each
#            with the harness's results.jsonl; the summary is printed at the end
# Sized by ALPHAS (0.7), GAMMAS (1,2,3,4,8), TOKENS (256), REPEATS (2), BUDGET (240 s a pass):
# two passes, ~10 minutes on an H200 with the models already built (building them: ~20 s).
# SMALL=1: the harness's tiny shapes on a CPU, a dry run of this script (a few minutes).
# Needs Linux, an NVIDIA GPU and mlxspec installed with its CUDA extra (pip install -e ".[cuda13]").
set -euo pipefail
harness=${1:?usage: demos/cuda_measure.sh HARNESS [OUT]}
out=${2:-/tmp/mlxspec-cuda}
small=()
if [ "${SMALL:-0}" = 1 ]; then
    small=(--small)
else
    python -c "from mlxspec import backend; import sys; sys.exit(0 if backend.on_cuda() else 'MLX is not on its CUDA backend here (SMALL=1 for a CPU dry run)')"
fi
options=(--alphas "${ALPHAS:-0.7}" --gammas "${GAMMAS:-1,2,3,4,8}" --tokens "${TOKENS:-256}"
    --repeats "${REPEATS:-2}" --budget "${BUDGET:-240}" --skip agreement,eagle,numerics
    --models "$out/models" "${small[@]}")

# MLX reads the switch once, at the process's first attention call; mlxspec sets it in
# load_pair unless it is set already, so the first pass sets it to 1 (cuDNN on, as before)
MLX_CUDA_USE_CUDNN_SDPA=1 OUT="$out/cudnn-on" python "$harness" "${options[@]}"
env -u MLX_CUDA_USE_CUDNN_SDPA -u MLX_CUDA_USE_CUDNN_SPDA OUT="$out/mlxspec" python "$harness" "${options[@]}"

python - "$out" <<'EOF'
"""Medians of each pass: standard decoding, speculative per gamma (and auto), the verify curve."""
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

out = Path(sys.argv[1])
for name in ("cudnn-on", "mlxspec"):
    lines = [json.loads(line) for line in (out / name / "results.jsonl").read_text().splitlines() if line.strip()]
    standard = [r["tok_s"] for r in lines if r.get("section") == "standard" and r.get("who") == "mlxspec"]
    speedups, exact = defaultdict(list), set()
    for r in lines:
        if r.get("section") == "spec" and r.get("who") == "mlxspec":
            speedups[(r["alpha_built"], r["gamma"])].append(r["speedup"])
            exact.add(r["exact"])
    curve = next((r["v"] for r in lines if r.get("section") == "verify_curve" and r.get("model") == "target"), None)
    print(f"{name}: standard {statistics.median(standard) if standard else '-'} tok/s; greedy runs: {sorted(exact)}")
    print(f"  verify curve v(k): {curve}")
    for (alpha, gamma), values in sorted(speedups.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        print(f"  alpha {alpha} gamma {gamma}: {statistics.median(values):.3f}x standard ({len(values)} runs)")
EOF
