#!/usr/bin/env bash
# Issue 21's run (the `small` profile, stimulus mode, 1000 real + 369 synthetic designs, validation during
# training) on one offline H200, spread over several device sessions of 30 minutes and calls of 10 minutes.
# Every stage resumes from what its run folder holds, so a part cut short is simply called again.
#
# On the CPU box first (a new session's checkout has none of the ignored files):
#   bash bench/gpu/lean_tree.sh hide 0        committed files under results/ (the run's state, older adapters,
#                                             plots) leave the working tree, which every call sends, so the bundle
#                                             is two parts; `restore` after the last call
#   bash bench/gpu/pack_stage.sh run          .stage/r1..rN: wheels, .debs, the GGUF, the data stage (runs/s2st/data,
#                                             built on the CPU box) and the run's state (results/small2/state/s2st)
#                                             as one bundle, each part as large as a call can carry beside the tree
# Staging, each call within 30 s of the previous one (the machine stays warm; ~/stage survives; in session 14 a
# second call came too late once and found a new machine):
#   PART=stash   bash bench/gpu/small2_run.sh   carry .stage/rK   once per part, K = 1..N
#   PART=restore bash bench/gpu/small2_run.sh   joins the parts, checks bundle.sha256, unpacks into ~/stage, installs
#                                               (may share a call with the last stash: PART=restore after PART=stash)
#   With two parts every call can be the same, carrying r1 and r2 in turn, until one restores (a cold machine
#   only costs its start): PART=stash ...; set -o pipefail; PART=restore ... | tail -8 && PART=stage ...
#   After that, PART=stage alone: a second restore would unpack the bundle over what the stages wrote.
# Work:
#   PART=stage STAGES="sft0" T=560 bash bench/gpu/small2_run.sh    chorus_mini.py run --only STAGES, cut at T s; the
#                                                   training stages stop themselves, checkpointed, SLACK=25 s before
#   PART=stage STAGES="rl0 rl1 rl2" PARALLEL=1 ...                  the stages side by side, one process each
#   PART=stage STAGES="eval@base,sft0,rl0 merge+eval@soup,ties" PARALLEL=1 ...   WORD@M1,M2: that process evaluates
#                                                   only those models (--set eval_models=M1,M2, names as in
#                                                   chorus_mini.py's model_adapters; only eval and eval_syn take it,
#                                                   and the word ends in one of them: opd+eval@rl0 trains, then
#                                                   evaluates; val always runs all three experts); each model's folder is done
#                                                   on its own, shipped as it finishes and skipped by later calls.
#                                                   Merged models need `merge+` in the same process (one word
#                                                   only): merges are not shipped, so each session recomputes
#                                                   them, also the one whose full `eval` run (no @) writes
#                                                   eval/done.json for compare. Without PARALLEL, STAGES is one
#                                                   such word ("eval+eval_syn@rl0")
#   PART=ship_samples ...                          the finished evaluations' samples.jsonl, which PART=ship leaves out
#                                                  (several MB a model), as samples.tgz.partNN; packed once per
#                                                  session (SHIP_NEW=1 packs again; exit 1 when none has finished).
#                                                  CPU box: check samples.sha256, untar into the ignored runs/
#   PART=stage STAGES="data2+sft2" ...                             a+b: one process that runs a, then b. data2 runs
#                                                   alone: it does not resume, and beside rl0 and rl1 (session 14) it
#                                                   had not finished after 1,030 s in two calls (alone: 373 s)
#     A stage call returns its logs as logs.tgz and then ships (below) what this session ran so far, so nothing is
#     lost if the machine goes cold before the next call (SHIP=0: no ship). Leave ~30 s of the call for it.
#   PART=ship    bash bench/gpu/small2_run.sh      the stages that ran in this session (bench/gpu/ship_list.py: the
#                                                  adapters later stages read, handoffs of training runs cut short, the
#                                                  merge stage's tuning scores, a finished data2; no merges, no data/) as
#                                                  ship.tgz.partNN (15 MB each) + ship.sha256. A call returns 4 parts
#                                                  (the device brings back 64 MiB), FIRST..FIRST+3 (FIRST=0 default;
#                                                  packed once per session unless SHIP_NEW=1): again with FIRST=4, 8, ...
#   (the merge stage's adapters are recomputed, not shipped: a session that evaluates runs STAGES="merge eval")
# Back on the CPU box: bash bench/gpu/lean_tree.sh restore, then bash bench/gpu/unship.sh DIR (the returned parts:
# the stage folders it holds replace those of results/small2/state/s2st), then commit results/small2/state (the only
# place a session's results survive).
set -u
S=~/stage
export PYTHONUNBUFFERED=1 CHORUS_CACHE=$S/cache
M=$S/smollm2.gguf
R=runs/s2st
PROFILE=${PROFILE:-small}     # PROFILE=smoke (with EXTRA="--set model=tiny"): a CPU dry run of this script
# The run's budgets (issue 21): each SFT stage hands on its best validated epoch; each RL expert trains until its
# tuning-split reward plateaus, at least 100 and at most 300 steps; the three OPD variants get one budget of 50 steps
# (the issue's minimum; 60 until session 19, where side by side they took 33-48 s a step: results/small2_run.md).
RUN=(--set sft_pick=best --set rl_steps=300 --set rl_min_steps=100 --set rl_stop_on_plateau=true --set opd_steps=50)
SETS=(--set "model=$M" --set sim_workers=14 --set eval_tasks=runs/dev_tasks.jsonl --set answer_mode=stimulus
      "${RUN[@]}" ${EXTRA:-})

mkdir -p $S/parts && cp .stage/r[0-9]*/bundle.* $S/parts/ 2>/dev/null   # the parts this call carries
[ "${PART:-}" = stash ] && { ls $S/parts; exit 0; }
if [ "${PART:-}" = restore ]; then
  cat $S/parts/bundle.part* > $S/bundle.tgz
  (cd $S && sha256sum -c parts/bundle.sha256) || { echo "restore: bundle parts missing or corrupt"; rm -f $S/bundle.tgz; exit 1; }
  tar xzf $S/bundle.tgz -C $S && rm $S/bundle.tgz
  touch $S/restored.stamp         # PART=ship sends only the stages that ran after this
  echo "gguf sha256 $(sha256sum $M | cut -c1-16)"
  source bench/offline_setup.sh $S
  ls $S/runs/s2st
  exit 0
fi
source bench/offline_setup.sh $S
[ -e runs ] || ln -s $S/runs runs

if [ "${PART:-}" = stage ]; then
  # One process group, so a cut leaves nothing running; the stage resumes in the next call.
  # PARALLEL=1: each of STAGES in a process of its own, side by side on the GPU (the three RL experts: a 135M
  # model leaves an H200 mostly idle, though the processes share its time: in session 14 two RL experts side by
  # side took a median 21.9 and 18.4 s a step against 13.1 s alone, 1.3x the throughput; a word a+b runs a then b
  # in its process), the simulator workers split between them, and each process capped at CAP_GIB (default
  # 130 / the number of processes, words of STAGES) through $CHORUS_GPU_CAP_GIB: each sizes its batches to the
  # memory it sees free, so uncapped the first to start takes most of the card and the others run out (session 13).
  : "${STAGES:?STAGES=...}"
  bad() { echo "small2_run: $*"; exit 2; }
  for s in $STAGES; do      # WORD@MODELS: the word ends in eval or eval_syn, which take the subset (the stages
    st=${s%%@*}; [ "$st" = "$s" ] && continue     # before them, merge+ or opd+, ignore it); without PARALLEL one word
    case ${st##*+} in eval|eval_syn) ;; *) bad "$s: @MODELS subsets eval and eval_syn only (they end the word)";; esac
    [ "${PARALLEL:-0}" = 1 ] || [ "$(echo $STAGES | wc -w)" = 1 ] || bad "without PARALLEL=1, @MODELS takes one word (merge+eval@soup)"
  done
  [ "${PARALLEL:-0}" = 1 ] && [ "$(echo $STAGES | tr ' +@' '\n\n\n' | grep -c '^merge$')" -gt 1 ] \
    && bad "merge in two words: two processes would write one merge folder"
  # sft.py, rl.py and distill.py stop between steps, checkpointed, SLACK s before the cut ($CHORUS_DEADLINE, exit 75):
  # a kill at T would lose every step since the last --save-every checkpoint (session 14 lost 27 of 87 RL steps so)
  export CHORUS_DEADLINE=$(( $(date +%s) + ${T:-560} - ${SLACK:-25} ))
  if [ "${PARALLEL:-0}" = 1 ]; then
    n=$(echo $STAGES | wc -w); w=$(( 14 / n > 2 ? 14 / n : 2 ))
    export CHORUS_GPU_CAP_GIB=${CAP_GIB:-$(( 130 / n ))}
    setsid bash -c 'for s in '"$STAGES"'; do st=${s%%@*}; m=(); [ "$st" = "$s" ] || m=(--set "eval_models=${s#*@}")
        python3 chorus_mini.py run --profile '"$PROFILE"' --out '"$R"' --only ${st//+/ } "$@" "${m[@]}" \
        --set sim_workers='"$w"' > '"$OUT"'/stage_${s//[@,]/_}.log 2>&1 & pids+=($!); done
        rc=0; for p in "${pids[@]}"; do wait $p || rc=1; done; exit $rc' _ "${SETS[@]}" > $OUT/stage.log 2>&1 & P=$!
  else
    m=(); [ "$STAGES" = "${STAGES%%@*}" ] || m=(--set "eval_models=${STAGES#*@}")    # one word: eval@rl0,rl1
    st=${STAGES%%@*}
    setsid python3 chorus_mini.py run --profile $PROFILE --out $R --only ${st//+/ } "${SETS[@]}" "${m[@]}" > $OUT/stage.log 2>&1 & P=$!
  fi
  for i in $(seq ${T:-560}); do kill -0 $P 2>/dev/null || break; sleep 1; done
  kill -0 $P 2>/dev/null && { kill -9 -- -$P; echo "== cut at ${T:-560} s"; }
  wait $P 2>/dev/null; echo "== rc $?"
  for f in $OUT/stage*.log; do echo "-- $f"; tail -${TAIL:-15} $f | cut -c1-300; done
  for s in $(echo $STAGES | sed 's/@[^ ]*//g; s/+/ /g'); do [ -f $R/$s/log.jsonl ] && cp $R/$s/log.jsonl $OUT/${s}_log.jsonl; done
  # the logs as one file (a call returns 8 files at most), then the ship in the same call (SHIP=0: not): a machine
  # that goes cold before a separate PART=ship call loses the session's work (session 13 lost sft2 and 35 RL steps)
  (cd $OUT && shopt -s nullglob && f=(stage*.log *_log.jsonl) && tar czf logs.tgz "${f[@]}" && rm -f "${f[@]}")
  [ "${SHIP:-1}" = 1 ] && { PART=ship; SHIP_NEW=1; }
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
  [ ${#parts[@]} -le $((first + 4)) ] || echo "$name: NOT ALL PARTS RETURNED: call PART=$name FIRST=$((first + 4)) next"
  ls -la $OUT
}
if [ "${PART:-}" = ship ]; then
  # what later sessions need (results/small2/state/s2st, committed on the CPU box); bench/gpu/ship_list.py chooses
  since=(); [ -f $S/restored.stamp ] && since=(--since $S/restored.stamp)
  # nothing to ship yet (a data2 build was cut) or a bad run folder: say why, keep an earlier pack
  B=$PWD/bench/gpu/ship_list.py
  if why=$(cd $S/runs && python3 $B s2st ${since[*]} 2>&1 > /dev/null); then
    pack ship bash -c "set -o pipefail; cd $S/runs && python3 $B s2st ${since[*]} | tar czf - -T -"
  else
    echo "ship: not packed: $why"
  fi
fi
if [ "${PART:-}" = ship_samples ]; then
  # the evaluations' samples.jsonl (every answer and its scorer result), which PART=ship leaves out: CPU box only
  pack samples bash -c "set -o pipefail; shopt -s nullglob; cd $S/runs && for f in s2st/{val,eval,eval_syn}/*/samples.jsonl; do \
    if [ -f \"\${f%/*}/done.json\" ]; then echo \"\$f\"; fi; done | grep . | tar czf - -T -" || exit 1
fi
if [ "${PART:-}" = ship_val ]; then
  # every validated SFT adapter, for the CPU box only (stopping-point choice, results/small2/)
  pack val bash -c "cd $S/runs && find s2st -path '*/val_ckpt/*' -name 'adapter_*' | tar czf - -T -"
fi
