#!/usr/bin/env bash
# Workplace recipe: ~/stage holds the carried GGUF halves, wheels and .debs (bench/offline_setup.sh).
S=~/stage; export PYTHONUNBUFFERED=1 CHORUS_CACHE=$S/cache
cat $S/g1/gguf.partaa .stage/g2/gguf.partab > $S/smollm2.gguf
mkdir -p $S/wheels && cp .stage/s1/wheels/*.whl $S/wheels/ && cp -r .stage/s1/debs $S/
source bench/offline_setup.sh $S
M=$S/smollm2.gguf; W=/tmp/w; mkdir -p $W; DEV=shared/data/dev_tasks.jsonl
tar xzf $S/adapters.tgz -C $W
step() { local name=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $W/$name.log 2>&1; local rc=$?;
  echo "== $name rc=$rc $(( $(date +%s)-t0 ))s"; tail -${TAIL:-6} $W/$name.log | cut -c1-300; }
{
step designs 30 python3 data/designs.py --n 48 --seed 0 --split train --out $W/tasks.jsonl
TAIL=16 step eval_sft1 100 python3 chorus_mini.py eval --model $M --adapter $W/sft1/adapter --tasks $DEV --split report --limit 16 --n 2 --rounds 1 --max-new-tokens 1536 --sim-workers 14 --out $W/eval_sft1
TAIL=10 step rl1 100 python3 rl.py --model $M --adapter $W/sft1/adapter --tasks $W/tasks.jsonl --out $W/rl1 --steps 4 --prompts-per-step 4 --gen-chunk 4 --max-new-tokens 1536 --sim-workers 14 --profile small --lr 2e-5 --save-every 2
TAIL=10 step opd 70 python3 distill.py --model $M --student $W/sft1/adapter --teachers $W/sft0/adapter $W/rl1/adapter --tasks $W/tasks.jsonl --out $W/opd --steps 2 --prompts-per-step 2 --gen-chunk 2 --max-new-tokens 1536 --sim-workers 14
step merge 40 python3 merge.py --method ties --space delta --adapters $W/sft0/adapter $W/sft1/adapter $W/rl1/adapter --out $W/m_ties --device cuda --rank 128
} 2>&1 | tee $OUT/gpu_check3.txt
cp $W/eval_sft1/metrics.json $OUT/eval_sft1_metrics.json 2>/dev/null
tar czf $OUT/logs.tgz -C $W --exclude='*.safetensors' --exclude='*.pt' --exclude='samples.jsonl' . 2>/dev/null
