#!/usr/bin/env bash
# Issue 21, session 21: the rest of the dev reporting split for the models the four claims read.
# The run's evaluation uses the first 40 of the 148 reporting-split tasks (`select-tasks --limit 40`, sized to the
# GPU budget of sessions 19-20); on those 40 most models sit within one task of the split's 92.5 % ceiling and
# differ on 2-16 tasks, so the claims' intervals are wide. This script evaluates the other 108 (same order, same
# settings as the run's `eval` stage: n 5, 1 + 3 rounds, T 0.7, top-p 0.8, seed 42), so that the claims can be
# measured on all 148 (results/small2_run.md, session 21).
#
# On the CPU box, once (the task file is third-party data and travels as a carried, ignored file):
#   python chorus_mini.py select-tasks --tasks runs/dev_tasks.jsonl --limit 1000 --max-chars 9000 --out /tmp/all.jsonl
#   mkdir -p .stage/ext && tail -n +41 /tmp/all.jsonl > .stage/ext/report_rest.jsonl     # the first 40: the run's
# On the device, after small2_run.sh's PART=restore (the bundle holds the run's adapters), carrying .stage/ext:
#   T=480 bash bench/gpu/small2_ext.sh      three processes side by side; a model whose metrics.json exists is
#                                           skipped, so a cut call is simply made again; returns ext.tgz (the
#                                           finished models' metrics.json and samples.jsonl) and ext.log
# CPU box: tar xzf ext.tgz -C runs (samples.jsonl stay there, ignored); copy each runs/s2st/eval_ext/NAME/metrics.json
# to results/small2/state/s2st/eval_ext/NAME/ and commit; the claims on all 148 tasks (each model's 40 + 108 joined):
#   python evaluate.py claims results/small2/state/s2st/eval results/small2/state/s2st/eval_ext
set -u
S=~/stage
R=runs/s2st
E=$R/eval_ext
M=$S/smollm2.gguf
TASKS=${TASKS:-$PWD/.stage/ext/report_rest.jsonl}
export PYTHONUNBUFFERED=1 CHORUS_CACHE=$S/cache CHORUS_GPU_CAP_GIB=${CAP_GIB:-43}
source bench/offline_setup.sh $S
[ -e runs ] || ln -s $S/runs runs
[ -f "$TASKS" ] || { echo "small2_ext: no task file $TASKS"; exit 2; }

adapter() {    # the adapter the run's eval stage used: chorus_mini.py's model_adapters with the run's sft_pick
  [ $1 = soup ] && { echo $E/soup_adapter; return; }            # (its merges live in merge/, not recomputed here)
  python3 -c "import pathlib, sys, chorus_mini as C; print(C.model_adapters(pathlib.Path(sys.argv[1]),
{'sft_pick': 'best'})[sys.argv[2]])" $R $1
}
models() {     # one process: its models in turn
  for m in "$@"; do
    [ -f $E/$m/metrics.json ] && continue
    if [ $m = soup ] && [ ! -f $E/soup_adapter/adapter_config.json ]; then   # the run's pick: lambda 1, exact
      python3 merge.py --method soup --adapters $R/rl0/adapter $R/rl1/adapter $R/rl2/adapter --out $E/soup_adapter \
        --space delta --density 0.5 --seed 42 --device cuda --lam 1.0 || return 1
    fi
    python3 evaluate.py eval --tasks "$TASKS" --out $E/$m --model $M --adapter $(adapter $m) --quant auto --n 5 \
      --rounds 3 --max-new-tokens 1280 --batch-size 256 --seed 42 --sim-workers 4 --target-mode icarus \
      --answer-mode stimulus || return 1
  done
}
mkdir -p $E
export -f models adapter; export R E M TASKS
# in rounds that complete claims: soup / opd / opd_nogate are (d)'s models, + rl0-2 (b) and (c), + sft0-2 (a)
setsid bash -c 'models soup rl0 sft0 opd_rlfb > '"$OUT"'/ext_p1.log 2>&1 & a=$!
  models opd rl1 sft1 > '"$OUT"'/ext_p2.log 2>&1 & b=$!
  models opd_nogate rl2 sft2 > '"$OUT"'/ext_p3.log 2>&1 & c=$!
  wait $a; x=$?; wait $b; y=$?; wait $c; exit $((x || y || $?))' & P=$!
for i in $(seq ${T:-480}); do kill -0 $P 2>/dev/null || break; sleep 1; done
kill -0 $P 2>/dev/null && { kill -9 -- -$P; echo "== cut at ${T:-480} s"; }
wait $P 2>/dev/null; echo "== rc $?"
(cd $OUT && for f in ext_p*.log; do echo "-- $f"; tr '\r' '\n' < $f | grep -v 'Loading weights' | grep -E 'direct|agentic|wrote|Error|error' | tail -12; done > ext.log; rm -f ext_p*.log)
cat $OUT/ext.log
(shopt -s nullglob; cd $S/runs && f=(s2st/eval_ext/*/metrics.json); [ ${#f[@]} -gt 0 ] && \
  tar czf $OUT/ext.tgz "${f[@]}" $(for x in "${f[@]}"; do echo ${x%/*}/samples.jsonl; done))
ls -la $OUT
