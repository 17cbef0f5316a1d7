#!/usr/bin/env bash
# Publish finished stages of issue 21's run as bf16 peft folders (README "Published adapters"), on the CPU box:
#   bash bench/gpu/publish_adapters.sh rl0 rl1 rl2          results/small2/state/s2st/NAME/adapter ->
#                                                           results/small2/adapters/NAME_stimulus
# Only a finished stage (its done.json committed) is published. The weights are copied unchanged (git stores
# them once); the config names the base model file instead of the device's cache folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
S=results/small2/state/s2st D=results/small2/adapters
[ $# -gt 0 ] || { echo "usage: publish_adapters.sh STAGE [STAGE ...]  (e.g. rl0 rl1 rl2 opd)"; exit 2; }
for n in "$@"; do
  [ -f $S/$n/done.json ] && [ -f $S/$n/adapter/adapter_model.safetensors ] \
    || { echo "publish_adapters: $S/$n is not a finished stage with an adapter"; exit 1; }
done
for n in "$@"; do
  mkdir -p $D/${n}_stimulus
  cp $S/$n/adapter/adapter_model.safetensors $D/${n}_stimulus/
  python3 -c 'import json, sys
c = json.load(open(sys.argv[1])); c["base_model_name_or_path"] = "SmolLM2-135M-Instruct.Q4_1.gguf"
json.dump(c, open(sys.argv[2], "w"), indent=2, sort_keys=True)' $S/$n/adapter/adapter_config.json $D/${n}_stimulus/adapter_config.json
  echo "publish_adapters: $D/${n}_stimulus ($(sha256sum $D/${n}_stimulus/adapter_model.safetensors | cut -c1-16))"
done
