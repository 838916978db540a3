#!/usr/bin/env bash
# retrax on a GPU machine: vs_peers' table (retrax in float32 and with
# bfloat16 matmuls and, where torch and transformers are installed, HF's
# Reformer) and the longest sequence one
# ReformerLM training step fits (d_model 256, 6 layers; target 1,048,576),
# and between them the FSDP mesh (benchmarks/sharding.py) on its devices.
# Under 8 minutes on an H200: the table gets GPU_SH_TABLE_S seconds (300),
# the search what is left of GPU_SH_TOTAL_S (460); workers past a budget are
# skipped and reported as such.
#
#   bash benchmarks/gpu.sh                       # on the GPU machine
#   RETRAX_GPU_SH_TINY=1 bash benchmarks/gpu.sh  # toy sizes, any CPU (tests)
#
# Environment: PYTHON (default python3), OUT (where the JSON results go;
# default a temporary folder), GPU_SH_LENGTHS, GPU_SH_DECODE_TOKENS.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT_DIR="${OUT:-$(mktemp -d)}"
TOTAL_S="${GPU_SH_TOTAL_S:-460}"
TABLE_S="${GPU_SH_TABLE_S:-300}"

if ! "$PY" -c 'import retrax' >/dev/null 2>&1; then
  # No network there: no build isolation (it would fetch setuptools).
  if ! "$PY" -m pip install -q --no-deps --no-build-isolation -e . \
      >"$OUT_DIR/pip_install.log" 2>&1; then
    echo "pip install -e . failed (see $OUT_DIR/pip_install.log); using PYTHONPATH"
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
"$PY" -c 'import jax, retrax; print("jax", jax.__version__, jax.devices())' || exit 1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total \
  --format=csv,noheader

PEERS=()
if "$PY" -c 'import torch, transformers' >/dev/null 2>&1; then
  PEERS=(--torch-python "$PY")
fi
if [ -n "${RETRAX_GPU_SH_TINY:-}" ]; then
  SIZES=(--tiny --n-layers 1)
  TABLE=(--lengths 32 --steps 1 --decode-tokens "" --bf16)
  SEARCH=32,32
else
  SIZES=()
  TABLE=(--lengths "${GPU_SH_LENGTHS:-4096,16384,65536}" --steps 3
         --decode-tokens "${GPU_SH_DECODE_TOKENS:-256,2048}"
         --decode-batches 1,8 --timeout 150 --bf16)
  SEARCH=65536,1048576,4194304
fi

echo "== vs_peers table (budget ${TABLE_S} s)"
"$PY" benchmarks/vs_peers.py "${SIZES[@]}" "${TABLE[@]}" "${PEERS[@]}" \
  --budget "$TABLE_S" --json "$OUT_DIR/gpu_vs_peers.json" || exit 1

# The mesh path (sharding.py) on the devices there are: weights+slots per
# device and step time, replicated (data=n) vs split (fsdp=n).
SHARD=(--steps 5 --timeout 120)
[ -n "${RETRAX_GPU_SH_TINY:-}" ] && SHARD=(--tiny --steps 1 --timeout 120)
echo "== FSDP mesh: bytes per device and step time"
"$PY" benchmarks/sharding.py --platform gpu "${SHARD[@]}" \
  --json "$OUT_DIR/gpu_sharding.json" || exit 1

LEFT=$((TOTAL_S - SECONDS))
echo "== longest training step (budget ${LEFT} s)"
"$PY" benchmarks/vs_peers.py "${SIZES[@]}" --search "$SEARCH" \
  --budget "$LEFT" --timeout 240 --json "$OUT_DIR/gpu_max_length.json" || exit 1
echo "== done in ${SECONDS} s; results in $OUT_DIR"
