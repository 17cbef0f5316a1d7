#!/usr/bin/env bash
# Set up an offline GPU box (torch/transformers/peft present, no package registry) from carried files.
#   source bench/offline_setup.sh STAGE_DIR
# STAGE_DIR may hold: wheels/*.whl (bitsandbytes, pyslang + nanobind-backend, datasets, gguf, ...),
# debs/*.deb (Debian's iverilog and bubblewrap). Wheels go to STAGE_DIR/site (installed once),
# .debs are unpacked once into STAGE_DIR/root and copied into /usr (root only; the scorer's sandbox
# shows /usr alone), so iverilog finds its compiled-in library folder.
stage=${1:?usage: source bench/offline_setup.sh STAGE_DIR}
if [ -d "$stage/wheels" ] && [ ! -e "$stage/site/.done" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$stage/site" "$stage"/wheels/*.whl && touch "$stage/site/.done"
fi
[ -d "$stage/site" ] && export PYTHONPATH="$stage/site${PYTHONPATH:+:$PYTHONPATH}"
if [ -d "$stage/debs" ] && [ ! -e "$stage/root/.done" ]; then
  for f in "$stage"/debs/*.deb; do dpkg -x "$f" "$stage/root"; done && touch "$stage/root/.done"
fi
# The scorer's sandbox shows only /usr, so the tools are copied there (root), never over existing files.
if [ -d "$stage/root/usr/bin" ] && ! command -v iverilog >/dev/null; then
  cp -rn "$stage/root/usr/." /usr/ 2>/dev/null || { echo "offline_setup: cannot copy into /usr (not root?)";
    export PATH="$stage/root/usr/bin:$PATH"; }
fi
command -v iverilog >/dev/null && echo "offline_setup: $(iverilog -V 2>&1 | head -1)"
python3 -c "import bitsandbytes, pyslang" 2>/dev/null && echo "offline_setup: bitsandbytes + pyslang import"
