#!/usr/bin/env bash
# Issue 21's run (the `small` profile, stimulus mode, 1000 real + 369 synthetic designs, validation during
# training) on one offline H200, spread over several device sessions of 30 minutes and calls of 10 minutes.
# Every stage resumes from what its run folder holds, so a part cut short is simply called again.
#
# Staging, each call within 30 s of the previous one (the machine stays warm; ~/stage survives):
#   PART=setup   bash bench/gpu/small2_stage0.sh   carry .stage/g1 .stage/s1   wheels, .debs, GGUF part 1
#   PART=stash   bash bench/gpu/small2_stage0.sh   carry .stage/g2             GGUF part 2
#   PART=stash   bash bench/gpu/small2_run.sh      carry .stage/shipN .stage/run8  earlier sessions' ship parts (2 x
#                                                  15 MB fit one call beside the tracked tree; run8 in the first),
#                                                  as many calls as needed
#   PART=restore bash bench/gpu/small2_run.sh      carry .stage/g3             GGUF part 3, then the run's data and the
#                                                  ship parts joined (checked against ship.sha256) and unpacked
# (the tracked tree is ~25 MB and a call carries 64 MiB in all: g3 + run8 + the tree no longer fit one call)
# Work:
#   PART=stage STAGES="sft0" T=560 bash bench/gpu/small2_run.sh    chorus_mini.py run --only STAGES, cut at T s
#   PART=stage STAGES="rl0 rl1 rl2" PARALLEL=1 ...                  the stages side by side, one process each
#   PART=ship    bash bench/gpu/small2_run.sh      the run's state as ship.tgz.partNN (15 MB each) + ship.sha256:
#                                                  stage folders without training checkpoints (unless SHIP_CKPT=1:
#                                                  RL/OPD resume across sessions; ~60 MB per RL run) and without
#                                                  the validated SFT adapters. A call returns 4 parts (the device
#                                                  brings back 64 MiB), FIRST..FIRST+3 (FIRST=0 default; packed once
#                                                  per session unless SHIP_NEW=1): call again with FIRST=4, 8, ...
#   PART=ship_val bash bench/gpu/small2_run.sh     every validated SFT adapter (val.tgz.partNN + val.sha256, FIRST= as
#                                                  for ship), for the CPU box
# .stage/run8 is made on the CPU box: s2st_run.tgz = runs/s2st/data (the data stage of
# `chorus_mini.py run --profile small --set answer_mode=stimulus`, built in session 5, plus data/val_sft and
# data/tuning_tasks.jsonl, session 8) and dev_tasks.jsonl. A session's ship files go to .stage/ship1, ship2, ...
# (ship.sha256 and at most two parts in each) for the next session's stash calls.
set -u
S=~/stage
export PYTHONUNBUFFERED=1 CHORUS_CACHE=$S/cache
M=$S/smollm2.gguf
R=runs/s2st
PROFILE=${PROFILE:-small}     # PROFILE=smoke (with EXTRA="--set model=tiny"): a CPU dry run of this script
# The run's budgets (issue 21): each SFT stage hands on its best validated epoch; each RL expert trains until its
# tuning-split reward plateaus, at least 100 and at most 300 steps; the three OPD variants get one budget of 60 steps.
RUN=(--set sft_pick=best --set rl_steps=300 --set rl_min_steps=100 --set rl_stop_on_plateau=true --set opd_steps=60)
SETS=(--set "model=$M" --set sim_workers=14 --set eval_tasks=runs/dev_tasks.jsonl --set answer_mode=stimulus
      "${RUN[@]}" ${EXTRA:-})

mkdir -p $S/g1 $S/ship $S/run8 && cp .stage/g*/gguf.part* $S/g1/ 2>/dev/null
cp .stage/ship*/ship.tgz.part* .stage/ship*/ship.sha256 $S/ship/ 2>/dev/null   # ship parts, over as many calls as needed
cp .stage/run8/* $S/run8/ 2>/dev/null      # the run's data may travel in a stash call too (restore reads ~/stage/run8)
[ "${PART:-}" = stash ] && { ls $S/ship $S/run8; exit 0; }
if [ "${PART:-}" = restore ]; then
  [ -f $M ] || cat $S/g1/gguf.part* > $M
  echo "gguf sha256 $(sha256sum $M | cut -c1-16)"
  mkdir -p $S/runs
  tar xzf $S/run8/s2st_run.tgz -C $S/runs && cp $S/run8/dev_tasks.jsonl $S/runs/
  if ls $S/ship/ship.tgz.part* >/dev/null 2>&1; then
    cat $S/ship/ship.tgz.part* > $S/ship.tgz
    (cd $S && sha256sum -c ship/ship.sha256) || { echo "restore: ship parts missing or corrupt"; exit 1; }
    tar xzf $S/ship.tgz -C $S/runs && rm $S/ship.tgz
  fi
  ls $S/runs/s2st
  exit 0
fi
source bench/offline_setup.sh $S
[ -e runs ] || ln -s $S/runs runs

if [ "${PART:-}" = stage ]; then
  # One process group, so a cut leaves nothing running; the stage resumes in the next call.
  # PARALLEL=1: each of STAGES in a process of its own, side by side on the GPU (the three RL experts: a 135M
  # model leaves an H200 mostly idle), the simulator workers split between them; logs $OUT/stage_NAME.log.
  : "${STAGES:?STAGES=...}"
  if [ "${PARALLEL:-0}" = 1 ]; then
    n=$(echo $STAGES | wc -w); w=$(( 14 / n > 2 ? 14 / n : 2 ))
    setsid bash -c 'for s in '"$STAGES"'; do python3 chorus_mini.py run --profile '"$PROFILE"' --out '"$R"' --only $s \
        "$@" --set sim_workers='"$w"' > '"$OUT"'/stage_$s.log 2>&1 & pids+=($!); done
        rc=0; for p in "${pids[@]}"; do wait $p || rc=1; done; exit $rc' _ "${SETS[@]}" > $OUT/stage.log 2>&1 & P=$!
  else
    setsid python3 chorus_mini.py run --profile $PROFILE --out $R --only $STAGES "${SETS[@]}" > $OUT/stage.log 2>&1 & P=$!
  fi
  for i in $(seq ${T:-560}); do kill -0 $P 2>/dev/null || break; sleep 1; done
  kill -0 $P 2>/dev/null && { kill -9 -- -$P; echo "== cut at ${T:-560} s"; }
  wait $P 2>/dev/null; echo "== rc $?"
  for f in $OUT/stage*.log; do echo "-- $f"; tail -${TAIL:-15} $f | cut -c1-300; done
  for s in $STAGES; do [ -f $R/$s/log.jsonl ] && cp $R/$s/log.jsonl $OUT/${s}_log.jsonl; done
fi

# pack NAME ARCHIVE-COMMAND: ARCHIVE-COMMAND writes a .tgz to stdout; packed once per session (or again with
# SHIP_NEW=1) into ~/stage/NAME_out as 15 MB parts + NAME.sha256 (written last, only when every step worked);
# a call returns four parts, FIRST..FIRST+3 (the device brings back 8 files and 64 MiB at most per call)
pack() {
  local name=$1 D=$S/$1_out; shift
  if [ ! -f $D/$name.sha256 ] || [ "${SHIP_NEW:-0}" = 1 ]; then
    rm -rf $D && mkdir -p $D
    "$@" > $D/$name.tgz && (cd $D && sha256sum $name.tgz > sha.tmp && split -b 15000000 -d -a 2 $name.tgz $name.tgz.part \
      && rm $name.tgz && mv sha.tmp $name.sha256) || { echo "pack $name: failed"; rm -rf $D; return 1; }
  fi
  local parts=($D/$name.tgz.part*) first=${FIRST:-0}
  cp $D/$name.sha256 "${parts[@]:$first:4}" $OUT/
  echo "$name: parts from $first (four at most) of ${#parts[@]}, $(du -cb "${parts[@]}" | tail -1 | cut -f1) bytes in all"
  ls -la $OUT
}
if [ "${PART:-}" = ship ]; then
  # ship.tgz: what later stages need (the next session carries it back in .stage/shipN: the tracked tree plus the
  # carried files of one call stay under 64 MiB). Training checkpoints only with SHIP_CKPT=1.
  ex=(--exclude='s2st/data' --exclude='*/val_ckpt')
  [ "${SHIP_CKPT:-0}" = 1 ] || ex+=(--exclude='*/ckpt')
  pack ship tar czf - -C $S/runs "${ex[@]}" s2st
fi
if [ "${PART:-}" = ship_val ]; then
  # every validated SFT adapter, for the CPU box only (stopping-point choice, results/small2/)
  pack val bash -c "cd $S/runs && find s2st -path '*/val_ckpt/*' -name 'adapter_*' | tar czf - -T -"
fi
