#!/usr/bin/env bash
# Session-5 GPU runs (issues 16, 17, 19) on one offline H200, in parts that fit the device tool's calls.
#
#   PART=setup bash bench/gpu/small2_stage0.sh   # ~/stage: GGUF half 1, wheels, .debs (carry .stage/g1 .stage/s1)
#   PART=a     bash bench/gpu/small2_stage0.sh   # stage-0 SFT in both answer modes (~4.5 min each on an H200)
#   PART=e     bash bench/gpu/small2_stage0.sh   # both stage-0 models evaluated (71 s / 41 s)
#   PART=b     bash bench/gpu/small2_stage0.sh   # RL step times (new code, old code), OPD step times
# Each part fits one 10-minute call; a part cut short resumes in the next call (SFT checkpoints every 100 steps;
# runs/ points into ~/stage, which survives while the machine stays warm). Session 5 ran part a with shorter
# timeouts, so its SFT runs resumed twice (results/stage0_real_mix.md); part b has not run yet.
#
# The run folders come from the CPU box as .stage/data/{s2tb,s2st}.tgz (the `small` profile's data stage,
# `python chorus_mini.py run --profile small --only data --out runs/s2tb`, and the same tasks built in stimulus
# mode in runs/s2st); .stage/old is `git archive 2e18093` (the code before this session) for the "before" RL
# steps. Results go to $OUT (metrics, logs, adapters as bf16 peft folders).
set -u
S=~/stage
export PYTHONUNBUFFERED=1 CHORUS_CACHE=$S/cache
M=$S/smollm2.gguf
SETS=(--set "model=$M" --set sim_workers=14 --set eval_tasks=runs/dev_tasks.jsonl)
step() { local name=$1 t=$2; shift 2; local t0=$(date +%s); timeout "$t" "$@" > "$OUT/$name.log" 2>&1; local rc=$?;
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -"${TAIL:-4}" "$OUT/$name.log" | cut -c1-300; }

if [ "${PART:-}" = setup ]; then
  mkdir -p $S/g1 $S/wheels $S/debs
  cp .stage/g1/* $S/g1/ && cp .stage/s1/wheels/*.whl $S/wheels/ && cp .stage/s1/debs/*.deb $S/debs/
  source bench/offline_setup.sh $S
  exit 0
fi
[ -f $M ] || cat $S/g1/gguf.partaa .stage/g2/gguf.partab > $M
source bench/offline_setup.sh $S
mkdir -p $S/runs; [ -e runs ] || ln -s $S/runs runs
for r in s2tb s2st; do [ -d runs/$r ] || tar xzf .stage/data/$r.tgz -C runs; done
[ -f runs/dev_tasks.jsonl ] || cp .stage/data/dev_tasks.jsonl runs/

if [ "${PART:-}" = a ]; then
  step sft0_tb 290 python3 chorus_mini.py run --profile small --out runs/s2tb --only sft0 "${SETS[@]}"
  step sft0_st 290 python3 chorus_mini.py run --profile small --out runs/s2st --only sft0 "${SETS[@]}" --set answer_mode=stimulus
  for r in s2tb s2st; do cp runs/$r/sft0/result.json $OUT/${r}_sft0_result.json; done
  tar czf $OUT/adapters_a.tgz runs/s2tb/sft0/adapter runs/s2st/sft0/adapter
fi

if [ "${PART:-}" = e ]; then
  TAIL=6 step eval_st 200 python3 chorus_mini.py run --profile small --out runs/s2st --only eval "${SETS[@]}" \
      --set answer_mode=stimulus --set eval_models=sft0
  TAIL=6 step eval_tb 200 python3 chorus_mini.py run --profile small --out runs/s2tb --only eval "${SETS[@]}" --set answer_mode=testbench \
      --set eval_models=sft0
  for r in s2tb s2st; do cp runs/$r/eval/sft0/metrics.json $OUT/${r}_eval_sft0_metrics.json; done
fi

if [ "${PART:-}" = b ]; then
  [ -d runs/s2tb/sft0/adapter ] || tar xzf .stage/adapters_a.tgz
  # RL: the same adapter, tasks and settings (small profile: 8 prompts x G 4 x 2 rounds, 1280-token cap)
  TAIL=3 step rl_after 200 python3 chorus_mini.py run --profile small --out runs/s2tb --only rl0 "${SETS[@]}" --set rl_steps=11 \
      --set answer_mode=testbench
  cp runs/s2tb/rl0/log.jsonl $OUT/rl_after_log.jsonl
  TAIL=3 step opd 150 python3 distill.py --model $M --student runs/s2tb/sft0/adapter \
      --teachers runs/s2tb/rl0/adapter runs/s2tb/sft0/adapter --tasks runs/s2tb/data/train_tasks.jsonl \
      --out runs/s2tb/opd_t --steps 8 --prompts-per-step 8 --group-size 4 --rounds 2 --teacher-samples 1 \
      --max-new-tokens 1280 --seed 42 --sim-workers 14 --gen-batch-size 256 --max-tokens-per-micro 16384 \
      --gen-chunk 16 --sim-timeout 5.0 --no-gradient-checkpointing
  cp runs/s2tb/opd_t/log.jsonl $OUT/opd_log.jsonl
  ( cd .stage/old && TAIL=3 step rl_before 200 python3 rl.py --model $M --adapter ../../runs/s2tb/sft0/adapter \
      --tasks ../../runs/s2tb/data/train_tasks.jsonl --out ../../runs/s2tb/rl_before --profile small --steps 11 \
      --prompts-per-step 8 --group-size 4 --rounds 2 --lr 5e-05 --max-extra-prompts 8 --max-new-tokens 1280 \
      --seed 42 --sim-workers 14 --target-mode icarus --gen-batch-size 256 --max-tokens-per-micro 16384 \
      --save-every 20 --gen-chunk 16 --sim-timeout 5.0 --no-gradient-checkpointing )
  cp runs/s2tb/rl_before/log.jsonl $OUT/rl_before_log.jsonl 2>/dev/null
fi
ls -la $OUT
