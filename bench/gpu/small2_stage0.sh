#!/usr/bin/env bash
# Session-5 GPU runs (issues 16, 17, 19) on one offline H200, in parts that fit the device tool's calls.
#
# On the CPU box first: bash bench/gpu/pack_stage.sh (the .stage folders below; a new checkout has none).
#   PART=setup bash bench/gpu/small2_stage0.sh   # ~/stage: wheels, .debs (carry .stage/s1 and .stage/g1)
#   PART=stash bash bench/gpu/small2_stage0.sh   # ~/stage: one more GGUF part (carry .stage/g2)
# (the GGUF travels in three 33 MB parts .stage/g1-g3, `split -b 33000000`: with the 24.6 MB of tracked files a call
# carries at most 64 MiB; the part that runs carries .stage/g3 and .stage/data)
#   PART=a     bash bench/gpu/small2_stage0.sh   # stage-0 SFT in both answer modes (~4.5 min each on an H200)
#   PART=e     bash bench/gpu/small2_stage0.sh   # both stage-0 models evaluated (71 s / 41 s)
#   PART=b     bash bench/gpu/small2_stage0.sh   # RL and OPD step times, both answer modes (sessions 6-7), decode profile
#   PART=cap   bash bench/gpu/small2_stage0.sh   # the 4b and small profiles under a 24 GiB cap (bench_pipeline_cap)
#              (PROFILES=4b: that profile only; LANES=1: its stages in run_small.sh's parallel lanes: an estimated
#              ~830 s of critical path against ~1300 s in a row, from session 10's stage times; SKIP_DECODE=1 / SKIP_OPD=1 leave part b's decode profiles / OPD out)
#   PART=grad  bash bench/gpu/small2_stage0.sh   # bench/grad_check.py on the random 4B model (~4 min)
#   PART=trace bash bench/gpu/small2_stage0.sh   # where the 4b backward turns non-finite (session 9; session 10's CPU-drawn folder trains finite)
#   PART=gen4b bash bench/gpu/small2_stage0.sh   # bench/bench_4b.py's generation rows only, after the attention change (~5 min)
#   PART=merge bash bench/gpu/small2_stage0.sh   # bench/profile_merge.py on the 4B and SmolLM2 shapes (~5 min)
#   (PART=prefix, session 9, timed fastgen's shared-prefix layout: slower, removed with its flag)
#   (if it shows cuDNN attention as the cause: CHORUS_NO_CUDNN_SDP=1 PROFILES=4b PART=cap ..., the variable reaches
#   every stage's process)
# Each part fits one 10-minute call; a part cut short resumes in the next call (SFT checkpoints every 100 steps;
# runs/ points into ~/stage, which survives while the machine stays warm). Session 5 ran part a with shorter
# timeouts, so its SFT runs resumed twice (results/stage0_real_mix.md); part b ran in session 6 from the committed adapters.
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
  [ $rc = 124 ] && pkill -9 -f '(sft|rl|distill|evaluate)\.py' 2>/dev/null   # the stage script under chorus_mini
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -"${TAIL:-4}" "$OUT/$name.log" | cut -c1-300; }

# Every call stashes the GGUF parts it carries (.stage/g*/gguf.part*) in ~/stage/g1; the last part joins them.
mkdir -p $S/g1 && cp .stage/g*/gguf.part* $S/g1/ 2>/dev/null
# bitsandbytes (the 4b profile's nf4 base) travels as its package folder with only the CUDA 13 / CPU libraries
# (.stage/b1/bnb_site.tgz, 7 MB; the 0.50.2 wheel is 43 MB)
[ -f .stage/b1/bnb_site.tgz ] && mkdir -p $S/site && tar xzf .stage/b1/bnb_site.tgz -C $S/site
if [ "${PART:-}" = setup ]; then
  mkdir -p $S/wheels $S/debs
  cp .stage/s1/wheels/*.whl $S/wheels/ && cp .stage/s1/debs/*.deb $S/debs/
  source bench/offline_setup.sh $S
  exit 0
fi
[ "${PART:-}" = stash ] && exit 0
# joined once all three parts are staged (a part that needs no GGUF, e.g. gen4b, may run before the last one came)
[ -f $M ] || { [ -f $S/g1/gguf.part02 ] && cat $S/g1/gguf.part0[0-2] > $M.tmp && mv $M.tmp $M; }
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
  # RL and OPD step times (issue 19) in both answer modes, from the committed stage-0 adapters (session 5):
  # the small profile's settings (8 prompts x G 4 x 2 rounds, 1280-token cap), 11 RL steps, 8 OPD steps.
  # OPD's two teachers: the RL run's adapter and its step-5 checkpoint, both of the mode asked (session 6's one
  # teacher was the other mode's stage-0 adapter: it scored 0 in stimulus mode, so no gate opened).
  # MODES=stimulus (or testbench) runs one mode only.
  for m in testbench:s2tb stimulus:s2st; do mode=${m%%:*} r=${m##*:}
    if [ ! -f runs/$r/sft0/done.json ]; then mkdir -p runs/$r/sft0/adapter
      cp results/small2/adapters/sft0_$mode/* runs/$r/sft0/adapter/ && echo '{"note": "committed adapter"}' > runs/$r/sft0/done.json; fi
  done
  for m in testbench:s2tb:260 stimulus:s2st:260; do IFS=: read mode r t <<< "$m"; [[ "${MODES:-testbench stimulus}" == *$mode* ]] || continue
    TAIL=3 step rl_$mode $t python3 chorus_mini.py run --profile small --out runs/$r --only rl0 "${SETS[@]}" \
        --set rl_steps=11 --set answer_mode=$mode --set save_every=5
    cp runs/$r/rl0/log.jsonl $OUT/rl_${mode}_log.jsonl
  done
  for m in testbench:s2tb:220 stimulus:s2st:220; do IFS=: read mode r t <<< "$m"; [[ "${MODES:-testbench stimulus}" == *$mode* ]] || continue
    [ -z "${SKIP_OPD:-}" ] || continue
    TAIL=3 step opd_$mode $t python3 distill.py --model $M --student runs/$r/sft0/adapter \
        --teachers $(ls -d runs/$r/rl0/adapter runs/$r/rl0/ckpt/step_*/adapter 2>/dev/null | head -2) \
        --tasks runs/$r/data/train_tasks.jsonl \
        --out runs/$r/opd_t --steps 8 --prompts-per-step 8 --group-size 4 --rounds 2 --teacher-samples 1 \
        --max-new-tokens 1280 --seed 42 --sim-workers 14 --gen-batch-size 256 --max-tokens-per-micro auto \
        --gen-chunk 16 --sim-timeout 5.0 --no-gradient-checkpointing --answer-mode $mode
    cp runs/$r/opd_t/log.jsonl $OUT/opd_${mode}_log.jsonl
  done
  # The decode step at RL's batch (64 rows) with a short and an RL-long prompt: how much of it grows with
  # the KV cache and how much is the per-step fixed cost.
  [ -n "${SKIP_DECODE:-}" ] || for n in 0 4500; do          # 0: the default 565-token prompt
    TAIL=2 step profile_decode_$n 70 python3 bench/profile_decode.py --model $M --batch 64 --new-tokens 256 \
        --prompt-tokens $n --out $OUT/profile_decode_b64_p$n.json
  done
fi
if [ "${PART:-}" = cap ]; then
  # Every stage of the 4b (random Qwen3-4B-shaped model, nf4) and small profiles under a 24 GiB cap (issue 19).
  # A process group of its own, so a cut call leaves no stage running; then one quick pass collects the JSON
  # (CAP_S + the 60 s pass + setup must stay under the call's 600 s: session 6 set CAP_S=560 and lost the pass).
  # PROFILES=4b re-runs one profile; the committed JSON's other profile is kept (with the command that measured it)
  [ "${PROFILES:-4b small}" = "4b small" ] || cp results/bench_4b_pipeline.json $OUT/
  CB=(python3 bench/bench_pipeline_cap.py --profiles ${PROFILES:-4b small} --model-small $M --eval-tasks runs/dev_tasks.jsonl
      --out runs/capbench --json $OUT/bench_4b_pipeline.json --sim-workers 7 ${LANES:+--lanes})
  CHORUS_GPU_CAP_GIB=24 setsid "${CB[@]}" --parallel > $OUT/capbench.log 2>&1 & P=$!
  for i in $(seq ${CAP_S:-480}); do kill -0 $P 2>/dev/null || break; sleep 1; done
  kill -9 -- -$P 2>/dev/null; pkill -9 -f '(chorus_mini|sft|rl|distill|evaluate|merge|build_sft)\.py' 2>/dev/null
  CHORUS_GPU_CAP_GIB=24 timeout 60 "${CB[@]}" --stages data > $OUT/capbench_collect.log 2>&1
  tail -40 $OUT/capbench_collect.log; cp runs/capbench/*.log $OUT/ 2>/dev/null
  for k in 0 1 2; do cp runs/capbench/4b/sft$k/log.jsonl $OUT/4b_sft${k}_log.jsonl 2>/dev/null; done
fi
if [ "${PART:-}" = gen4b ]; then
  # Issue 19: the 4-bit 4B generation rows (fast path and HF generate at batch 64 / 16 / 1) re-measured after
  # session 4's attention change, on an otherwise idle GPU (bench.md's session-4 rows predate it); ~5 min
  TAIL=30 step gen4b 560 python3 bench/bench_4b.py --skip sft,sft_nogc,rollout,dapo,opd,dapo_nofast,opd_nofast \
      --time-budget 450 --out $OUT/bench_4b_gen.json
fi
if [ "${PART:-}" = merge ]; then
  # merge.py's phases on random r-16 experts of the 4B shapes (all 36 layers) and of SmolLM2's (session 9's faster
  # trim / election / SVD; session 8's TIES took 81.8 s on the 4B adapters)
  TAIL=6 step merge_4b 300 python3 bench/profile_merge.py --layers 0 --device cuda --json $OUT/merge_profile_4b.json
  TAIL=6 step merge_small 120 python3 bench/profile_merge.py --small --layers 0 --device cuda --json $OUT/merge_profile_small.json
fi
if [ "${PART:-}" = grad ]; then
  # Which kernel makes the 4b SFT gradient non-finite (session 8: every 4b SFT step skipped, loss finite):
  # one forward + backward per attention kernel, checkpointing on and off, on the capbench's random 4B folder
  # (1) the random 4B folder and the 4b profile's data stage (the rows sft0 trained on), as the cap bench builds them
  F=runs/capbench/qwen3_4b_random D=runs/capbench/4b/data
  [ -f $D/stage0.jsonl ] || TAIL=2 step grad_data 120 python3 bench/bench_pipeline_cap.py --profiles 4b --model-small $M \
      --eval-tasks runs/dev_tasks.jsonl --out runs/capbench --json $OUT/grad_data.json --sim-workers 7 --stages data
  # (2) one forward + backward per attention kernel, checkpointing on and off, in a fresh process
  TAIL=14 step grad_check 150 python3 bench/grad_check.py --model $F --quant 4bit --data $D/stage0.jsonl \
      --rows 1 --out $OUT/grad_check_4b.json
  # (3) sft0's own command (as chorus_mini runs it), then without validation and without the memory probe
  S0=(python3 sft.py --data $D/stage0.jsonl --model $F --quant 4bit --lora-r 16 --epochs 1 --lr 0.0001 --batch-size 1
      --grad-accum 24 --max-len 4096 --limit 4 --seed 42 --gradient-checkpointing)
  V=(--val-data $D/val_sft/stage0.jsonl --val-tasks $D/val_tasks.jsonl --val-n 1 --val-max-new-tokens 64
     --answer-mode testbench --target-mode icarus --sim-workers 7 --gen-batch-size 16)
  step sft_as_run 100 "${S0[@]}" --out runs/grad/as_run "${V[@]}"
  step sft_noval 100 "${S0[@]}" --out runs/grad/noval
  step sft_noval_noprobe 100 "${S0[@]}" --out runs/grad/noval_noprobe --max-tokens-per-micro 16384
  for r in as_run noval noval_noprobe; do cp runs/grad/$r/log.jsonl $OUT/grad_sft_$r.jsonl 2>/dev/null; done
  tail -n 3 $OUT/grad_sft_*.jsonl | cut -c1-400
fi
if [ "${PART:-}" = trace ]; then
  # Session 9: every kernel gave the same non-finite gradient (PART=grad); the trace found a finite forward and a
  # backward gradient growing ~500x per layer from layer 35 down, overflowing at layer 21, with an nf4, bf16 or fp32
  # base, on a folder built on the GPU by transformers' initialiser. The folder is now drawn on CPU from a seed
  # (bench_pipeline_cap.init_random_weights, checked): (1) as the 4b profile runs it, (2) fp32 weights and no
  # autocast, (3) the same rows' token ids made random (bench_4b's finite SFT step used random tokens).
  F=runs/capbench/qwen3_4b_random D=runs/capbench/4b/data
  [ -f $D/stage0.jsonl ] && [ -f $F/build.json ] || TAIL=2 step grad_data 150 python3 bench/bench_pipeline_cap.py \
      --profiles 4b --model-small $M --eval-tasks runs/dev_tasks.jsonl --out runs/capbench --json $OUT/grad_data.json \
      --sim-workers 7 --stages data
  cp $F/build.json $OUT/build_4b.json
  for v in "4bit:--quant 4bit" "fp32_noautocast:--quant fp32 --no-autocast" "4bit_random:--quant 4bit --random-tokens"; do
    TAIL=8 step trace_${v%%:*} 150 python3 bench/grad_check.py --model $F ${v#*:} --data $D/stage0.jsonl --rows 1 \
        --kernels default --trace --out $OUT/grad_trace_${v%%:*}.json
  done
fi
ls -la $OUT
