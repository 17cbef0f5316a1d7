#!/usr/bin/env bash
# Direct answers of published models on a GPU, scored on the same machine's CPUs while the GPU decodes.
#
#   bash bench/gpu/skill_rows.sh GGUF ADAPTERS OUT SETS MODEL...
#
# SETS: comma-separated NAME=TASKS.jsonl:N:TARGET_MODE[:FLOOR.json], e.g.
#   skill=runs/skill/skill_tasks.jsonl:5:icarus,report=runs/skill/report_tasks.jsonl:5:cvdp:runs/skill/report_floor.json
# MODEL: `base`, a folder under ADAPTERS, or `merges` (soup, TIES, DARE-TIES sum and mean, DELLA of
# ADAPTERS/rl0..rl2, by results/small2_run.md's commands, written under ADAPTERS; MERGE_DEVICE=cuda runs their
# SVDs on the GPU, which takes seconds where four CPU merges beside a busy scorer take minutes). Each model's answers come from
# bench/gpu_memory.py answers (T 0.7, top-p 0.8, $MAX_NEW or 1280 new tokens); LANES processes share the GPU
# (each keeps to its share of the memory); one scorer follows them on the CPUs (bench/score_answers.py).
# OUT/answers/SET/MODEL.json are the answers, OUT/rows_SET_MODEL.json the scored rows, OUT/eval_SET/MODEL/metrics.json
# eval's metrics (for `evaluate.py claims OUT/eval_SET`). A model whose rows exist
# is skipped, so the same command resumes.
set -u
GGUF=${1:?usage: skill_rows.sh GGUF ADAPTERS OUT SETS MODEL...}
AD=${2:?}; OUT=${3:?}; SETS=${4:?}
shift 4
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
LANES=${LANES:-3}
WORKERS=${WORKERS:-$(( $(nproc) - LANES - 1 ))}
mkdir -p "$OUT/answers"
IFS=, read -r -a SETLIST <<< "$SETS"

MODELS=()
for m; do
  if [ "$m" = merges ]; then MODELS+=(soup ties dare_ties dare_ties_mean della); else MODELS+=("$m"); fi
done

merges() {   # the five merges of rl0-2, on CPU, as results/small2_run.md publishes them
  local E="$AD/rl0 $AD/rl1 $AD/rl2" O="--space delta --density 0.5 --seed 42 --device ${MERGE_DEVICE:-cpu}"
  [ -f "$AD/soup/done" ] || { "$PY" merge.py --method soup --adapters $E --out "$AD/soup" $O --lam 1.0 && touch "$AD/soup/done"; } &
  [ -f "$AD/ties/done" ] || { "$PY" merge.py --method ties --adapters $E --out "$AD/ties" $O --rank 576 --lam 1.0 && touch "$AD/ties/done"; } &
  [ -f "$AD/dare_ties/done" ] || { "$PY" merge.py --method dare_ties --dare-norm sum --adapters $E --out "$AD/dare_ties" $O --rank 576 --lam 1.0 && touch "$AD/dare_ties/done"; } &
  [ -f "$AD/dare_ties_mean/done" ] || { "$PY" merge.py --method dare_ties --dare-norm mean --adapters $E --out "$AD/dtm_lam1" $O --rank 576 --lam 1.0 &&
    "$PY" merge.py --rescale "$AD/dtm_lam1" --lam 0.5 --out "$AD/dare_ties_mean" && touch "$AD/dare_ties_mean/done"; } &
  [ -f "$AD/della/done" ] || { "$PY" merge.py --method della --adapters $E --out "$AD/della_lam1" $O --rank 576 --lam 1.0 &&
    "$PY" merge.py --rescale "$AD/della_lam1" --lam 0.5 --out "$AD/della" && touch "$AD/della/done"; } &
  wait
}

generate() {   # generate MODEL: its answers on every set
  local m=$1 s name tasks n rest
  case " soup ties dare_ties dare_ties_mean della " in
    *" $m "*) until [ -f "$AD/$m/done" ] || [ ! -f "$AD/merges.pending" ]; do sleep 2; done ;;
  esac
  [ "$m" = base ] || [ -f "$AD/$m/adapter_config.json" ] || { echo "skill_rows: no adapter $AD/$m, skipped"; return; }
  for s in "${SETLIST[@]}"; do
    name=${s%%=*}; rest=${s#*=}; IFS=: read -r tasks n _ _ <<< "$rest"
    [ -f "$OUT/rows_${name}_$m.json" ] || [ -f "$OUT/answers/$name/$m.json" ] && continue
    mkdir -p "$OUT/answers/$name"
    "$PY" bench/gpu_memory.py answers --model "$GGUF" $([ "$m" = base ] || echo --adapter "$AD/$m") \
      --tasks "$tasks" --n "$n" --temperature 0.7 --top-p 0.8 --max-new-tokens "${MAX_NEW:-1280}" --share "1/$LANES" \
      --out "$OUT/answers/$name/$m.tmp" && mv "$OUT/answers/$name/$m.tmp" "$OUT/answers/$name/$m.json"
  done
}

score_all() {   # one scorer: each model's answers as they appear, in order
  local m s name tasks n mode fl rest
  for m in "${MODELS[@]}"; do
    for s in "${SETLIST[@]}"; do
      name=${s%%=*}; rest=${s#*=}; IFS=: read -r tasks n mode fl <<< "$rest"
      [ -f "$OUT/rows_${name}_$m.json" ] && continue
      until [ -f "$OUT/answers/$name/$m.json" ] || [ -f "$OUT/gen.done" ]; do sleep 2; done
      [ -f "$OUT/answers/$name/$m.json" ] || continue
      "$PY" bench/score_answers.py --answers "$OUT/answers/$name/$m.json" --tasks "$tasks" --target-mode "$mode" \
        $([ -n "$fl" ] && echo --floor "$fl") --workers "$WORKERS" --metrics-dir "$OUT/eval_$name" --out "$OUT/rows_${name}_$m.json" 2>&1 | grep -v "it/s\]$"
    done
  done
}

rm -f "$OUT/gen.done"
case " ${MODELS[*]} " in *" soup "*) touch "$AD/merges.pending"; { merges; rm -f "$AD/merges.pending"; } & ;; esac
score_all &
SCORER=$!
for ((lane = 0; lane < LANES; lane++)); do
  ( for ((i = lane; i < ${#MODELS[@]}; i += LANES)); do generate "${MODELS[$i]}"; done ) &
done
wait $(jobs -p | grep -v "^$SCORER$")
touch "$OUT/gen.done"
wait "$SCORER"
echo "skill_rows: done $(ls "$OUT"/rows_*.json 2>/dev/null | wc -l) row files"
