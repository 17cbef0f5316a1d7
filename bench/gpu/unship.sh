#!/usr/bin/env bash
# On the CPU box: the parts a device session's `PART=ship` returned (ship.tgz.partNN + ship.sha256, in one or more
# folders) joined, checked and unpacked into results/small2/state/s2st: each stage folder the archive holds replaces
# the state's folder of that name, the others stay. A data stage (data2: its rows quote the third-party corpus's
# RTL) goes to the ignored runs/s2st/NAME instead, never to results/, and its rows' sha256 sums to
# results/small2/state/NAME.sha256 (committed: pack_stage.sh bundles that data2 while sft2 is not done).
# Machine paths in the .json / .jsonl files are written as ~/stage and $OUT, adapter_config.json's base model path
# included (nothing loads a base by that path). Every adapter committed here is rewritten, and a stage started from
# one keeps its path (common.load_adapter keeps the loaded config), so the experts of later sessions agree on it for
# merge.py's same-base check. A fresh stage (sft0 again) run beside restored ones would write the device home's
# path: ship it before merging. Then commit results/small2/state: the next session's bundle reads it from HEAD.
#   bash bench/gpu/unship.sh DIR [DIR ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { echo "usage: bash bench/gpu/unship.sh DIR [DIR ...]"; exit 2; }
DEVICE_HOME=/root     # the device's home: its ~/stage and $OUT (/root/out) appear in the shipped files
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
for d in "$@"; do cp "$d"/ship.tgz.part* "$W"/ 2>/dev/null || true; cp "$d"/ship.sha256 "$W"/ 2>/dev/null || true; done
[ -f "$W/ship.sha256" ] || { echo "unship: no ship.sha256 in $*"; exit 1; }
cat "$W"/ship.tgz.part* > "$W/ship.tgz"
(cd "$W" && sha256sum -c ship.sha256) || { echo "unship: parts missing or corrupt (ask for the rest with FIRST=4, 8, ...)"; exit 1; }
mkdir -p "$W/x" && tar xzf "$W/ship.tgz" -C "$W/x"
[ -d "$W/x/s2st" ] || { echo "unship: the archive holds no s2st/"; exit 1; }
find "$W/x" -path '*/s2st/data*' -prune -o -type f \( -name '*.json' -o -name '*.jsonl' \) -print0 \
  | xargs -0 -r sed -i -e "s#$DEVICE_HOME/stage#~/stage#g" -e "s#$DEVICE_HOME/out#\$OUT#g"
mkdir -p results/small2/state/s2st
for d in "$W"/x/s2st/*/; do
  name=$(basename "$d")
  case $name in data*)
    rm -rf "runs/s2st/$name" && mkdir -p runs/s2st && mv "$d" runs/s2st/
    (cd runs/s2st && find "$name" -name '*.jsonl' -type f | LC_ALL=C sort | xargs -r sha256sum) \
      > "results/small2/state/$name.sha256"
    echo "unship: $name to runs/s2st/$name (not committed; its sums: results/small2/state/$name.sha256)"; continue ;;
  esac
  rm -rf "results/small2/state/s2st/$name"; mv "$d" results/small2/state/s2st/
  echo "unship: $name $(du -sh "results/small2/state/s2st/$name" | cut -f1)"
done
du -sh results/small2/state/s2st
