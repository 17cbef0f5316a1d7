"""Where the merge stage's time goes: merge.py on three random LoRA experts of a given model shape.

    python bench/profile_merge.py --layers 4                      # Qwen3-4B shapes, 4 of 36 layers, CPU
    python bench/profile_merge.py --small --layers 6              # SmolLM2-135M shapes, 6 of 30 layers
    python bench/profile_merge.py --device cuda --json $OUT/merge_profile.json   # full 4B size on a GPU

It writes three peft adapter folders (all 7 projections of every layer, r 16, alpha 32 as the kit's
adapters, bf16 as sft.py saves them; B random, or zero with --zero-b as in the session-8 run whose SFT and
RL took no step), then runs every merge the merge stage runs (chorus_mini.MERGES), with the argv
chorus_mini.merge_cmd builds for the profile (`4b`, or `small` with --small: --space, --rank, --density,
--seed, --lam), only --device replaced by this script's --device. merge.main runs in this process so that
the phases can be timed: each merge.py function named in PHASES is wrapped by a timer (on CUDA with a
synchronize on both sides, which removes some overlap; the totals are merge.py's own timings).

Reduced layer counts (--layers) give the time of that many layers; the JSON's `extrapolated_s` scales the
per-module phases by full_layers / layers and adds the fixed part (start-up, config, write of the small
files) once. It is an estimate, marked as such; a full-size run (--layers 0 = all) measures it.
The merge stage merges each method once and rescales it to the profile's other merge_lams (merge.py --rescale,
a fraction of a second each), so one merge per method (lambda 1, the default here) is the stage's merge work;
--all-lams merges at every lambda (what the stage did before --rescale).
The "drop" phase (DARE/DELLA's random draws) runs in one thread per expert: its seconds add up the threads'
wall times, an upper bound of the phase's share of the merge.
"""
import argparse
import contextlib
import io
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import chorus_mini  # noqa: E402
import profiles  # noqa: E402
import common  # noqa: E402
import merge  # noqa: E402

SHAPES = {   # name -> (hidden, intermediate, layers, query heads, kv heads, head dim)
    "4b": (2560, 9728, 36, 32, 8, 128),        # Qwen3-4B
    "small": (576, 1536, 30, 9, 3, 64),        # SmolLM2-135M
}
# merge.py functions timed as phases (a missing name is skipped, so the script runs on older merge.py too)
PHASES = {"read": ["load_factors"], "delta": ["task_vectors"], "trim": ["trim_magnitude"],
          "drop": ["random_keep", "della_keep_prob", "uniform_draws"], "elect": ["elect_sign_merge"],
          "svd": ["svd_dense", "svd_lowrank_product"], "write": ["save_file"]}


def module_shapes(hidden, inter, q_heads, kv_heads, head_dim):
    """(out, in) of the 7 LoRA targets of one decoder layer."""
    q, kv = q_heads * head_dim, kv_heads * head_dim
    return {"self_attn.q_proj": (q, hidden), "self_attn.k_proj": (kv, hidden), "self_attn.v_proj": (kv, hidden),
            "self_attn.o_proj": (hidden, q), "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
            "mlp.down_proj": (hidden, inter)}


def write_adapter(out_dir, seed, shapes, n_layers, r, alpha, zero_b=False, dtype=torch.bfloat16):
    """A peft LoRA folder with random factors (A ~ N(0, 1/in) as LoRA's init scale, B ~ N(0, 0.01^2))."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for layer in range(n_layers):
        for name, (n_out, n_in) in shapes.items():
            stem = f"base_model.model.model.layers.{layer}.{name}"
            sd[stem + ".lora_A.weight"] = (torch.randn(r, n_in, generator=g) / n_in ** 0.5).to(dtype)
            b = torch.zeros(n_out, r) if zero_b else torch.randn(n_out, r, generator=g) * 0.01
            sd[stem + ".lora_B.weight"] = b.to(dtype)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(out_dir / merge.ADAPTER_FILE))
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": sorted(shapes), "bias": "none",
           "base_model_name_or_path": "random", "task_type": "CAUSAL_LM", "lora_dropout": 0.05}
    (out_dir / merge.CONFIG_FILE).write_text(json.dumps(cfg))
    return out_dir


class PhaseTimer:
    """Wraps merge.py functions by name; accumulates seconds per phase (CUDA synchronized around each call)."""

    def __init__(self, cuda):
        self.cuda, self.seconds, self.calls, self.saved = cuda, {}, {}, []
        self.depth = 0

    def wrap(self, phase, name):
        fn = getattr(merge, name, None)
        if fn is None:
            return

        def timed(*a, **kw):
            if self.depth:                      # nested inside another timed phase: counted there
                return fn(*a, **kw)
            if self.cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            self.depth += 1
            try:
                return fn(*a, **kw)
            finally:
                self.depth -= 1
                if self.cuda:
                    torch.cuda.synchronize()
                self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0
                self.calls[phase] = self.calls.get(phase, 0) + 1
        self.saved.append((name, fn))
        setattr(merge, name, timed)
        if name in ("soup", "ties", "dare_ties", "della"):
            merge.METHODS[name] = timed

    def reset(self):
        self.seconds, self.calls = {}, {}

    def restore(self):
        for name, fn in self.saved:
            setattr(merge, name, fn)


def hardware():
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    hw = {"cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        hw["gpu"] = torch.cuda.get_device_name(0)
    return hw


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="SmolLM2-135M shapes and the small profile (default: 4b)")
    ap.add_argument("--layers", type=int, default=4, help="layers to build (0 = all of the model's)")
    ap.add_argument("--r", type=int, default=16)
    ap.add_argument("--device", default="cpu", help="merge.py --device (the profiles use cuda)")
    ap.add_argument("--methods", nargs="+", default=list(chorus_mini.MERGES), help="names of chorus_mini.MERGES")
    ap.add_argument("--all-lams", action="store_true", help="each method at each of the profile's merge_lams")
    ap.add_argument("--zero-b", action="store_true", help="B = 0 (untrained adapters, as in the session-8 run)")
    ap.add_argument("--workdir", help="where the adapters and merges go (default: a temporary folder)")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    for m in args.methods:
        if m not in chorus_mini.MERGES:
            sys.exit(f"profile_merge.py: error: unknown merge {m!r}; choose from {', '.join(chorus_mini.MERGES)}")
    profile = "small" if args.small else "4b"
    hidden, inter, full_layers, qh, kvh, hd = SHAPES[profile]
    n_layers = args.layers or full_layers
    if not 0 < n_layers <= full_layers:
        sys.exit(f"profile_merge.py: error: --layers must be in 0..{full_layers}, got {args.layers}")
    shapes = module_shapes(hidden, inter, qh, kvh, hd)
    c = dict(profiles.PROFILES[profile], merge_device=args.device)
    lams = (c["merge_lams"] or [None]) if args.all_lams else [1.0 if c["merge_lams"] else None]
    cuda = torch.device(args.device).type == "cuda"
    timer = PhaseTimer(cuda)
    for phase, names in PHASES.items():
        for name in names:
            timer.wrap(phase, name)
    result = {"bench": "profile_merge", "command": "python " + " ".join(map(shlex.quote, sys.argv)),
              "git": common.git_info(), "hardware": hardware(),
              "versions": {"python": platform.python_version(), "torch": torch.__version__},
              "profile": profile, "shapes": {k: list(v) for k, v in shapes.items()}, "r": args.r,
              "layers": n_layers, "full_layers": full_layers, "n_modules": 7 * n_layers,
              "zero_b": args.zero_b, "device": args.device, "merges": []}
    with contextlib.ExitStack() as stack:
        work = Path(args.workdir or stack.enter_context(tempfile.TemporaryDirectory()))
        t0 = time.time()
        for k in range(3):
            write_adapter(work / f"rl{k}" / "adapter", 100 + k, shapes, n_layers, args.r, 2 * args.r, args.zero_b)
        result["write_adapters_s"] = round(time.time() - t0, 2)
        for name in args.methods:
            for lam in lams:
                out = work / "merge" / (f"{name}_lam{lam:g}" if lam is not None else name)
                cmd = chorus_mini.merge_cmd(c, work, name, lam, out)
                argv = [str(a) for a in cmd.argv[2:]]           # after "python merge.py"
                timer.reset()
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                with contextlib.redirect_stdout(io.StringIO()):
                    merge.main(argv)
                wall = time.perf_counter() - t0
                rep = json.loads((out / merge.REPORT_FILE).read_text())
                phases = {p: round(s, 3) for p, s in timer.seconds.items()}
                per_module = sum(s for p, s in timer.seconds.items() if p != "write")
                fixed = wall - per_module
                scale = full_layers / n_layers
                row = {"merge": name, "lam": lam,           # the work folder shown as $WORK (a temporary folder by default)
                       "argv": ("python merge.py " + " ".join(map(shlex.quote, argv))).replace(str(work), "$WORK"),
                       "wall_s": round(wall, 3), "report_timings_s": rep["timings_s"], "phases_s": phases,
                       "phase_calls": dict(timer.calls), "other_s": round(fixed - timer.seconds.get("write", 0), 3),
                       "svd_rel_error_mean": rep["summary"]["svd_rel_error_mean"],
                       "extrapolated_s": round(per_module * scale + fixed, 1) if scale != 1 else None}
                result["merges"].append(row)
                print(f"{name:15s} lam {lam}: {wall:7.2f} s  " + "  ".join(f"{p} {s:.2f}" for p, s in phases.items())
                      + (f"  -> ~{row['extrapolated_s']:.0f} s at {full_layers} layers (extrapolated)" if scale != 1 else ""),
                      flush=True)
    timer.restore()
    total = sum(r["wall_s"] for r in result["merges"])
    result["total_s"] = round(total, 2)
    if n_layers != full_layers:
        result["extrapolated_total_s"] = round(sum(r["extrapolated_s"] for r in result["merges"]), 1)
        result["note"] = (f"measured on {n_layers} of {full_layers} layers; extrapolated_s scales the per-module phases "
                          f"by {full_layers}/{n_layers} (an estimate, not a measurement)")
    print(f"total {total:.1f} s" + (f"; ~{result['extrapolated_total_s']:.0f} s at {full_layers} layers (extrapolated)"
                                    if n_layers != full_layers else ""))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
