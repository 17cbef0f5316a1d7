"""The joint RL experts on a GPU, on the tiny random model (no model file, no simulator): rl.py runs expert0 alone and
then expert0 and expert1 in one process, with the fast decoder and CUDA graphs (the graphs are captured in one
rollout thread and replayed in others). Checks that every generate call of the joint run is one stacked call over
both experts' rows, and how far expert0's joint run is from its run alone (on the GPU the kernels need not repeat
bit for bit; tests/test_rl_joint.py shows them equal on CPU). Writes a JSON record.

    python bench/gpu/joint_smoke.py --out results/joint_smoke.json [--steps 3]

Needs pyslang importable (the kit's scorer modules import it); the scorer itself is scripted here.
"""
import argparse
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import common  # noqa: E402
import rl  # noqa: E402
from score import Score  # noqa: E402

AND_RTL = "module and_gate(input a, input b, output y);\n  assign y = a & b;\nendmodule\n"
TASKS = [{"id": f"and{k}", "spec_files": [], "rtl_files": [{"name": "and_gate.sv", "content": AND_RTL}],
          "dut_module_name": "and_gate", "dut_instance_name": "dut",
          "instruction": "Write a testbench for and_gate; instance name dut.",
          "targets": [{"inst_name": "dut", "metric": "overall_average", "target_percentage": 90.0}]} for k in range(4)]


def score(task, c):
    """Reward from the text (tests/test_rl.py's scripted scorer), so groups have variance."""
    r = [0.0, 1.0 + (len(c.text) % 7) / 10, 1.2][sum(map(ord, c.text)) % 3]
    s = Score(r, "ok" if r else "compile_error", r - 1 if r else None, r > 1.5, r > 0, r > 0)
    return lambda: s


def initial_adapter(seed, folder, model_seed=7):
    """An initial LoRA adapter (r 4) for the tiny model of `--model tiny --seed model_seed`, with a random non-zero
    B so that it matters, saved in folder (tests/test_rl_joint.py uses it too)."""
    model, _ = common.tiny_model(seed=model_seed)
    torch.manual_seed(seed)
    m = common.add_lora(copy.deepcopy(model), r=4, alpha=8)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    return common.save_adapter(m, folder)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results/joint_smoke.json")
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("joint_smoke: needs a CUDA GPU")
    tiny = common.tiny_model
    common.tiny_model = lambda seed=0, **k: (lambda mt: (mt[0].to("cuda"), mt[1]))(tiny(seed, **k))
    work = Path(tempfile.mkdtemp(prefix="joint_smoke_"))
    common.tiny_model = tiny                      # the adapters are made on CPU, then loaded onto the GPU's model
    inits = [initial_adapter(seed, work / f"init{seed}") for seed in (1, 2)]
    common.tiny_model = lambda seed=0, **k: (lambda mt: (mt[0].to("cuda"), mt[1]))(tiny(seed, **k))
    base = ["--model", "tiny", "--tasks", "unused", "--prompts-per-step", "2", "--group-size", "4",
            "--max-new-tokens", "48", "--lr", "1e-2", "--profile", "paper", "--seed", "7", "--plot-every", "0",
            "--steps", str(a.steps), "--save-every", str(a.steps), "--gen-chunk", "2"]
    calls, real = [], common.generate

    def spy(model, tok, msgs, **kw):
        calls.append(kw.get("adapters"))
        return real(model, tok, msgs, **kw)
    t0 = time.perf_counter()
    rl.run(rl.parse_args(base + ["--adapter", inits[0], "--out", str(work / "s0")]), score_fn=score, tasks=TASKS)
    t_solo = time.perf_counter() - t0
    common.generate = spy
    t0 = time.perf_counter()
    rl.run(rl.parse_args(base + ["--adapter", *inits, "--out", str(work / "j0"), str(work / "j1")]), score_fn=score,
           tasks=TASKS)
    t_joint = time.perf_counter() - t0
    common.generate = real
    weights = lambda d: torch.load(work / d / "ckpt" / f"step_{a.steps:06d}" / "optimizer.pt",   # noqa: E731
                                   weights_only=False)["trainable"]
    ws, wj = weights("s0"), weights("j0")
    log = lambda d: [json.loads(x) for x in (work / d / "log.jsonl").read_text().splitlines()]   # noqa: E731
    stacked = [c is not None and sorted(set(c)) == ["expert0", "expert1"] for c in calls]
    rec = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "steps": a.steps,
           "joint_calls": len(calls), "joint_calls_stacked": sum(stacked),
           "expert0_max_abs_weight_diff_joint_vs_alone": max(float((ws[k] - wj[k]).abs().max()) for k in ws),
           "expert0_rewards_alone": [r.get("reward") for r in log("s0")],
           "expert0_rewards_joint": [r.get("reward") for r in log("j0")],
           "expert1_rewards_joint": [r.get("reward") for r in log("j1")],
           "wall_s_alone_one_expert": round(t_solo, 1), "wall_s_joint_two_experts": round(t_joint, 1),
           "note": "tiny random model: the wall times include CUDA graph captures and say nothing of speed at scale",
           "verdict": "pass" if calls and all(stacked) else "fail"}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(rec, indent=1) + "\n")
    print(json.dumps(rec, indent=1))
    return 0 if rec["verdict"] == "pass" else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
