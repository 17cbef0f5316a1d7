#!/usr/bin/env bash
# Workplace recipe: ~/stage holds the carried GGUF halves, wheels and .debs (bench/offline_setup.sh).
# GPU validation of every CUDA path on SmolLM2: data -> sft0 -> sft1 -> eval -> rl -> distill -> merge.
S=~/stage; export PYTHONUNBUFFERED=1 CHORUS_CACHE=$S/cache
cat $S/g1/gguf.partaa .stage/g2/gguf.partab > $S/smollm2.gguf
mkdir -p $S/wheels && cp .stage/s1/wheels/*.whl $S/wheels/
source bench/offline_setup.sh $S
M=$S/smollm2.gguf; W=/tmp/w; mkdir -p $W; DEV=shared/data/dev_tasks.jsonl
step() { local name=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $W/$name.log 2>&1; local rc=$?;
  echo "== $name rc=$rc $(( $(date +%s)-t0 ))s"; tail -${TAIL:-6} $W/$name.log | cut -c1-300; }
{
step designs 30 python3 data/designs.py --n 48 --seed 0 --split train --out $W/tasks.jsonl
step build 60 python3 data/build_sft.py --tasks $W/tasks.jsonl --out $W/data --workers 14 --decontaminate $DEV
step sft0 70 python3 sft.py --model $M --data $W/data/stage0.jsonl --out $W/sft0 --epochs 2 --batch-size 4 --grad-accum 2 --lr 2e-4 --gradient-checkpointing
step sft1 80 python3 sft.py --model $M --init-adapter $W/sft0/adapter --data $W/data/stage1.jsonl --out $W/sft1 --epochs 2 --batch-size 4 --grad-accum 2 --lr 2e-4 --gradient-checkpointing
TAIL=14 step eval_sft1 90 python3 chorus_mini.py eval --model $M --adapter $W/sft1/adapter --tasks $DEV --split report --limit 16 --n 2 --rounds 1 --max-new-tokens 1536 --sim-workers 14 --out $W/eval_sft1
TAIL=10 step rl1 100 python3 rl.py --model $M --adapter $W/sft1/adapter --tasks $W/tasks.jsonl --out $W/rl1 --steps 4 --prompts-per-step 4 --gen-chunk 4 --max-new-tokens 1536 --sim-workers 14 --profile small --lr 2e-5 --save-every 2
TAIL=10 step opd 70 python3 distill.py --model $M --student $W/sft1/adapter --teachers $W/sft0/adapter $W/rl1/adapter --tasks $W/tasks.jsonl --out $W/opd --steps 2 --prompts-per-step 2 --gen-chunk 2 --max-new-tokens 1536 --sim-workers 14
step merge 40 python3 merge.py --method ties --space delta --adapters $W/sft0/adapter $W/sft1/adapter $W/rl1/adapter --out $W/m_ties --device cuda --rank 128
} 2>&1 | tee $OUT/gpu_check2.txt
cp $W/eval_sft1/metrics.json $OUT/eval_sft1_metrics.json 2>/dev/null
tar czf $OUT/logs.tgz -C $W --exclude='*.safetensors' --exclude='*.pt' --exclude='samples.jsonl' . 2>/dev/null
tar czf $OUT/adapters.tgz -C $W sft0/adapter sft1/adapter 2>/dev/null; ls -la $OUT
