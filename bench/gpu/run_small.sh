#!/usr/bin/env bash
# The `small` profile on one GPU machine, with its stages spread over parallel lanes.
#
#   bash bench/gpu/run_small.sh OUT [--set key=value ...]
#
# Same commands and artefacts as `python chorus_mini.py run --profile small --out OUT`: every lane calls
# `chorus_mini.py run --only STAGE`, so each stage still resumes from what it saved. What differs is the
# order: a lane waits for the stages it needs (their done.json) and runs while others run, e.g. the
# three RL experts side by side, and each finished model is evaluated while others still train. A 135M model
# leaves an H200 mostly idle, so several processes share one GPU; with two GPUs the lanes alternate.
# Lane logs: OUT/lanes/*.log; a failed lane writes its name to OUT/lanes/FAILED and the others stop
# waiting. Stop everything: kill the process group of this script.
set -u
OUT=${1:?usage: bench/gpu/run_small.sh OUT [--set key=value ...]}
shift
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
PROFILE=${PROFILE:-small}   # PROFILE=smoke with --set model=tiny: the CPU test of this script
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$NGPU" -ge 1 ] || NGPU=1
LANES=5
PER_GPU=$(( (LANES + NGPU - 1) / NGPU ))   # lanes sharing one GPU
SETS=(--set "sim_workers=$(( $(nproc) / LANES > 2 ? $(nproc) / LANES : 2 ))" "$@")
mkdir -p "$OUT/lanes"
rm -f "$OUT/lanes/FAILED"

stage() {   # stage NAME...: chorus_mini.py run --only NAME...
  echo "[$(date +%T)] run --only $*"
  "$PY" chorus_mini.py run --profile "$PROFILE" --out "$OUT" "${SETS[@]}" --only "$@"
}
evals() {   # evals MODEL...: the eval stage for these models only (their own stages must be done)
  local m
  for m; do
    echo "[$(date +%T)] eval $m"
    "$PY" chorus_mini.py run --profile "$PROFILE" --out "$OUT" "${SETS[@]}" --set "eval_models=$m" --only eval eval_syn eval_skill || return 1
  done
}
wait_for() {   # wait_for STAGE...: until each has done.json (or another lane failed)
  local s
  for s; do
    until [ -f "$OUT/$s/done.json" ]; do
      [ -f "$OUT/lanes/FAILED" ] && { echo "another lane failed: $(cat "$OUT/lanes/FAILED")"; exit 1; }
      sleep 5
    done
  done
}
lane() {   # lane NAME GPU COMMANDS: a background subshell on one GPU; its first failing command ends it
  local name=$1 gpu=$2
  shift 2
  # (not `( ... ) || mark`: bash ignores set -e inside a subshell on the left of ||)
  # each lane's processes keep to their share of their GPU's memory (common.apply_gpu_cap): a lane that took
  # what it found free would starve the lanes started after it
  { ( export CUDA_VISIBLE_DEVICES=$(( gpu % NGPU )) CHORUS_GPU_SHARE=${CHORUS_GPU_SHARE:-1/$PER_GPU}; set -e
      eval "$*" ) > "$OUT/lanes/$name.log" 2>&1
    [ $? -eq 0 ] || echo "$name" >> "$OUT/lanes/FAILED"; } &
}
echo "run_small: $NGPU GPU(s), $LANES lanes, out $OUT, ${SETS[*]}"
stage data || exit 1       # CPU only; usually done before (it needs no GPU)
lane A 0 'stage sft0; stage sft1; stage data2; stage sft2; stage rl2; wait_for rl0 rl1; stage merge; stage val;
          stage opd; evals opd'
lane B 1 'evals base; wait_for sft0; stage rl0; wait_for val; stage opd_nogate; evals opd_nogate'
lane C 1 'wait_for sft0; evals sft0; wait_for sft1; stage rl1; wait_for val; stage opd_rlfb; evals opd_rlfb'
lane D 0 'wait_for sft1; evals sft1; wait_for sft2; evals sft2; wait_for rl0; evals rl0; wait_for rl1; evals rl1;
          wait_for merge; evals soup ties'
lane E 1 'wait_for rl2; evals rl2; wait_for merge; evals dare_ties dare_ties_mean della'
wait
if [ -f "$OUT/lanes/FAILED" ]; then
  echo "run_small: lanes that failed or stopped: $(sort -u "$OUT/lanes/FAILED" | tr '\n' ' ')(logs in $OUT/lanes)"
  exit 1
fi
# every model is evaluated by now: these stages only check that and write the comparison and the report
stage eval eval_syn eval_skill compare report > "$OUT/lanes/final.log" 2>&1 || { echo "run_small: final stages failed ($OUT/lanes/final.log)"; exit 1; }
echo "run_small: done; report $OUT/report/report.md"
