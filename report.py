"""A run's report: OUT/report/report.md + report.json (+ the stages' plots) from the stage folders' JSON files.

    python report.py --out runs/small          # the same as `python chorus_mini.py report --out runs/small`

The `report` stage of chorus_mini.py calls it last; run it alone to rebuild a report after editing results. It reads
only what the stages wrote (result.json, metrics.json, compare and claims files) and the run's run_config.json.
"""
import argparse
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import evaluate
from chorus_mini import MERGES, OPD_VARIANTS, ROOT, STAGES, outcome_of, read_json


PAPER = {   # CVDP-ECov agentic Pass@1, Qwen3-4B (docs/method.md §2.4); (u) = unverified (secondary summary)
    "sft2": "69.2 (LLM4Cov-4B, abstract)", "rl0": "85.8 best expert (u)", "rl1": "85.8 best expert (u)",
    "rl2": "85.8 best expert (u)", "oracle": "90.8 (u)", "soup": "86.7 (u)", "dare_ties": "<= 86.0 (u)",
    "della": "<= 86.0 (u)", "opd": "88.0 (abstract)", "opd_nogate": "86.3 (u)", "opd_rlfb": "87.5 (u)"}
LABELS = {"base": "base model", "sft0": "SFT stage 0", "sft1": "SFT stage 1", "sft2": "SFT stage 2",
          "rl0": "RL expert 0 (from SFT 0)", "rl1": "RL expert 1 (from SFT 1)", "rl2": "RL expert 2 (from SFT 2)",
          "oracle": "oracle union of the 3 experts", "soup": "merge: Model Soup", "ties": "merge: TIES",
          "dare_ties": "merge: DARE-TIES (sum)", "dare_ties_mean": "merge: DARE-TIES (mean)", "della": "merge: DELLA",
          "opd": "OPD, reward-gated (CHORUS)",
          "opd_nogate": "OPD, always distill (no gate)", "opd_rlfb": "OPD, gate + RL fallback"}


def results_table(folder, experts, n, paper=False):
    """({model: {direct, agentic}}, markdown rows) from the eval folders under `folder`; the oracle row
    from the experts' compare result. Pass@1 carries its 95% bootstrap interval over tasks."""
    table, rows = {}, []
    for name in LABELS:
        if name == "oracle":
            if experts:
                table[name] = {experts.get("mode", "agentic"): {"pass@1": experts["oracle"]["pass@1"],
                                                                 "cov@1": experts["oracle"]["cov@1"]}}
        elif (m := read_json(folder / name / "metrics.json")):
            table[name] = {mode: {k: v for k, v in m[mode].items() if k != "per_task"} for mode in ("direct", "agentic")
                           if mode in m}
    cell = lambda m, k: "-" if m is None or m.get(k) is None else f"{m[k]:.1f}"
    ci = lambda m: "" if not m or not m.get("pass@1_ci95") else " [{:.0f}, {:.0f}]".format(*m["pass@1_ci95"])
    for name, t in table.items():
        cols = []
        for mode in ("direct", "agentic"):
            m = t.get(mode)
            cols += [cell(m, "pass@1") + ci(m), cell(m, f"pass@{n}"), cell(m, "cov@1"), cell(m, "syn_pass")]
        rows.append(f"| {LABELS[name]} | " + " | ".join(cols) + (f" | {PAPER.get(name, '-')} |" if paper else " |"))
    return table, rows


def report(out):
    """OUT/report/report.md + report.json + the plots, from the stage folders' JSON files."""
    o, r = Path(out), Path(out) / "report"
    r.mkdir(parents=True, exist_ok=True)
    run = read_json(o / "run_config.json") or {"profile": "?", "config": {}}
    c = run["config"]
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip() if shutil.which("nvidia-smi") else "none"
    versions = {}
    for pkg in ("torch", "transformers", "peft", "numpy"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[pkg] = importlib.metadata.version(pkg)
    ivl = shutil.which("iverilog") and subprocess.run(["iverilog", "-V"], capture_output=True, text=True).stdout
    header = {"commit": git("rev-parse", "--short", "HEAD"), "dirty": bool(git("status", "--porcelain")),
              "date": datetime.datetime.now().isoformat(timespec="seconds"), "cpu": f"{platform.machine()}, "
              f"{os.cpu_count()} cores", "gpu": gpu, "python": platform.python_version(), "versions": versions,
              "iverilog": (ivl or "absent").splitlines()[0], "profile": run["profile"], "seed": c.get("seed")}
    # the tables: one agentic eval run per model gives direct (round 0) and agentic numbers
    experts = outcome_of(o / "compare/experts")
    table, rows = results_table(o / "eval", experts, c.get("eval_n", 1), paper=True)
    experts_syn = outcome_of(o / "compare/experts_syn")
    table_syn, rows_syn = results_table(o / "eval_syn", experts_syn, c.get("test_n", 1))
    experts_skill = outcome_of(o / "compare/experts_skill")
    table_skill, rows_skill = results_table(o / "eval_skill", experts_skill, c.get("eval_n", 1))
    n = c.get("eval_n", 1)
    pass_n = f"Pass@{n}" if n > 1 else "Pass@n (n=1)"
    # plots: copy the curves the stages drew, so report/ stands alone
    plots = []
    for src, dst in [*[(o / f"sft{k}/curves.png", f"sft{k}_curves.png") for k in range(3)],
                     *[(o / f"rl{k}/curves.png", f"rl{k}_curves.png") for k in range(3)],
                     *[(o / v / "curves.png", f"{v}_curves.png") for v in OPD_VARIANTS],
                     (o / "compare/experts/compare.png", "experts_heatmap.png"), (o / "compare/all/compare.png", "all_heatmap.png"),
                     (o / "compare/experts_syn/compare.png", "experts_syn_heatmap.png"),
                     (o / "compare/all_syn/compare.png", "all_syn_heatmap.png"),
                     (o / "compare/experts_skill/compare.png", "experts_skill_heatmap.png"),
                     (o / "compare/all_skill/compare.png", "all_skill_heatmap.png")]:
        if src.is_file():
            shutil.copy2(src, r / dst)
            plots.append(dst)
    stages = {s: read_json(o / s / "done.json") for s in STAGES}
    results = {s: read_json(o / s / "result.json") for s in STAGES}
    smoke = run["profile"] == "smoke" or c.get("model") == "tiny"
    L = [f"# chorus-mini report: profile `{run['profile']}`", ""]
    if smoke:
        L += ["**This is a smoke run: every stage ran at a tiny budget to check the pipeline. The numbers mean nothing.**", ""]
    L += [f"- commit `{header['commit']}`{' (dirty: uncommitted changes)' if header['dirty'] else ''}, {header['date']}",
          f"- hardware: {header['cpu']}; GPU: {header['gpu']}", f"- software: Python {header['python']}, "
          + ", ".join(f"{k} {v}" for k, v in versions.items()) + f", {header['iverilog']}",
          f"- model `{c.get('model') or 'SmolLM2-135M-Instruct (embedded GGUF)'}`, quant {c.get('quant')}, LoRA r "
          f"{c.get('lora_r')}, seed {c.get('seed')}; the full config is in report.json", "",
          f"## Results ({(table.get('base', {}).get('agentic') or {}).get('tasks', '?')} eval tasks, n={n}, "
          f"{c.get('eval_rounds')} refinement rounds; percent)", "",
          f"Direct = the first answer (round 0); agentic = best over {1 + (c.get('eval_rounds') or 0)} rounds of the "
          "memoryless loop. Pass@1 with its 95% bootstrap interval over tasks. The paper column is CVDP-ECov agentic "
          "Pass@1 of Qwen3-4B scored by Xcelium/IMC, not comparable in level; (u) = unverified (secondary summary, docs/method.md §2.4).", "",
          f"| model | direct Pass@1 | {pass_n} | Cov@1 | SynPass | agentic Pass@1 | {pass_n} | Cov@1 | SynPass | paper |",
          "|---" * 10 + "|", *rows, ""]
    oracle_line = lambda e: [f"Oracle union of the experts ({e['mode']}): solves {e['oracle']['solved']} of "
                             f"{e['tasks']} tasks vs {e['per_model'][e['best_single']]['solved']} for the best "
                             f"single expert ({e['best_single']}); solved by A not B: {json.dumps(e['solved_by_a_not_b'])}.", ""]
    if experts:
        L += oracle_line(experts)
    tasks_in = lambda t: (t.get("base", {}).get("agentic") or t.get("base", {}).get("direct") or {}).get("tasks", "?")

    def section(title, intro, pass_col, rows, experts_of_split):
        """A table section of a split: heading, what it holds, the two-mode table, the experts' oracle union."""
        head = f"| model | direct Pass@1 | {pass_col} | Cov@1 | SynPass | agentic Pass@1 | {pass_col} | Cov@1 | SynPass |"
        return [title, "", intro, "", head, "|---" * 9 + "|", *rows, ""] + (
            oracle_line(experts_of_split) if experts_of_split else [])
    if rows_syn:
        tn = c.get("test_n", 1)
        L += section(f"### Held-out synthetic families ({tasks_in(table_syn)} tasks, n={tn}, {c.get('test_rounds')} "
                     "refinement round(s); percent)",
                     "Designs of the five families no training task comes from (data/designs.py --split val, a seed "
                     "of their own), scored with the kit's Icarus targets: the distribution the stages were trained "
                     "for, without the training designs themselves.", f"Pass@{tn}", rows_syn, experts_syn)
    if rows_skill:
        skill_rep = read_json(o / "data" / "skill" / "skill_split.json") or {}
        L += section(f"### The skill split ({tasks_in(table_skill)} tasks, n={n}, {c.get('eval_rounds')} refinement "
                     "rounds; percent)",
                     "Tasks random stimulus fails and a known stimulus passes (data/skill.py: "
                     f"{skill_rep.get('real', '?')} real, {skill_rep.get('synthetic', '?')} synthetic; "
                     f"{(skill_rep.get('excluded') or {}).get('items', '?')} unreachable items excluded), each target "
                     "halfway between random's best run and the known stimulus's coverage: Pass@1 here is what a "
                     "model adds over random stimulus (docs/method.md 2.5).", pass_n, rows_skill, experts_skill)
    opd = results.get("opd")
    if opd:
        name = lambda adapter: Path(adapter).parent.name        # OUT/rl1/adapter -> rl1
        L += [f"OPD student (best expert on the validation tasks): {name(opd['setup']['student'])}; teachers "
              f"{', '.join(map(name, opd['setup']['teachers']))}. Mean gate pass rate of the gated run: "
              f"{opd['outcome'].get('gate_pass_rate')}.", ""]
    merges = {m: e for m in MERGES if (e := outcome_of(o / "merge" / m))}
    L += ["Merges (" + (c.get("merge_space") or "?") + " space): " + ", ".join(
        f"{m} (rank {e.get('r', '?')}) SVD rel. error {e.get('svd_rel_error_mean', '?')}" for m, e in merges.items()) + ".", ""]
    claims = {}      # the paper's four claims with paired bootstrap verdicts (evaluate.claims), where the models exist
    for sub, title in (("eval", "eval tasks"), ("eval_syn", "held-out synthetic families"), ("eval_skill", "skill split")):
        if (o / sub).is_dir():
            with contextlib.suppress(SystemExit):
                cl = evaluate.claims(o / sub, seed=c.get("seed") or 0)
                if cl["claims"]:
                    claims[sub] = cl
                    L += [f"## The paper's four claims ({title})", "", *evaluate.claims_markdown(cl), ""]
    if claims:
        (r / "claims.json").write_text(json.dumps(claims, indent=1))
    L += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    L += ["## Stages", "", "| stage | time (s) | peak RSS (MiB) | GPU peak (MiB)¹ | outcome |", "|---|---|---|---|---|"]
    for s, d in stages.items():
        if d:
            scalars = [(k, v) for k, v in ((results.get(s) or {}).get("outcome") or {}).items()
                       if isinstance(v, (int, float, str)) and not isinstance(v, bool)][:5]
            outcome = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in scalars)
            gpu = ((results.get(s) or {}).get("setup") or {}).get("gpu_peak_mib") or d.get("gpu_mem_peak_mib")
            L.append(f"| {s} | {d.get('seconds', '-')} | {d.get('peak_rss_mib') or '-'} | {gpu or '-'} | {outcome} |")
    L += [f"| total | {sum(d.get('seconds', 0) for d in stages.values() if d):.0f} | | | |", "",
          "¹ the stage's own torch peak (result.json setup.gpu_peak_mib) when it records one, else nvidia-smi's "
          "whole-GPU peak above the level at the start, polled every 2 s (includes the CUDA context)."]
    info, data = outcome_of(o / "data2") or outcome_of(o / "data"), outcome_of(o / "data")
    L += ["", f"Data: {data.get('train_tasks')} train tasks kept of {c.get('train_tasks')} generated (the rest were too "
          f"close to an eval task), {data.get('val_tasks')} validation tasks, {data.get('eval_tasks') or 'the validation'} "
          f"eval tasks; SFT rows per stage: {info.get('sizes')}.", "",
          "## How this run differs from the paper", "",
          f"- Model: {c.get('model') or 'SmolLM2-135M-Instruct'} with LoRA adapters (rank {c.get('lora_r')}), not full "
          "fine-tuning of Qwen3-4B-Instruct-2507.",
          "- Scorer: the kit's Icarus Verilog coverage proxy (sim.py), not Cadence Xcelium + IMC; targets and "
          "coverage levels are not comparable with CVDP-ECov's.",
          "- Data: synthetic designs (data/designs.py) with a template teacher, not CodeV-R1 RTL with Qwen3-Coder-30B "
          "as the teacher; eval on a subset of the kit's dev set, not CVDP-ECov.",
          f"- Budgets: SFT {c.get('sft_epochs')} epoch(s); RL {c.get('rl_steps')} steps x {c.get('rl_prompts')} prompts "
          f"x G={c.get('rl_group')} (paper 1000 x 2 x 4); OPD {c.get('opd_steps')} steps (paper 100); responses "
          f"<= {c.get('max_new_tokens')} tokens (paper 16384); eval n={n}, {c.get('eval_rounds')} rounds (paper 5, 3).",
          "- OPD continues in the RL task order after the prompts RL used (like the authors' dataset offset), on the "
          "same small task pool, so with few tasks it wraps around to prompts RL has seen; teachers are adapters on "
          "one base, not SGLang servers.", ""]
    (r / "report.md").write_text("\n".join(L))
    (r / "report.json").write_text(json.dumps({"header": header, "config": c, "table": table, "table_syn": table_syn,
                                               "oracle_syn": experts_syn and experts_syn["oracle"], "paper": PAPER,
                                               "table_skill": table_skill,
                                               "oracle_skill": experts_skill and experts_skill["oracle"],
                                               "oracle": experts and experts["oracle"], "stages": stages,
                                               "claims": claims, "plots": plots, "smoke": smoke}, indent=1))
    print(f"report: {r / 'report.md'}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="run folder")
    a = p.parse_args(argv)
    if not Path(a.out).is_dir():
        raise SystemExit(f"report.py: {a.out}: no such run folder")
    report(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
