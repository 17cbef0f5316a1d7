#!/usr/bin/env bash
# Every device call sends the whole working tree (64 MiB with what it carries). The run's state
# (results/small2/state, ~10 MB per adapter) and other large committed results would crowd out the GGUF and
# the wheels, so during a device session they leave the working tree and travel inside the run bundle instead
# (pack_stage.sh run). They are committed: `restore` takes them back from HEAD.
#   bash bench/gpu/lean_tree.sh hide [MIN] # tracked files over MIN bytes (default 1 MB) under results/ leave the
#                                         tree (listed in .stage/hidden.txt); `hide 0`: every non-empty one, so the
#                                         bundle (pack_stage.sh run) fits two parts: fewer calls must find the
#                                         machine warm
#   bash bench/gpu/lean_tree.sh restore   # git checkout of that list
#   bash bench/gpu/lean_tree.sh size      # bytes a device call would send now (tracked + untracked, not ignored)
# hide refuses a file with uncommitted changes: nothing is lost.
set -euo pipefail
cd "$(dirname "$0")/../.."
LIST=.stage/hidden.txt
size() { { git ls-files -co --exclude-standard -z | xargs -0 -r stat -c %s 2>/dev/null || true; } \
         | awk '{s += $1} END {print s + 0}'; }     # hidden files are still tracked: stat skips them
case "${1:-}" in
  hide)
    mkdir -p .stage
    min=${2:-1000000}
    { git ls-files -z results | xargs -0 -r stat -c '%s %n' 2>/dev/null || true; } \
      | awk -v min="$min" '$1 > min {print $2}' > $LIST.new
    if ! git diff --quiet HEAD -- $(cat $LIST.new); then
      echo "lean_tree: uncommitted changes in files over $min bytes; commit them first"; rm $LIST.new; exit 1
    fi
    cat $LIST.new >> $LIST 2>/dev/null; sort -u -o $LIST $LIST; rm $LIST.new
    xargs -r rm -f < $LIST
    echo "lean_tree: $(wc -l < $LIST) files hidden; a device call now sends $(size) bytes" ;;
  restore)   # only what is still absent and still in HEAD: a newer file at the same path is kept
    if [ -f $LIST ]; then
      while IFS= read -r f; do
        [ -e "$f" ] || ! git cat-file -e "HEAD:$f" 2>/dev/null || git checkout HEAD -- "$f"
      done < $LIST
      rm $LIST
    fi
    echo "lean_tree: restored; the tree is $(size) bytes" ;;
  size) size ;;
  *) echo "usage: bash bench/gpu/lean_tree.sh hide [MIN_BYTES]|restore|size"; exit 2 ;;
esac
