"""Answers that do not depend on the GPU memory budget, and processes that share one GPU (results/gpu_memory.md).

    # one adapter's greedy first-round answers under one budget (0 = the whole card), one process per budget:
    python bench/gpu_memory.py answers --adapter A --tasks T.jsonl --cap-gib 10 --out OUT/cap10.json
    # LANES processes side by side on one GPU, each with 1/LANES of it, each sampling eval's first round:
    python bench/gpu_memory.py side --adapters A1 A2 ... --tasks T.jsonl --out OUT/side
    # on a machine with the simulator: compare the answers, score them (direct Pass@1) and write the record
    python bench/gpu_memory.py report --answers OUT/cap*.json --side OUT/side --tasks T.jsonl --out results/gpu_memory.json

An `answers` run renders each task's first prompt in stimulus mode (harness.first_messages), skips prompts past the
model's context (counted as prompt_too_long, as eval does), and decodes the rest greedily in one generate call of
--batch-size rows: the budget decides how the fast decoder cuts that call. Answers are identical across budgets
when the decoder's output does not depend on the budget. The report scores every answer with the kit's scorer.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def digest(texts):
    return hashlib.sha256(json.dumps(texts).encode()).hexdigest()[:16]


def load_tasks(path, limit=None):
    import sim
    tasks = sim.load_tasks(path)
    return tasks[:limit] if limit else tasks


def cmd_answers(a):
    if a.cap_gib:
        os.environ["CHORUS_GPU_CAP_GIB"] = f"{a.cap_gib:g}"
    else:
        os.environ["CHORUS_GPU_CAP_GIB"] = "0"         # the whole card: no budget, the half-of-free rule alone
    if a.share:
        os.environ.pop("CHORUS_GPU_CAP_GIB")
        os.environ["CHORUS_GPU_SHARE"] = a.share
    import common
    import fastgen
    import harness
    import torch
    tasks = load_tasks(a.tasks, a.limit)
    model, tok = common.load_model(a.model, quant=a.quant)
    if a.adapter:
        model = common.load_adapter(model, a.adapter)
    context = common.context_length(model, tok)
    msgs, ids, too_long = [], [], []
    for t in tasks:
        m = harness.first_messages(t, "stimulus")
        if len(common.chat_ids(tok, m)) >= context:
            too_long.append(t["id"])
            continue
        for _ in range(a.n):
            msgs.append(m)
            ids.append(t["id"])
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    t0 = time.time()
    outs = common.generate(model, tok, msgs, max_new_tokens=a.max_new_tokens, temperature=a.temperature,
                           top_p=a.top_p, seed=a.seed, batch_size=a.batch_size)
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    wall = time.time() - t0
    texts = [c.text for c in outs]
    tokens = sum(len(c.completion_ids) for c in outs)
    rec = {"adapter": a.adapter, "cap_gib": a.cap_gib, "share": a.share, "temperature": a.temperature, "quant": a.quant,
           "n": a.n, "batch_size": a.batch_size, "max_new_tokens": a.max_new_tokens, "tasks": len(tasks),
           "prompt_too_long": too_long, "answers": len(texts), "digest": digest(texts),
           "tokens": tokens, "gen_s": round(wall, 1), "tok_s": round(tokens / wall),
           "gpu_peak": common.gpu_peak(), "kv_peak_gib": round(fastgen.MEMORY["kv_peak_bytes"] / 2**30, 3),
           "oom_retries": fastgen.MEMORY["oom_retries"], "task_ids": ids, "texts": texts}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(rec))
    print(f"answers: cap {a.cap_gib or 'none'} share {a.share}: {len(texts)} answers, digest {rec['digest']}, "
          f"{tokens} tokens in {wall:.1f} s, peak {rec['gpu_peak']}")


def cmd_side(a):
    """LANES processes at once, one per adapter, each with CHORUS_GPU_SHARE=1/LANES."""
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    for k, ad in enumerate(a.adapters):
        cmd = [sys.executable, __file__, "answers", "--adapter", ad, "--tasks", a.tasks, "--share", f"1/{len(a.adapters)}",
               "--n", str(a.n), "--temperature", "0.7", "--top-p", "0.8", "--seed", str(k),
               "--max-new-tokens", str(a.max_new_tokens), "--batch-size", str(a.batch_size),
               "--out", str(out / f"lane{k}.json")] + (["--model", a.model] if a.model else []) \
            + (["--limit", str(a.limit)] if a.limit else [])
        log = open(out / f"lane{k}.log", "w")
        procs.append((ad, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), time.time()))
    codes = []
    for ad, p, t0 in procs:
        codes.append({"adapter": ad, "exit": p.wait(), "wall_s": round(time.time() - t0, 1)})
    (out / "side.json").write_text(json.dumps({"lanes": len(procs), "processes": codes}, indent=1))
    print(json.dumps(codes))
    return 0 if all(c["exit"] == 0 for c in codes) else 1


def cmd_report(a):
    import evaluate
    import onpolicy
    tasks = {t["id"]: t for t in load_tasks(a.tasks)}
    runs = [json.loads(Path(p).read_text()) for p in a.answers]
    caps = {}
    for r in runs:
        pairs = [(tasks[i], text) for i, text in zip(r["task_ids"], r["texts"])]
        results = onpolicy.score_answers(pairs, workers=a.workers, target_mode="cvdp", answer_mode="stimulus",
                                         desc=f"cap {r['cap_gib'] or 'none'}")
        passed = sum(bool(x.get("passed")) for x in results)
        soup = sum(1 for x in results if x.get("status") == "no_code")
        caps[str(r["cap_gib"] or "none")] = {
            "digest": r["digest"], "answers": r["answers"], "direct_pass@1": round(100 * passed / len(results), 1),
            "syn_pass": round(100 * sum(evaluate.syn_ok(x) for x in results) / len(results), 1),
            "no_code": soup, "prompt_too_long": len(r["prompt_too_long"]), "mean_chars": round(
                sum(map(len, r["texts"])) / len(r["texts"])), "gen_s": r["gen_s"], "tok_s": r["tok_s"],
            "kv_peak_gib": r["kv_peak_gib"], "gpu_peak": r["gpu_peak"], "oom_retries": r["oom_retries"]}
    base = runs[0]["texts"]
    differ = {str(r["cap_gib"] or "none"): sum(x != y for x, y in zip(base, r["texts"])) for r in runs}
    side = None
    if a.side:
        s = json.loads((Path(a.side) / "side.json").read_text())
        lanes = []
        for k, p in enumerate(s["processes"]):
            f = Path(a.side) / f"lane{k}.json"
            r = json.loads(f.read_text()) if f.is_file() else {}
            lanes.append({**p, "answers": r.get("answers"), "gpu_peak": r.get("gpu_peak"),
                          "kv_peak_gib": r.get("kv_peak_gib"), "oom_retries": r.get("oom_retries"),
                          "gen_s": r.get("gen_s")})
        side = {"lanes": s["lanes"], "all_finished": all(p["exit"] == 0 for p in s["processes"]), "processes": lanes}
    rec = {"adapter": runs[0]["adapter"], "tasks": a.tasks, "answers_identical": len(set(r["digest"] for r in runs)) == 1,
           "answers_differing_from_first": differ, "caps": caps, "side_by_side": side}
    Path(a.out).write_text(json.dumps(rec, indent=1))
    print(json.dumps({k: v for k, v in rec.items() if k != "caps"}, indent=1))
    for c, v in caps.items():
        print(f"cap {c}: digest {v['digest']} direct Pass@1 {v['direct_pass@1']} SynPass {v['syn_pass']} "
              f"no_code {v['no_code']} peak {v['gpu_peak']}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("answers", "side"):
        q = sub.add_parser(name)
        q.add_argument("--model", default=None, help="HF id, folder or GGUF (default: the bundled SmolLM2)")
        q.add_argument("--tasks", required=True)
        q.add_argument("--limit", type=int, default=None)
        q.add_argument("--out", required=True)
        q.add_argument("--n", type=int, default=1, help="answers per task")
        q.add_argument("--max-new-tokens", type=int, default=1280)
        q.add_argument("--batch-size", type=int, default=256)
        if name == "answers":
            q.add_argument("--adapter", default=None)
            q.add_argument("--cap-gib", type=float, default=0, help="0 = the whole card")
            q.add_argument("--share", default=None, help="a share of the free memory instead of a cap (1/8)")
            q.add_argument("--temperature", type=float, default=0.0)
            q.add_argument("--top-p", type=float, default=1.0)
            q.add_argument("--seed", type=int, default=0)
            q.add_argument("--quant", default="auto", help="common.load_model's: auto (bf16 on CUDA), fp32, ...")
        else:
            q.add_argument("--adapters", nargs="+", required=True)
    q = sub.add_parser("report")
    q.add_argument("--answers", nargs="+", required=True)
    q.add_argument("--side", default=None)
    q.add_argument("--tasks", required=True)
    q.add_argument("--workers", type=int, default=2)
    q.add_argument("--out", required=True)
    a = p.parse_args(argv)
    return {"answers": cmd_answers, "side": cmd_side, "report": cmd_report}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
