#!/usr/bin/env bash
# retrax on a TPU chip, in one call of under 10 minutes: installs what the
# machine lacks from its own package index (and wheels carried in .whl-tpu/),
# then, stage by stage, each within its share of TPU_SH_TOTAL_S seconds:
#
#   float32  benchmarks/float32_error.py: the chip's float32 arithmetic
#            against float64 NumPy (what the tests' TPU tolerance rests on)
#   main     the README's main job, unchanged (`retrax train` in a new folder)
#   tests    `pytest --quick` in one process (the chip admits one program),
#            leaving out the tests slow on a CPU or on the chip
#            (tests/slow_tests_tpu.json); TPU_SH_TEST_PATHS="tests/layers
#            tests/models" runs a part, TPU_SH_TEST_SHARD=2/4 the second of
#            four fixed parts. Each test's seconds update the chip's list,
#            which comes back as slow_tests_tpu.json (copy it into tests/).
#            Its share of TPU_SH_TOTAL_S: TPU_SH_TEST_SHARE percent (45)
#   table    benchmarks/vs_peers.py: paper-size ReformerLM at 16K and 64K
#   search   the longest default-model step that fits (target 1,048,576)
#   profile  benchmarks/step_profile.py: the paper-size step part by part
#            (at TPU_SH_PROFILE_LENGTH tokens, default 16384), and one
#            LSHSelfAttention fwd+bwd by XLA ops (the default, and
#            TPU_SH_LSH_UNITS heads at a time) and by the Pallas kernel
#            (implementation='pallas'), its ratio to XLA printed; the
#            layer's and the step's compiled HLO come back gzipped. More
#            arguments: TPU_SH_PROFILE_ARGS="--step-only --trace-steps 1"
#   variants the paper-size step alone at TPU_SH_PROFILE_LENGTH under
#            each of TPU_SH_VARIANTS: ';'-separated variants, each a
#            space-separated list of MODULE.NAME=VALUE (`step_profile.py
#            --set`), the first usually empty (the defaults), e.g.
#            TPU_SH_VARIANTS=";$M.REMAT_SPEED_BLOCKS=False" with M=
#            retrax.layers.attention.ops, or step_profile.py's own
#            options (--matmul-dtype=bfloat16, --compiler-option=
#            xla_tpu_scoped_vmem_limit_kib=98304); one process each, then
#            each step's time over the first's; not in the default stages
#   decode   decoding tokens/s (vs_peers' decode rows, default model)
#   gather   benchmarks/gather_bench.py: XLA's row gathers against the
#            Pallas kernels of gather_kernel at the LSH shapes (16 units of
#            32768 rows, 524,288 indices); not in the default stages.
#            More arguments: TPU_SH_GATHER_ARGS="--dtype bfloat16"
#   real_text  benchmarks/real_text.py (the paper's claims) in a piece that
#            ends before the stage's budget; its run directory
#            (TPU_SH_REAL_TEXT_DIR, default /tmp/retrax-real-text) stays on
#            the machine while it is warm, so the next call resumes there
#            (exit status 3: unfinished); each arm's progress.json is copied
#            to $OUT as it stands. Arguments: TPU_SH_REAL_TEXT_ARGS.
#
#   bash benchmarks/tpu.sh                          # every stage
#   TPU_SH_STAGES="main tests" bash benchmarks/tpu.sh
#   # The main job, the whole quick suite, the table and 1M tokens in one
#   # call (on the chip, 2026-12-08: main 58 s, --quick 269 s before the
#   # slow list's last ~70 s of tests, table 137 s, the 1M try ~97 s
#   # before its table of positions was filled on threads):
#   TPU_SH_STAGES="main tests table search" TPU_SH_SEARCH=1048576,1048576 \
#     TPU_SH_TEST_SHARE=55 TPU_SH_TOTAL_S=585 bash benchmarks/tpu.sh
#   RETRAX_TPU_SH_TINY=1 JAX_PLATFORMS=cpu bash benchmarks/tpu.sh  # toy sizes
#
# Results (JSON, logs) go to $OUT (default: a new temporary folder), flat, so
# the device tool brings them back.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT_DIR="${OUT:-$(mktemp -d)}"
TOTAL_S="${TPU_SH_TOTAL_S:-560}"
STAGES="${TPU_SH_STAGES:-float32 main tests table search profile decode}"
SITE="${TPU_SH_SITE:-/tmp/retrax-site}"
INDEX=/opt/pypi/simple
TINY="${RETRAX_TPU_SH_TINY:-}"

# The machine's own JAX stays first on the path; what pip brings goes after.
# A stamp in $SITE skips the import check and the carried wheels' reinstall
# on a warm machine (seconds of a call's ten minutes).
STAMP="$SITE/.retrax-tpu-sh-$(cat .whl-tpu/*.whl 2>/dev/null | cksum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] \
    && ! "$PY" -c 'import optax, safetensors, tqdm, google_crc32c' 2>/dev/null \
    && [ -d "$INDEX" ]; then
  PIP_CONFIG_FILE=/dev/null "$PY" -m pip install --isolated -q \
    --only-binary=:all: --index-url "file://$INDEX" --target "$SITE" \
    optax safetensors tqdm google-crc32c sentencepiece >"$OUT_DIR/pip.log" 2>&1 \
    || { echo "pip install from $INDEX failed (see pip.log)"; exit 1; }
fi
if [ ! -f "$STAMP" ] && compgen -G ".whl-tpu/*.whl" >/dev/null; then  # gin
  PIP_CONFIG_FILE=/dev/null "$PY" -m pip install --isolated -q --no-index \
    --no-deps --no-compile --upgrade --target "$SITE" .whl-tpu/*.whl \
    >>"$OUT_DIR/pip.log" 2>&1 || { echo "carried wheels failed"; exit 1; }
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}:$SITE"
export PYTHONUNBUFFERED=1
# Imports only: each stage names the device it ran on, and starting the
# TPU runtime once more here would cost ~10 s (no transparent hugepages).
"$PY" -c 'import jax, retrax, optax; print("jax", jax.__version__)' \
  || exit 1
[ -d "$SITE" ] && touch "$STAMP"

left() { echo $((TOTAL_S - SECONDS)); }
# share N: N percent of the total, at most what is left.
share() { local s=$((TOTAL_S * $1 / 100)); local l; l=$(left)
          echo $(( s < l ? s : l )); }
want() { [[ " $STAGES " == *" $1 "* ]]; }

if want float32; then
  echo "== [+${SECONDS} s] float32 arithmetic against float64 NumPy (the tests' TPU tolerance)"
  SIZE=512; [ -n "$TINY" ] && SIZE=64
  timeout -k 10 "$(share 10)" "$PY" benchmarks/float32_error.py --size "$SIZE" \
    --json "$OUT_DIR/tpu_float32.json"
fi

if want main; then
  echo "== [+${SECONDS} s] main job: retrax train (budget $(share 20) s)"
  RUN_DIR=$(mktemp -d)
  START=$SECONDS
  MAIN=(-m retrax train)
  [ -n "$TINY" ] && MAIN+=(--set steps=20 --set eval_every=10)
  (cd "$RUN_DIR" && timeout "$(share 20)" "$PY" "${MAIN[@]}") \
    2>&1 | tee "$OUT_DIR/tpu_main.log" | tail -n 12
  echo "main job: rc ${PIPESTATUS[0]} in $((SECONDS - START)) s"
fi

if want tests; then
  TEST_S=$(share "${TPU_SH_TEST_SHARE:-45}")
  echo "== [+${SECONDS} s] pytest --quick, one process (budget $TEST_S s)"
  # TPU_SH_TEST_PATHS: a part of the suite (the chip compiles each test's
  # programs: tests not yet in its slow list can take calls); TPU_SH_TEST_SHARD
  # K/N: the K-th of N fixed parts of it (e.g. 1/4 .. 4/4 over four calls).
  read -r -a TESTS <<< "${TPU_SH_TEST_PATHS:-tests}"
  [ -n "${TPU_SH_TEST_SHARD:-}" ] && TESTS+=(--shard "$TPU_SH_TEST_SHARD")
  RECORD=(--record-durations)
  # At toy sizes on a CPU, recording would rewrite the CPU's list.
  [ -n "$TINY" ] && { TESTS=(tests/cli/test_multiprocess.py); RECORD=(); }
  # SIGINT at the budget: pytest stops and still prints its summary (and
  # records the tests that finished); -v logs each test's outcome as it
  # ends, --durations the slowest (where a call's minutes go on the chip).
  # -o addopts="" drops the project's `-n 2` (one process holds the chip)
  # and with it `-m 'not slow'`, given back here.
  timeout -s INT -k 30 "$TEST_S" "$PY" -m pytest --quick -p no:xdist \
    -p no:cacheprovider -o addopts="" -m "not slow" -v -rfE --durations=30 \
    "${RECORD[@]}" --junitxml="$OUT_DIR/tpu_tests.xml" \
    ${TPU_SH_TEST_ARGS:-} "${TESTS[@]}" >"$OUT_DIR/tpu_tests.log" 2>&1
  echo "tests: rc $?"
  [ -f tests/slow_tests_tpu.json ] && cp tests/slow_tests_tpu.json "$OUT_DIR/"
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT_DIR/tpu_tests.log" \
    | cut -c1-160 | tail -n 80
fi

PAPER=(--d-model 1024 --d-ff 4096 --n-heads 16 --chunk-len 128)
[ -n "$TINY" ] && PAPER=(--tiny --n-layers 1)
if want table; then
  echo "== [+${SECONDS} s] paper-size table (budget $(share 30) s)"
  LENGTHS="${TPU_SH_LENGTHS:-16384,65536}"
  [ -n "$TINY" ] && LENGTHS=32
  "$PY" benchmarks/vs_peers.py "${PAPER[@]}" --lengths "$LENGTHS" --steps 3 \
    --decode-tokens "" --budget "$(share 30)" --timeout 200 \
    --json "$OUT_DIR/tpu_vs_peers.json"
fi

# The longest step after the table: twice (2026-12-07) the paper-size 16K
# step that followed the 1M step on the chip did not finish, in 52 s and
# then in 110 s in the next call, where it took ~35 s before (likely the 1M
# process's slow exit holding the chip; the workers now leave by os._exit:
# docs/benchmarks.md, tenth to twelfth chip sessions).
if want search; then
  echo "== [+${SECONDS} s] longest default-model step (budget $(share 30) s)"
  SEARCH="${TPU_SH_SEARCH:-524288,1048576,2097152}"
  SIZES=()
  [ -n "$TINY" ] && { SEARCH=32,64; SIZES=(--tiny --n-layers 1); }
  # TPU_SH_SEARCH_ARGS: e.g. --axial-pos (position tables of ~sqrt(L) rows
  # instead of one of L rows, with its Adam slots: 6 GB at 2M tokens).
  read -r -a SEARCH_ARGS <<< "${TPU_SH_SEARCH_ARGS:-}"
  "$PY" benchmarks/vs_peers.py "${SIZES[@]}" "${SEARCH_ARGS[@]}" --search "$SEARCH" \
    --budget "$(share 30)" --timeout 240 --json "$OUT_DIR/tpu_max_length.json"
fi

if want profile; then
  echo "== [+${SECONDS} s] step profile, paper size (budget $(share 20) s)"
  # Traces stay on the machine (too large to bring back); their device time
  # by HLO category and slowest ops go into the JSON, the XLA LSH layer's
  # and the step's compiled HLO beside it (to read what those ops are).
  PROF=(--length "${TPU_SH_PROFILE_LENGTH:-16384}" --trace /tmp/retrax-trace
        --units "${TPU_SH_LSH_UNITS:-}"
        --hlo "$OUT_DIR/tpu_lsh_hlo.txt.gz")
  # TPU_SH_PROFILE_ARGS: e.g. "--step-only --trace-steps 1" (64K's step
  # trace, read within a call: it takes minutes with every part).
  [ -n "$TINY" ] && PROF=(--tiny --length 256 --trace /tmp/retrax-trace
                          --units 1)
  read -r -a PROF_ARGS <<< "${TPU_SH_PROFILE_ARGS:-}"
  PROF+=("${PROF_ARGS[@]}")
  timeout -k 10 "$(share 20)" "$PY" benchmarks/step_profile.py "${PROF[@]}" \
    --json "$OUT_DIR/tpu_profile.json"
fi

if want variants; then
  echo "== [+${SECONDS} s] step variants (budget $(share 60) s)"
  IFS=';' read -r -a VARIANTS <<< "${TPU_SH_VARIANTS:-}"
  [ ${#VARIANTS[@]} -eq 0 ] && VARIANTS=("")  # the defaults alone
  SIZE=(--length "${TPU_SH_PROFILE_LENGTH:-16384}")
  [ -n "$TINY" ] && {
    VARIANTS=("" "retrax.layers.attention.ops.BLOCK_MIN_LOGITS=0 --matmul-dtype=bfloat16 --n-parallel-heads=2")
    SIZE=(--tiny --length 256); }
  END=$((SECONDS + $(share 60)))
  for i in "${!VARIANTS[@]}"; do
    SETS=()
    for assignment in ${VARIANTS[$i]}; do  # step_profile's own --options too
      case "$assignment" in --*) SETS+=("$assignment") ;;
                             *) SETS+=(--set "$assignment") ;; esac
    done
    # Each variant gets an equal share of what is left.
    LEFT=$(( (END - SECONDS) / (${#VARIANTS[@]} - i) ))
    timeout -k 10 "$LEFT" "$PY" benchmarks/step_profile.py "${SIZE[@]}" \
      --step-only "${SETS[@]}" --json "$OUT_DIR/tpu_variant_$i.json"
  done
  compgen -G "$OUT_DIR/tpu_variant_*.json" >/dev/null &&
    "$PY" benchmarks/step_profile.py --compare "$OUT_DIR"/tpu_variant_*.json
fi

if want decode; then
  echo "== [+${SECONDS} s] decoding (budget $(left) s)"
  DEC=(--lengths "" --decode-tokens 256,2048 --decode-batches 1,8)
  [ -n "$TINY" ] && DEC=(--tiny --n-layers 1 --lengths "" --decode-tokens 16
                         --decode-batches 1)
  "$PY" benchmarks/vs_peers.py "${DEC[@]}" --budget "$(left)" --timeout 200 \
    --json "$OUT_DIR/tpu_decode.json"
fi
if want gather; then
  echo "== [+${SECONDS} s] row gathers, XLA vs Pallas (budget $(share 20) s)"
  read -r -a GATHER <<< "${TPU_SH_GATHER_ARGS:-}"
  [ -n "$TINY" ] && GATHER+=(--tiny)
  timeout -k 10 "$(share 20)" "$PY" benchmarks/gather_bench.py "${GATHER[@]}" \
    --json "$OUT_DIR/tpu_gather.json"
  echo "gather: rc $?"
fi
if want real_text; then
  RT_DIR="${TPU_SH_REAL_TEXT_DIR:-/tmp/retrax-real-text}"
  RT_ARGS=(${TPU_SH_REAL_TEXT_ARGS:---steps 5000 --eval_every 250 --seeds 3})
  [ -n "$TINY" ] && RT_ARGS=(--quick --arms residual-full,lsh-2 --seeds 2)
  # The piece stops at the last eval that leaves time for the next stretch,
  # one minute before what is left (startup, the corpus, the copy below).
  MINUTES=$(( ($(left) - 60) / 60 ))
  echo "== [+${SECONDS} s] real_text in $RT_DIR (${MINUTES} minutes): ${RT_ARGS[*]}"
  "$PY" benchmarks/real_text.py "${RT_ARGS[@]}" --run_dir "$RT_DIR" \
    --max_minutes "$MINUTES" --json "$OUT_DIR/real_text.json" \
    2>&1 | tee "$OUT_DIR/real_text.log" | tail -n 40
  echo "real_text: rc ${PIPESTATUS[0]} (3: unfinished, run again)"
  # One file (the device tool brings back only a few), which
  # `real_text.py --from_progress` reports.
  "$PY" - "$RT_DIR" "$OUT_DIR/real_text_progress.json" <<'PYEOF'
import glob, json, os, sys
root, out = sys.argv[1:]
runs = {os.path.relpath(os.path.dirname(p), root): json.load(open(p))
        for p in sorted(glob.glob(os.path.join(root, '*', '*', 'progress.json')))}
config = json.load(open(os.path.join(root, 'config.json')))
json.dump(dict(config=config, runs=runs), open(out, 'w'))
print(f'{len(runs)} runs in progress.json', {k: v['step'] for k, v in runs.items()})
PYEOF
fi
echo "== done in ${SECONDS} s; results in $OUT_DIR"
