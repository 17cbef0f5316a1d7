"""Every stage of `chorus_mini.py run` under an emulated 24 GiB card: per-stage seconds and peak GiB (issue 19).

GPU (one command; both profiles, see ESTIMATE below):
    CHORUS_GPU_CAP_GIB=24 python bench/bench_pipeline_cap.py --profiles 4b small \\
        --model-small PATH.gguf --eval-tasks runs/dev_tasks.jsonl --out runs/capbench --json results/bench_4b_pipeline.json
    python bench/bench_pipeline_cap.py --render results/bench_4b_pipeline.json      # the section for results/bench.md
The speedrun (`small` at its own budgets on the whole GPU, then under the cap; a call cut by a time limit is
resumed by the same command, and each stage's seconds add up over its calls):
    python bench/bench_pipeline_cap.py --full --profiles small --cap-gib 0 --out runs/speedrun --json results/speedrun.json
    python bench/bench_pipeline_cap.py --full --profiles small --cap-gib 24 --out runs/speedrun24 --json results/speedrun_cap24.json
CPU smoke (tests/test_cap.py runs it; the tiny random model, the first stages only):
    python bench/bench_pipeline_cap.py --cpu-smoke --stages data sft0 --out out/capbench --json out/cap.json

What it does, in order:
 1. Sets $CHORUS_GPU_CAP_GIB (--cap-gib, default: the variable, else 24) for every stage it starts: each
    stage process caps its allocator there and sees mem_get_info report the cap (common.apply_gpu_cap),
    so the fast decoder's batches, sft.py's micro-batches and rl/distill's release of the decoder are
    sized as on a 24 GB card.
 2. `4b`: writes a RANDOM model with Qwen3-4B's configuration (QWEN3_4B below, from Qwen/Qwen3-4B's public
    config.json; nothing is downloaded) and SmolLM2's tokenizer and vocabulary (the kit's embedded GGUF)
    as a bf16 HF folder in OUT/qwen3_4b_random, every weight drawn on CPU from one seed and checked (kept: a
    re-run reuses it); the 4b profile loads it with
    quant=4bit (nf4 base via bitsandbytes, LoRA).
    `small`: the SmolLM2-135M GGUF (--model-small, default the embedded one).
 3. Runs `python chorus_mini.py run --profile P --out OUT/P --set ...` at tiny budgets (BUDGETS below: a few
    tasks, rows, steps; 64 new tokens), offline: no hub, no ../shared (real_corpus ''), the eval tasks
    from --eval-tasks (else the synthetic validation tasks). chorus_mini resumes: a re-run skips the stages
    that have done.json, so a command cut by a time limit continues where it stopped.
 4. Collects per stage: seconds (OUT/P/S/done.json), the torch CUDA peaks of its processes (max over every
    result.json under OUT/P/S: setup.gpu_peak, written by rundir.write_result; null on CPU) and
    nvidia-smi's whole-GPU peak (done.json), into --json; prints the markdown section last.

MEASURED (H200, results/bench.md): the time is mostly process start-up, ~30 GPU processes a profile
(sft x3, data2, rl x3, merge 5 merges + 15 candidate evaluations, val x3, opd x3, eval x14; eval_syn has no tasks
with --skip-eval-syn, the default). small: all stages in ~5-6 min. 4b: data..opd_nogate took ~1150 s
of stages over three calls, the merge stage ~700 s of it with 58 tuning tasks (now 4, BUDGETS), plus building the
4B folder once (~200 s with transformers' initialiser and a masked statistics pass, both since removed; not
re-measured). Over 10 minutes (one device call's limit): run the same command again (finished stages are skipped),
or one profile per command with the same --json (a profile's entry is added to what the file holds).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import common  # noqa: E402

GIB = 2 ** 30

# Qwen/Qwen3-4B config.json (the base model; the Instruct-2507 differs in rope_theta 5e6 and a 262144
# context): 36 layers, hidden 2560, MLP 9728, 32 query / 8 KV heads of 128, rms eps 1e-6, rope theta 1e6,
# tied embeddings, no sliding window. The vocabulary is SmolLM2's here (its tokenizer drives the kit).
QWEN3_4B = dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, rope_theta=1e6, max_position_embeddings=40960,
                rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu", attention_bias=False)

# --set values that make every stage a minute or less. Shared, then per profile.
BUDGETS = {
    "common": {"real_tasks": 0, "real_val_tasks": 0, "real_corpus": "", "val_tasks": 2, "sft_epochs": 1,
               "stage2_n": 1, "max_new_tokens": 64, "rl_steps": 2, "rl_prompts": 2, "rl_max_extra_prompts": 2,
               "opd_steps": 2, "opd_prompts": 2, "eval_limit": 2, "eval_n": 1, "eval_rounds": 1, "val_n": 1,
               "val_rounds": 0, "test_tasks": 2, "test_n": 1, "test_rounds": 0, "save_every": 10,
               # 4 tuning tasks: SFT validation, the 15 merge candidates and val evaluate them (58 tasks
               # made the 4b merge stage ~700 s, mostly evaluation)
               "tune_limit": 4},
    # small: 8 tasks x 2 teacher tries -> ~16 stage-0 rows: one full 16-row SFT micro-batch, the case the cap is about
    "small": {"train_tasks": 8, "sft_limit": 16},
    # 4b: batch 1 x grad-accum 24 in the profile; 4 rows = one optimizer step of 4 micro-batches
    "4b": {"train_tasks": 4, "sft_limit": 4, "sft_tries": 1, "sft_rounds": 1},
    # CPU smoke: the tiny random model, the smoke profile's own budgets
    "smoke": {"model": "tiny", "real_tasks": 0, "real_val_tasks": 0, "real_corpus": "", "train_tasks": 2,
              "sft_limit": 1, "eval_limit": 1, "test_tasks": 0},
}


def budget_sets(profile, args):
    """The --set list of one profile's run."""
    if args.full:         # the speedrun: the profile's own budgets; only what the command line names changes
        sets = {"sim_workers": args.sim_workers} if args.sim_workers else {}
        sets.update({"eval_tasks": str(Path(args.eval_tasks).resolve())} if args.eval_tasks else {})
        return [f"{k}={v}" for k, v in sets.items()] + list(args.set)
    if profile == "smoke":
        sets = dict(BUDGETS["smoke"])
    else:
        sets = {**BUDGETS["common"], **BUDGETS.get(profile, {})}
        sets["max_new_tokens"] = args.max_new_tokens
        if args.skip_eval_syn:
            sets["test_tasks"] = 0
        if args.sim_workers:
            sets["sim_workers"] = args.sim_workers
    sets["eval_tasks"] = str(Path(args.eval_tasks).resolve()) if args.eval_tasks else ""
    for item in args.set:
        k, _, v = item.partition("=")
        sets[k] = v
    return [f"{k}={v}" for k, v in sets.items()]


# -----------------------------------------------------------------------------
# The 4B-shaped random model

BUILD_VERSION = 2     # 1: built on the GPU by transformers' own init; its SFT gradients overflowed


def init_random_weights(model, std=0.02, seed=0):
    """Every weight of `model` drawn here, on CPU, from one seeded generator: linear and embedding matrices
    N(0, std), norm weights 1, biases 0. The 4B folder then does not depend on the transformers version or the
    device that built it (with a folder built on the H200 by transformers 5.17's initialiser, the
    gradient of every 4b SFT step grew ~500x per layer and overflowed, in every attention kernel and precision;
    on CPU, freshly initialised weights of the same width give gradients that shrink with depth. On a
    folder drawn here, the same GPU, kernels and autocast gave finite gradients in every step, so the folder was the
    cause: results/bench.md)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).mul_(std).to(p.dtype))
            elif "norm" in name.rsplit(".", 2)[-2]:
                p.fill_(1.0)
            else:
                p.zero_()


def weight_stats(named_tensors):
    """{kind: {"tensors", "std": mean of the per-tensor std, "std_min" / "std_max": its range, "max_abs": largest
    |w|, "nonfinite": count}} over
    (name, tensor) pairs (a model's named_parameters(), a safetensors file's tensors), grouped by the name's
    last two parts (q_proj.weight, q_norm.weight, ...: one row for all layers)."""
    import torch
    out = {}
    for name, p in named_tensors:
        kind = ".".join(name.split(".")[-2:])
        w = p.detach().float().flatten()
        bad = int(w.numel() - torch.isfinite(w).sum())
        if bad:                          # masking copies the tensor: only where something is non-finite
            w = w[torch.isfinite(w)]
        r = out.setdefault(kind, {"tensors": 0, "std_sum": 0.0, "std_min": float("inf"), "std_max": 0.0,
                                  "max_abs": 0.0, "nonfinite": 0})
        std = float(w.std()) if w.numel() > 1 else 0.0
        r["tensors"] += 1
        r["std_sum"] += std
        r["std_min"], r["std_max"] = min(r["std_min"], std), max(r["std_max"], std)
        r["max_abs"] = max(r["max_abs"], float(w.abs().amax()) if w.numel() else 0.0)
        r["nonfinite"] += bad
    return {k: {"tensors": r["tensors"], "std": round(r["std_sum"] / r["tensors"], 5), "std_min": round(r["std_min"], 5),
                "std_max": round(r["std_max"], 5), "max_abs": round(r["max_abs"], 4), "nonfinite": r["nonfinite"]}
            for k, r in sorted(out.items())}


def check_init(stats, std):
    """Raise unless every matrix's std (each tensor: the smallest and the largest of its kind) is within 10 % of
    `std`, norms are exactly 1, and nothing is non-finite: what a random folder must hold before a stage trains on it."""
    bad = [f"{k}: {r}" for k, r in stats.items() if r["nonfinite"]
           or ("norm" in k and not (r["std_max"] == 0 and r["max_abs"] == 1.0))
           or ("norm" not in k and not (0.9 * std <= r["std_min"] <= r["std_max"] <= 1.1 * std))]
    if bad:
        raise RuntimeError("the random model's weights are not as initialised: " + "; ".join(bad[:4]))


def build_qwen3_4b(folder, tokenizer_source, seed=0, shape=None):
    """A random Qwen3-4B-shaped model (bf16, every weight drawn on CPU by init_random_weights) with the
    tokenizer of `tokenizer_source` (an HF folder), saved as an HF folder with build.json (the weight statistics).
    Reused when folder/build.json has this BUILD_VERSION, else rebuilt. `shape`: QWEN3_4B (default) or a smaller
    one of the same keys (tests)."""
    folder = Path(folder)
    built = common_read(folder / "build.json") or {}
    if built.get("version") == BUILD_VERSION and (folder / "config.json").is_file():
        print(f"[capbench] reusing {folder}")
        return {"built": False, "build_s": 0.0, "first_build_s": built.get("build_s"), "init": built.get("init")}
    import shutil
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(tokenizer_source)
    full = shape or QWEN3_4B
    shape = {k: v for k, v in full.items() if k != "rope_theta"}
    ids = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
               use_sliding_window=False, max_window_layers=full["num_hidden_layers"])
    try:
        cfg = Qwen3Config(rope_parameters={"rope_type": "default", "rope_theta": full["rope_theta"]}, **shape, **ids)
    except TypeError:   # a transformers without rope_parameters
        cfg = Qwen3Config(rope_theta=full["rope_theta"], **shape, **ids)
    print(f"[capbench] building a random Qwen3-4B-shaped model (vocab {len(tok)}) on CPU -> {folder}")
    with torch.device("meta"):       # no initialiser runs: init_random_weights draws every parameter below
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model = model.to_empty(device="cpu")
    model.tie_weights()             # to_empty gives the tied lm_head a tensor of its own; one again
    init_random_weights(model, std=cfg.initializer_range, seed=seed)
    stats = weight_stats(model.named_parameters())
    check_init(stats, cfg.initializer_range)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    info = {"built": True, "build_s": round(time.time() - t0, 1), "params": sum(p.numel() for p in model.parameters()),
            "init": f"init_random_weights(std={cfg.initializer_range}, seed={seed}) on CPU", "version": BUILD_VERSION}
    (tmp / "build.json").write_text(json.dumps({**info, "weights": stats}, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    del model
    return info


def small_model_folder(model_small):
    """The SmolLM2 HF folder (the GGUF converted once by common) whose tokenizer the 4B model uses."""
    path = model_small or common.default_model_path()
    return common.gguf_to_hf_folder(path) if str(path).endswith(".gguf") else str(path)


# -----------------------------------------------------------------------------
# Collecting one run folder

def stage_record(folder):
    """One stage: {status, seconds, peak_reserved_gib, peak_allocated_gib, nvidia_smi_peak_mib, processes}.
    The peaks are the max over the stage's processes (every result.json under the folder); None when no
    process of it used CUDA."""
    folder = Path(folder)
    done = common_read(folder / "done.json")
    peaks = []
    for res in sorted(folder.rglob("result.json")):
        gp = ((common_read(res) or {}).get("setup") or {}).get("gpu_peak")
        if gp:
            peaks.append({"file": str(res.relative_to(folder)), **gp})
    top = lambda k: max((p[k] for p in peaks if p.get(k) is not None), default=None)
    steps = nonfinite = 0             # training steps logged (sft/rl/distill log.jsonl) and those with an inf/NaN gradient
    for lg in sorted(folder.rglob("log.jsonl")):
        for line in lg.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and "skipped_nonfinite" in row:
                steps += 1
                nonfinite += bool(row["skipped_nonfinite"])
    log = folder / "stdout.log"       # a stage that started and did not finish: its last lines, to diagnose
    tail = log.read_text(errors="replace").splitlines()[-LOG_TAIL:] if (not done and log.is_file()) else None
    return {"status": "done" if done else ("partial" if folder.is_dir() else "missing"), "log_tail": tail,
            "seconds": done.get("seconds") if done else None, "calls": done.get("calls") if done else None,
            "peak_reserved_gib": top("max_memory_reserved_gib"), "peak_allocated_gib": top("max_memory_allocated_gib"),
            "nvidia_smi_peak_mib": done.get("gpu_mem_peak_mib") if done else None,
            "peak_rss_mib": done.get("peak_rss_mib") if done else None,
            "train_steps": steps or None, "nonfinite_steps": nonfinite if steps else None, "processes": peaks}


LOG_TAIL = 25     # lines of a stage's stdout.log kept in the JSON when the stage did not finish


def common_read(path):
    path = Path(path)
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except json.JSONDecodeError:
        return None


def collect(run_dir, stages, cap_gib):
    """Every stage of a run folder, in pipeline order, and the profile's summary."""
    recs = {s: stage_record(Path(run_dir) / s) for s in stages}
    reserved = [r["peak_reserved_gib"] for r in recs.values() if r["peak_reserved_gib"] is not None]
    return {"stages": recs, "all_done": all(r["status"] == "done" for r in recs.values()),
            "nonfinite_steps": sum(r.get("nonfinite_steps") or 0 for r in recs.values()),
            "seconds_total": round(sum(r["seconds"] or 0 for r in recs.values()), 1),
            "max_peak_reserved_gib": max(reserved, default=None),
            "fits_cap": None if not reserved or not cap_gib else max(reserved) <= cap_gib}


# -----------------------------------------------------------------------------
# Markdown

def render_markdown(result):
    hw = result["hardware"]
    cap = hw.get("cap_gib")
    title = (f"## `run` at the profiles' own budgets: every stage's time, {result.get('total_s')} s in all"
             + (f", under a {cap:g} GiB cap" if cap and hw.get("gpu") else "") if result.get("full") else
             f"## Every stage under a {cap:g} GiB cap (bench/bench_pipeline_cap.py)" if cap and hw.get("gpu") else
             "## Every stage, CPU smoke run (no CUDA: no memory peaks)")
    L = [title, "",
         f"- command: `{result['command']}`", f"- commit {result['git'].get('commit')}"
         + (" (dirty)" if result["git"].get("dirty") else "") + f", {result['started_at']}, wall {result['wall_s']} s",
         f"- hardware: {hw.get('gpu') or 'CPU'}" + (f" ({hw.get('total_gib')} GiB) capped at {cap} GiB by "
                                                    "$CHORUS_GPU_CAP_GIB in every stage" if hw.get("gpu") else ""),
         "- peak = torch's max_memory_reserved / max_memory_allocated over the stage's processes (GiB); "
         "nvidia-smi = the whole GPU above the level at the stage's start (MiB, CUDA context included)", ""]
    for name, p in result["profiles"].items():
        L += [f"### profile `{name}`: {p['model_note']}", "",
              f"`--set {' '.join(p['sets'])}`", "",
              *([f"measured by an earlier command: `{run['command']}`, commit {(run.get('git') or {}).get('commit')}, "
                 f"{run.get('started_at')}", ""] if (run := p.get("run")) and run.get("command") != result["command"]
                else []),
              f"{'all stages done' if p['all_done'] else 'NOT all stages done'}; {p['seconds_total']} s in stages, "
              f"max peak reserved {p['max_peak_reserved_gib']} GiB"
              + ("" if p.get("fits_cap") is None else f" ({'fits' if p['fits_cap'] else 'over'} the cap)")
              + (f"; exit code {p['exit_code']}" if p.get("exit_code") else "")
              + (f"; **{p['nonfinite_steps']} training steps had a non-finite gradient (no update)**"
                 if p.get("nonfinite_steps") else ""), "",
              "| stage | status | s | peak reserved GiB | peak allocated GiB | nvidia-smi MiB | steps with a non-finite gradient |",
              "|---|---|---|---|---|---|---|"]
        f = lambda v: "-" if v is None else str(v)
        for s, r in p["stages"].items():
            L.append(f"| {s} | {r['status']} | {f(r['seconds'])} | {f(r['peak_reserved_gib'])} | "
                     f"{f(r['peak_allocated_gib'])} | {f(r['nvidia_smi_peak_mib'])} | "
                     + (f"{r['nonfinite_steps']} of {r['train_steps']}" if r.get("train_steps") else "-") + " |")
        L.append("")
        for s, r in p["stages"].items():
            if r.get("log_tail"):
                L += [f"`{s}` did not finish; the end of its log:", "", "```", *r["log_tail"][-8:], "```", ""]
    L += [f"- {n}" for n in result.get("notes", [])] + [""]
    return "\n".join(L)


# -----------------------------------------------------------------------------
# Main

def versions():
    out = {"python": platform.python_version()}
    for mod in ("torch", "transformers", "peft", "bitsandbytes"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as e:  # shown, not fatal
            out[mod] = f"unavailable ({type(e).__name__})"
    return out


def hardware(cap_gib):
    import torch
    if not torch.cuda.is_available():
        return {"gpu": None, "cap_gib": None, "cpu_count": os.cpu_count()}
    props = torch.cuda.get_device_properties(0)
    return {"gpu": props.name, "total_gib": round(props.total_memory / GIB, 2), "cap_gib": cap_gib,
            "cpu_count": os.cpu_count()}


def profile_argv(profile, out, sets, model, stages, lanes=False):
    """chorus_mini.py run for one profile; with lanes, bench/gpu/run_small.sh (the same stages, five lanes side by
    side, each lane's simulator workers its share of the CPUs: --sim-workers is left to it)."""
    sets = ([f"model={model}"] if model else []) + sets
    if lanes:
        sets = [s for s in sets if not s.startswith("sim_workers=")]
        return ["env", f"PROFILE={profile}", "bash", "bench/gpu/run_small.sh", str(out),
                *[x for s in sets for x in ("--set", s)]]
    argv = [sys.executable, "chorus_mini.py", "run", "--profile", profile, "--out", str(out)]
    argv += [x for s in sets for x in ("--set", s)]
    return argv + (["--only", *stages] if stages else [])


def run_profile(argv, log, console=True):
    """Start chorus_mini.py run for one profile, its output appended to `log` (and the console). Returns a
    function that waits for it and returns its exit code."""
    print("[capbench] $ " + " ".join(argv[1:]) + ("" if console else f"   (output: {log})"), flush=True)
    f = open(log, "ab")
    f.write(("$ " + " ".join(argv[1:]) + "\n").encode())
    f.flush()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if not console:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)
        return lambda: (proc.wait(), f.close())[0]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    while chunk := os.read(proc.stdout.fileno(), 65536):
        sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
        f.write(chunk)
    f.close()
    rc = proc.wait()
    return lambda: rc


def finish_profile(result, args, out, stages, hw, t_start, profile, t0, model, note, info, sets, wait):
    """Wait for one profile's run, collect its stages into result and write the JSON (after every profile:
    a run cut short keeps what finished). Returns 1 when the run failed, else 0."""
    rc = wait()
    rec = collect(out / profile, stages, hw.get("cap_gib"))
    result["profiles"][profile] = {"model": model, "model_note": note, "sets": sets, "exit_code": rc,
                                   "wall_s": round(time.time() - t0, 1), **info, **rec}
    result["wall_s"] = round(time.time() - t_start, 1)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))
    return 1 if rc else 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--render", default=None, metavar="JSON", help="print the markdown of a result and exit")
    p.add_argument("--profiles", nargs="+", default=["4b", "small"], help="chorus_mini profiles to run, in order")
    p.add_argument("--model-small", default=None, help="SmolLM2 GGUF or HF folder (default: the embedded GGUF)")
    p.add_argument("--model-4b", default=None,
                   help="HF folder for the 4b profile (default: a random Qwen3-4B-shaped model built in OUT/qwen3_4b_random)")
    p.add_argument("--eval-tasks", default=None, help="eval task file (e.g. the dev set); default: the val tasks")
    p.add_argument("--out", default="runs/capbench", help="run folders: OUT/<profile>/")
    p.add_argument("--json", default="results/bench_4b_pipeline.json", help="where the result goes")
    p.add_argument("--cap-gib", type=float, default=None,
                   help=f"emulated card size (default: ${common.GPU_CAP_ENV}, else 24; 0 = the real card)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="response cap of every generation stage")
    p.add_argument("--sim-workers", type=int, default=None, help="simulator processes (default: the profile's)")
    p.add_argument("--skip-eval-syn", action=argparse.BooleanOptionalAction, default=True,
                   help="test_tasks=0: the eval_syn stage (the eval stage's code on other tasks) gets no tasks")
    p.add_argument("--stages", nargs="+", default=None, help="run only these stages (chorus_mini --only)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="one more chorus_mini --set")
    p.add_argument("--parallel", action="store_true",
                   help="run the profiles side by side (one GPU holds both capped processes; outputs go to OUT/P.log)")
    p.add_argument("--lanes", action="store_true",
                   help="run each profile's stages in bench/gpu/run_small.sh's parallel lanes (less wall time; the "
                        "seconds include the contention, the per-process peaks do not)")
    p.add_argument("--full", action="store_true",
                   help="the profiles' own budgets, not the tiny ones (the speedrun: --cap-gib 0 --json results/speedrun.json; "
                        "total_s sums the stages' seconds, each over every call that ran it)")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="the smoke profile with the tiny random model on CPU (tests; no 4B model, no cap)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.render:
        print(render_markdown(json.loads(Path(args.render).read_text())), end="")
        return 0
    import chorus_mini
    from profiles import PROFILES
    t_start = time.time()
    env_cap = os.environ.get(common.GPU_CAP_ENV)
    cap = args.cap_gib if args.cap_gib is not None else float(env_cap) if env_cap else 24.0
    if cap > 0:
        os.environ[common.GPU_CAP_ENV] = f"{cap:g}"      # inherited by every stage process
    else:
        os.environ.pop(common.GPU_CAP_ENV, None)
    profiles = ["smoke"] if args.cpu_smoke else args.profiles
    for p in profiles:
        if p not in PROFILES:
            raise SystemExit(f"bench_pipeline_cap: unknown profile {p!r} (known: {', '.join(PROFILES)})")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python", "bench/bench_pipeline_cap.py", *(sys.argv[1:] if argv is None else argv)])
    hw = hardware(cap if cap > 0 else None)
    print(f"[capbench] {command}\n[capbench] hardware {hw}")
    stages = chorus_mini.STAGES            # all of them in the JSON; --stages only limits what runs
    result = {"bench": "bench_pipeline_cap", "command": command, "env": {common.GPU_CAP_ENV: os.environ.get(common.GPU_CAP_ENV)},
              "started_at": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t_start)), "git": common.git_info(),
              "hardware": hw, "versions": versions(), "profiles": {}, "full": args.full, "notes": [
                  "the profiles' own budgets: each stage as `chorus_mini.py run --profile P` runs it; a stage's seconds "
                  "sum every call that worked on it (a stage cut at a call's time limit resumes in the next)" if args.full else
                  "tiny budgets (a few tasks, rows, steps; short responses): the stages' code paths and their peaks "
                  "at these sizes, not a long run's worst case (bench/bench_4b.py measures the 4B steps at 4096 tokens)",
                  "4b: random weights with Qwen3-4B's configuration and SmolLM2's tokenizer (vocabulary "
                  "49152, not Qwen's 151936), nf4 base (bitsandbytes) + LoRA, as the 4b profile loads it",
                  "every stage is a process of its own (model load included in its seconds); a stage with several "
                  "processes (merge, val, eval) reports the largest peak among them"]}
    previous = common_read(args.json) or {}
    if previous.get("bench") == "bench_pipeline_cap":     # another command's profiles stay (one JSON for all)
        kept = {k: v for k, v in previous.get("profiles", {}).items() if k not in profiles}
        for v in kept.values():    # the command, commit and time that measured a kept profile stay with it
            v.setdefault("run", {k: previous.get(k) for k in ("command", "started_at", "git", "env")})
        result["profiles"].update(kept)
    code = 0
    if args.lanes:    # the collecting pass (--stages data) writes the JSON of stages the lanes ran
        result["notes"].append("--lanes: each profile's stages ran in bench/gpu/run_small.sh's five lanes, several "
                               "processes on one GPU at a time (each capped), so a stage's seconds include the other "
                               "lanes' load and nvidia-smi's whole-GPU column counts them too; torch's peaks are per process")
    if args.parallel and len(profiles) > 1:
        result["notes"].append("--parallel: the profiles ran side by side on one GPU and its CPUs, so each "
                               "stage's seconds include the other profile's load (the peaks are per process)")
    pending = []              # (profile, started, model, note, info, sets, wait) of the profiles started
    for profile in profiles:
        run_dir = out / profile
        run_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        info, model = {}, None
        if profile == "4b":
            model = args.model_4b
            if model is None:
                model = str(out / "qwen3_4b_random")
                info = build_qwen3_4b(model, small_model_folder(args.model_small))
            note = f"{model} (random Qwen3-4B shape, SmolLM2 tokenizer), quant 4bit"
        elif profile == "smoke":
            note = "tiny random model (CPU smoke)"
        else:
            model = args.model_small
            note = f"{model or 'SmolLM2-135M-Instruct (embedded GGUF)'}"
        sets = budget_sets(profile, args)
        lanes = args.lanes and not args.stages         # the collecting pass (--stages data) runs plainly
        wait = run_profile(profile_argv(profile, run_dir, sets, model, args.stages, lanes), out / f"{profile}.log",
                           console=not (args.parallel and len(profiles) > 1))
        pending.append((profile, t0, model, note, info, sets, wait))
        if args.parallel and len(profiles) > 1:
            continue
        code = max(code, finish_profile(result, args, out, stages, hw, t_start, *pending.pop()))
    for item in pending:       # --parallel: wait for each
        code = max(code, finish_profile(result, args, out, stages, hw, t_start, *item))
    for profile in profiles:
        if profile in result["profiles"]:
            result["profiles"][profile]["run"] = {k: result[k] for k in ("command", "started_at", "git", "env")}
    result["wall_s"] = round(time.time() - t_start, 1)
    result["total_s"] = round(sum(p.get("seconds_total") or 0 for p in result["profiles"].values()), 1)
    Path(args.json).write_text(json.dumps(result, indent=1))
    print(f"[capbench] wrote {args.json}\n")
    print(render_markdown(result), end="")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
