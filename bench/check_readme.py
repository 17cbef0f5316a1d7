"""Check that every figure README.md cites equals the results file it comes from.

    python bench/check_readme.py          # exit 1 listing each mismatch, 0 when all agree

The README's numbers are written by hand. Each entry of FIGURES below names a results file, reads the figure
from it (JSON where the record has it, else the record's own markdown) and gives the exact text the README
must contain with that figure filled in. A figure whose record does not exist yet (optional=True: the test
suite's timing, the random baseline) is skipped with a note. Every `results/...` path the README names must
exist. When the README's wording or a record changes, this list changes with it.
"""
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
S2 = "results/small2"
MODELS = [("base SmolLM2-135M", "base"), ("sft0", "sft0"), ("sft1", "sft1"), ("sft2", "sft2"), ("rl0", "rl0"),
          ("rl1", "rl1"), ("rl2", "rl2"), ("soup", "soup"), ("TIES", "ties"), ("DARE-TIES (sum)", "dare_ties"),
          ("DARE-TIES (mean)", "dare_ties_mean"), ("DELLA", "della"), ("OPD, gated (the paper's)", "opd"),
          ("OPD, always distill", "opd_nogate"), ("OPD, gate + RL fallback", "opd_rlfb")]


@dataclass
class Figure:
    file: str                      # the record, relative to the repo root
    read: Callable                 # Path -> a tuple of values (formatted as the README writes them)
    text: str                      # README text, with {} for each value
    optional: bool = False         # skipped while the record does not exist


def js(path, *keys):
    d = json.loads(Path(path).read_text())
    for k in keys:
        d = d[k]
    return d


def md(pattern, group=1):
    """A reader taking one regex group from a markdown record."""
    def read(path):
        m = re.search(pattern, Path(path).read_text())
        if not m:
            raise ValueError(f"no match for {pattern!r}")
        return (m.group(group),)
    return read


def f1(x):
    return f"{x:.1f}"


SKILL = ROOT / "results/skill_bench.json"


def skill_pass(name):
    """A model's direct Pass@1 on the current skill split, '-' where it has no row (sft1/sft2: not published)."""
    m = js(SKILL, "models")
    return f1(m[name]["skill"]["pass@1"]) if name in m else "-"


def model_row(label, name):
    """One row of the headline table: agentic Pass@1 [CI] and Cov@1 on the reporting split, Pass@1 on eval_syn,
    direct Pass@1 on the skill split."""
    def read(path):
        a = js(path, "agentic")
        syn = js(ROOT / S2 / "eval_syn" / name / "metrics.json", "agentic", "pass@1")
        return (f1(a["pass@1"]), f1(a["pass@1_ci95"][0]), f1(a["pass@1_ci95"][1]), f1(a["cov@1"]), f1(syn),
                skill_pass(name))
    return Figure(f"{S2}/eval/{name}/metrics.json", read, f"| {label} | {{}} [{{}}, {{}}] | {{}} | {{}} | {{}} |")


def baseline_row(label, name, skill_note=""):
    """A no-model row of the headline table: its run on the 40 tasks (results/small2/baselines) and its skill row."""
    def read(path):
        a = js(path, "agentic")
        return f1(a["pass@1"]), f1(a["pass@1_ci95"][0]), f1(a["pass@1_ci95"][1]), f1(a["cov@1"]), skill_pass(name)
    return Figure(f"{S2}/baselines/{name}/metrics.json", read,
                  f"| {label} | {{}} [{{}}, {{}}] | {{}} | - | {{}}{skill_note} |")


def oracle(path):
    """The oracle union of rl0-2: agentic on the reporting split and eval_syn, direct on the skill split (the best
    expert's mean plus claim (b)'s oracle gain)."""
    dev = js(path, "oracle")
    syn = js(ROOT / S2 / "compare" / "experts_syn.json", "oracle")
    c = js(SKILL, "claims")
    skill = c["means"][c["claims"]["b"]["best_expert"]] + c["claims"]["b"]["oracle_minus_best"]["point"]
    return f1(dev["pass@1"]), f1(dev["cov@1"]), f1(syn["pass@1"]), f1(skill)


def verdicts(path):
    c = js(path, "eval", "claims")
    return tuple(c[k]["verdict"] for k in "abcd")


def rl_steps(_):
    return tuple(str(js(ROOT / S2 / "stages" / f"rl{k}" / "result.json", "outcome", "steps")) for k in range(3))


def hostile(path):
    h = js(path)
    passed = {side: sum(bool(r.get("passed")) for r in h[side]["rows"]) for side in ("before", "after")}
    return str(len(h["after"]["rows"])), str(passed["before"]), "none" if passed["after"] == 0 else str(passed["after"])


def gpu_memory(path):
    bf16 = js(path, "bf16")
    differ = [v for k, v in bf16["answers_differing_from_uncapped"].items() if k != "none"]
    p1 = [c["direct_pass@1"] for c in bf16["caps_gib"].values()]
    same = "identical" if js(path, "answers_identical_fp32") else "not identical"
    return same, str(min(differ)), str(max(differ)), f1(min(p1)), f1(max(p1))


def smoke_rss(path):
    """The demo's highest per-stage peak RSS, as 'under N GiB' (N the next whole GiB)."""
    rss = [int(m) for m in re.findall(r"^\| \w+ \| [\d.]+ \| (\d+) \|", Path(path).read_text(), re.M)]
    return (str(-(-max(rss) // 1024)),)


def random_baseline(path):
    """Random stimulus at 20k cycles on the whole reporting split: Pass@1, its interval and the split's size."""
    r = js(path, "models", "random_20000", "all")
    lo, hi = r["pass@1_ci95"]
    return f1(r["pass@1"]), f1(lo), f1(hi), str(r["tasks"])


def skill_baselines(path):
    """The current skill split: its size, random at 20k and 99k cycles, the teacher's range with refinement, and the
    teacher's range on the split's real designs."""
    d = js(path)
    m, split = d["models"], d["skill_split"]
    teacher = [m[f"teacher_{lv}"]["skill"] for lv in ("minimal", "weak", "medium", "strong", "long")]
    return (str(split["tasks"]), str(split["real"]), f1(m["random_20000"]["skill"]["pass@1"]),
            f1(m["random_99000"]["skill"]["pass@1"]), f1(min(t["pass@1"] for t in teacher)),
            f1(max(t["pass@1"] for t in teacher)), f1(min(t["by_source"]["real"]["pass@1"] for t in teacher)),
            f1(max(t["by_source"]["real"]["pass@1"] for t in teacher)))


def skill_models(path):
    """The published models' direct Pass@1 range on the current skill split, the best (rl1 expected) with its
    real-design share, and their range on the reporting split."""
    m = js(path)["models"]
    trained = [k for k in ("sft0", "rl0", "rl1", "rl2", "opd", "opd_nogate", "opd_rlfb") if k in m]
    skill = {k: m[k]["skill"]["pass@1"] for k in trained}
    best = max(skill, key=skill.get)
    alls = [m[k]["all"]["pass@1"] for k in trained]
    return (f1(min(skill.values())), f1(max(skill.values())), best, f1(skill[best]),
            f1(m[best]["skill"]["by_source"]["real"]["pass@1"]), f1(min(alls)), f1(max(alls)))


def skill_merges(path):
    """The five merges' direct Pass@1 range on the current skill split."""
    m = js(path)["models"]
    merged = [m[k]["skill"]["pass@1"] for k in ("soup", "ties", "dare_ties", "dare_ties_mean", "della")]
    return f1(min(merged)), f1(max(merged))


def suite(path):
    s = js(path)
    return str(s["tests"]), str(round(s["seconds"])), str(s["cores"])


FIGURES = [
    *[model_row(label, name) for label, name in MODELS],
    Figure(f"{S2}/compare/experts.json", oracle, "| oracle union of rl0-2 | {} | {} | {} | {} |"),
    baseline_row("*random stimulus, 20k cycles (no model)*", "random_20000"),
    baseline_row("*template teacher, `long` (no model)*", "teacher_long", " (1 + 3 rounds)"),
    Figure("results/skill_bench.md", md(r"\| \*teacher:long, direct\* \| \d+ x 1 \| ([\d.]+) \["), "(direct: {} %)"),
    Figure(f"{S2}/report/claims.json", verdicts, "(a) {}, (b) {}, (c) {}, (d) {}"),
    Figure(f"{S2}/compare/experts.json", lambda p: (f1(js(p, "oracle", "solved_pct")),),
           "so the split's ceiling is {} %"),
    Figure(f"{S2}/stages/rl0/result.json", rl_steps, "validation plateau after {} / {} / {} steps"),
    Figure(f"{S2}/stages/rl0/result.json", rl_steps, "(the published experts: {} / {} / {})"),
    Figure("results/small2_run.md", md(r"whole run took about ([\d.]+) hours"), "about {} H200 hours"),
    Figure("results/small2_run.md", md(r"2-core CPU box \(`--only data --set sim_workers=2`, about (\d+) minutes\)"),
           "2 CPU cores, about {} minutes"),
    Figure("results/small2_run.md", md(r"Peak GPU memory \(`result.json`, reserved\): ([\d-]+) GiB"),
           "{} GiB reserved per RL stage"),
    Figure("results/demo.md", md(r"Latest measurement, [\d-]+ \(commit (\w+)"), "at commit {} and wrote"),
    Figure("results/demo.md", md(r"(?s)Latest measurement.*?wall \*\*(\d+ min \d+ s)\*\*", 1), "The last measurement took {}"),
    Figure("results/demo.md", md(r"(?s)Latest measurement.*?wall \*\*(\d+ min \d+ s)\*\*", 1), "| 2 CPU cores | {} |"),
    Figure("results/demo.md", smoke_rss, "under {} GiB RSS"),
    Figure("results/bench_4b_pipeline.json", lambda p: (f"{js(p, 'profiles', 'small', 'max_peak_reserved_gib'):.2f}",),
           "the 17 stages before `eval_skill` within {} GiB under a 24 GiB cap"),
    Figure("results/bench_4b_pipeline.json", lambda p: (f"{js(p, 'profiles', '4b', 'max_peak_reserved_gib'):.2f}",),
           "the 17 stages before `eval_skill` within {} GiB under a 24 GiB cap"),
    Figure("results/bench_4b_pipeline.json", lambda p: (str(js(p, "profiles", "4b", "nonfinite_steps")),),
           "with {} non-finite gradient steps"),
    Figure("results/bench_4b_gen.json", lambda p: (f1(js(p, "summary", "fast_vs_hf")),),
           "The fast decoder is {}x HF generate"),
    Figure("results/rl_throughput.md", md(r"\*\*RL step: ([\d.]+) s\*\*"), "takes {} s on an H200"),
    Figure("results/rl_throughput.md", md(r"\| three experts, one process \| all three \| \*\*[\d.]+\*\* \| \*\*([\d.]+)\*\*"),
           "an expert-step takes {} s this way"),
    Figure("results/rl_throughput.md", lambda p: ("-".join(re.search(
        r"\| two processes side by side[^|]*\| each arm \| [\d.]+ / [\d.]+ \| ([\d.]+) / ([\d.]+) \|",
        Path(p).read_text()).groups()),), "against {} s for two processes"),
    Figure("results/gpu_memory.json", gpu_memory,
           "greedy answers are {} in fp32; in bf16, {}-{} of 206 answers part at near-ties and direct "
           "Pass@1 stays within {}-{}"),
    Figure("results/hostile.json", hostile, "of {} hostile answers tried, {} passed before these checks and {} passes now"),
    Figure("results/answer_modes.json", lambda p: (f1(js(p, "stimulus", "agentic", "pass@1")),
                                                   f1(js(p, "testbench", "agentic", "pass@1"))),
           "agentic Pass@1 was {} % in stimulus mode against {} % in testbench mode"),
    Figure("results/corpus.json", lambda p: (str(js(p, "real_designs")),), "({} designs pass every filter)"),
    Figure("results/skill_bench.json", random_baseline, "passes {} % [{}, {}] of the whole reporting split ({} tasks;"),
    Figure("results/skill_bench.json", skill_baselines,
           "keeps the tasks random cannot pass and a known stimulus can: {}, {} of them real designs. There random\n"
           "stimulus passes {} % at 20k cycles and {} % at 99k, the template teacher with three refinement rounds\n"
           "{}-{} % ({}-{} % of the real designs"),
    Figure("results/skill_bench.json", lambda p: skill_models(p)[:5],
           "{}-{} % of it (n = 5; the best is {} at {} %, {} % of the real designs, none of the synthetic tasks)"),
    Figure("results/skill_bench.json", lambda p: skill_models(p)[5:],
           "On the reporting split they stay at or below random ({}-{} %, n = 2)"),
    Figure("results/skill_bench.json", skill_merges, "On the skill split the merges of rl0-2 pass {}-{} %, so"),
    Figure("results/skill_bench.json", lambda p: tuple(js(p, "claims", "claims", k, "verdict") for k in "bcd"),
           "and the paper's claims come out as (b) {}, (c) {}, (d) {} ((a) needs"),
    Figure("results/suite.json", suite, "{} tests, {} s on {} cores", optional=True),
]


def check(readme_text=None, root=ROOT):
    """(problems, notes): each figure whose filled-in text the README lacks, and the skipped ones."""
    text = README.read_text() if readme_text is None else readme_text
    flat = " ".join(text.split())          # a figure may wrap across lines
    problems, notes = [], []
    for fig in FIGURES:
        path = root / fig.file
        if not path.exists():
            (notes if fig.optional else problems).append(f"{fig.file}: missing" + (", skipped" if fig.optional else ""))
            continue
        try:
            want = fig.text.format(*fig.read(path))
        except (KeyError, ValueError, IndexError, TypeError) as e:
            problems.append(f"{fig.file}: cannot read the figure ({type(e).__name__}: {e})")
            continue
        if " ".join(want.split()) not in flat:
            problems.append(f"{fig.file}: the README should say {want!r}")
    for cited in sorted(set(re.findall(r"results/[\w./-]*\w", text))):
        if not (root / cited).exists():
            problems.append(f"README cites {cited}, which does not exist")
    return problems, notes


def main():
    problems, notes = check()
    for n in notes:
        print(f"check_readme: note: {n}")
    for p in problems:
        print(f"check_readme: {p}")
    print(f"check_readme: {len(FIGURES) - len(notes)} figures checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
