"""Build a pool of real training designs (tasks in the kit's schema) from open RTL.

Sources (each read into candidate designs, then filtered and calibrated):
  corpus JSONL(.gz)   ../shared/data/corpus/*.jsonl.gz records (README there: id, source, license, spec,
                      rtl_files {relative path: text}, top_module, provenance). A record is one design
                      (kind "project" for TinyTapeout/CVDP records, "module" for library modules); with
                      submodules on, every other module of a multi-module project is also a candidate
                      (kind "submodule": the files of its instantiation closure; spec = the project's docs
                      plus the module's header comment).
  Hugging Face        `hf:NAME` (e.g. hf:codev-r1 = zhuyaoyu/CodeV-R1-dataset subset sft, spec
                      `question[1].content`, RTL `ground_truth[0].content`), or a local dataset: a .jsonl /
                      .json / .parquet file or a `save_to_disk` folder, with spec_col / rtl_col given as
                      paths such as `question[1].content` (kind "design").
  folder              a folder of .v/.sv files: each file directly in it is one design, each sub-folder
                      (all its .v/.sv/.vh/.svh files) is one design; spec = NAME.md beside the file, or
                      spec.md / README.md in the design's folder (kind "design").

Filters, in this order, each counted per source as reason -> count (pool_stats.json "rejected"):
  no_module          no module declaration in the RTL
  bad_file_names     two files share a base name, or a name sim.py cannot use
  top_not_found      the given top module is not defined
  several_tops       no top given and the design elaborates with != 1 root module (unused modules in the
                     files of a given top are kept; the top's instantiation closure picks the files)
  too_small/too_large  RTL tokens outside [min_tokens, max_tokens]
  duplicate          same top and same comment/whitespace-stripped text as an earlier design
  contaminated       ROUGE-L or 5-gram F1 >= threshold against any evaluation task
                     (data.decontam.contamination_filter)
  instrument_error / compile_error   sim.prepare_check (the `sim.py prepare` check): sim.py cannot
                     instrument it, or it does not compile alone under Icarus
  teacher_cannot_drive / no_inputs   data.teacher.analyze_dut/template_answer raise TeacherError, or the
                     top has no input port
  prompt_too_long    the chat prompt (common.build_messages) is over max_prompt_tokens
  teacher_reaches_nothing  the template teacher's strong, long and refined testbenches reach no coverage
Then every kept design gets the Icarus-calibrated target `icarus_overall_average` (data.teacher.calibrate:
strong + long template + one refinement, simulated with simpool.simulate_many in chunks, with progress).

Tokens: SmolLM2's tokenizer (common's converted GGUF folder) when tokenizer="smollm2" (default); with
tokenizer="chars" (tests, or when the model is missing) tokens = ceil(chars / CHARS_PER_TOKEN), the
ratio measured on the shared corpus with the SmolLM2 tokenizer (see results/corpus.md).

Files sim.py uses are flat: file names become base names; an `include of a header of the design is
replaced by the header's text (between `// begin included file x.vh` and `// end ...` lines: the
only edit made to any file, so sim.py instruments and the teacher reads what the header declares);
headers nobody includes stay as files and come first, packages next, then the module files in the
source's order (only those of the top's instantiation closure).

Python API:
  build_pool(sources, out_dir, eval_tasks=(), **knobs) -> stats   (writes pool.jsonl + pool_stats.json)
  read_corpus(path), read_hf(name, spec_col, rtl_col, ...), read_folder(path): candidate iterators
CLI:
  python data/design_pool.py --corpus ../shared/data/corpus/*.jsonl.gz --out runs/pool \\
      --eval-tasks ../shared/data/dev_tasks.jsonl [--hf codev-r1] [--hf NAME --spec-col C --rtl-col C] \\
      [--folder DIR] [--min-tokens 300 --max-tokens 4000 --max-prompt-tokens 6000] [--workers 2]
Files written (under --out): pool.jsonl (one task per line: the dev-set columns plus license,
provenance, source, rtl_tokens, icarus_calibration), pool_stats.json (per source: read, funnel,
rejected reasons, kinds; pool totals; teacher coverage; decontamination drops; config).
"""
import argparse
import concurrent.futures
import gzip
import hashlib
import json
import math
import os
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

import pyslang
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # kit root: sim.py, common.py

import common  # noqa: E402
import sim  # noqa: E402
from data import decontam, designs, teacher  # noqa: E402

RTL_EXT = (".v", ".sv", ".vh", ".svh")
CHARS_PER_TOKEN = 2.5        # characters per SmolLM2 token of Verilog (measured on the shared corpus: 2.50)
DEFAULTS = {"min_tokens": 300, "max_tokens": 4000, "max_prompt_tokens": 6000, "submodules": True,
            "max_submodules": 10, "threshold": 0.5, "workers": 2, "chunk": 32, "tokenizer": "smollm2",
            "keep_unreached": False, "sim_timeout_s": 20.0, "sample": None, "seed": 0}
HF_PRESETS = {"codev-r1": {"name": "zhuyaoyu/CodeV-R1-dataset", "subset": "sft", "split": "train",
                           "spec_col": "question[1].content", "rtl_col": "ground_truth[0].content"}}
SAMPLE_SLACK = 2    # --sample N takes 2N + 8 shuffled candidates through the filters, then keeps the first N
FUNNEL = ("read", "parsed", "size_ok", "unique", "decontaminated", "compiles", "teacher_drives",
          "prompt_fits", "teacher_reaches")


class PoolError(ValueError):
    """Bad input (a source that cannot be read, a column that is missing); one line, names the place."""


# ----------------------------------------------------------------------------------------------
# Candidates: {id, source, kind, license, provenance, spec, files: [(path, text)], top (or None)}
# ----------------------------------------------------------------------------------------------

def _open_text(path):
    return gzip.open(path, "rt", encoding="utf-8") if str(path).endswith(".gz") else open(path, encoding="utf-8")


def source_name(path):
    name = Path(path).name
    for ext in (".gz", ".jsonl", ".json"):
        name = name[:-len(ext)] if name.endswith(ext) else name
    return name


def read_corpus(path, submodules=True, max_submodules=10):
    """Candidates of one shared-corpus file (README schema); sub-modules of multi-module projects too."""
    src = source_name(path)
    with _open_text(path) as f:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise PoolError(f"{path}:{no}: invalid JSON ({e.msg})") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("rtl_files"), dict) or "id" not in rec:
                raise PoolError(f"{path}:{no}: not a corpus record (needs id and rtl_files {{path: text}})")
            kind = "module" if rec.get("source") == "library" else "project"
            cand = {"id": rec["id"], "source": src, "kind": kind, "license": rec.get("license"),
                    "provenance": rec.get("provenance"), "spec": rec.get("spec") or "",
                    "files": list(rec["rtl_files"].items()), "top": rec.get("top_module")}
            yield cand
            if submodules and kind == "project":
                yield from submodule_candidates(cand, max_submodules)


def submodule_candidates(cand, limit=10):
    """Every module of a project other than its top, as a design of its own (files: its closure)."""
    try:
        info = scan_modules(cand["files"])
    except ValueError:
        return
    subs = [m for m in info["order"] if m != cand["top"]][:limit]
    for m in subs:
        text = info["text_of"][m]
        note = module_header(text, m)
        spec = (cand["spec"].rstrip() + f"\n\n## Module `{m}` (a sub-module of this project)\n\n{note}\n").lstrip()
        yield {**cand, "id": f"{cand['id']}#{m}", "kind": "submodule", "top": m, "spec": spec,
               "provenance": {**(cand["provenance"] or {}), "module": m}}


def read_folder(path):
    """Candidates of a folder: one design per .v/.sv file directly in it, one per sub-folder."""
    root = Path(path)
    if not root.is_dir():
        raise PoolError(f"{path}: not a folder")
    src = f"folder:{root.name}"
    for p in sorted(root.iterdir()):
        if p.is_file() and p.suffix in (".v", ".sv"):
            spec = next((s.read_text(encoding="utf-8", errors="replace") for s in
                         (p.with_suffix(".md"), root / "spec.md", root / "README.md") if s.is_file()), "")
            yield {"id": f"{root.name}/{p.stem}", "source": src, "kind": "design", "license": None,
                   "provenance": {"path": str(p)}, "spec": spec,
                   "files": [(p.name, p.read_text(encoding="utf-8", errors="replace"))], "top": None}
        elif p.is_dir():
            files = [(str(q.relative_to(p)), q.read_text(encoding="utf-8", errors="replace"))
                     for q in sorted(p.rglob("*")) if q.is_file() and q.suffix in RTL_EXT]
            if not files:
                continue
            spec = next((s.read_text(encoding="utf-8", errors="replace") for s in
                         (p / "spec.md", p / "README.md", root / f"{p.name}.md") if s.is_file()), "")
            yield {"id": f"{root.name}/{p.name}", "source": src, "kind": "design", "license": None,
                   "provenance": {"path": str(p)}, "spec": spec, "files": files, "top": None}


_PATH_TOKEN = re.compile(r"\.?([A-Za-z_][\w-]*)|\[(-?\d+)\]")


def get_path(row, path):
    """row['question'][1]['content'] for path 'question[1].content' (a JSON string is decoded on the way)."""
    pos, cur = 0, row
    while pos < len(path):
        m = _PATH_TOKEN.match(path, pos)
        if not m:
            raise PoolError(f"bad column path {path!r} at position {pos}")
        if isinstance(cur, str) and cur[:1] in "[{":
            try:
                cur = json.loads(cur)
            except json.JSONDecodeError:
                pass
        try:
            cur = cur[m.group(1)] if m.group(1) is not None else cur[int(m.group(2))]
        except (KeyError, IndexError, TypeError):
            raise KeyError(f"{path!r}: no {m.group(0).lstrip('.')!r} at {path[:pos] or 'the row'}") from None
        pos = m.end()
    return cur


_FENCE = re.compile(r"```[ \t]*(?:systemverilog|verilog|sv|v)?[ \t]*\n(.*?)```", re.S | re.I)


def strip_fence(text):
    """The code inside the first fenced block of a text, or the text itself when it has none."""
    m = _FENCE.search(text)
    return m.group(1) if m else text


def load_dataset_rows(name, subset=None, split="train"):
    """Rows of a HF dataset: a local .jsonl/.json/.parquet file, a save_to_disk folder, or a Hub name."""
    import datasets
    p = Path(name)
    try:
        if p.is_dir():
            ds = datasets.load_from_disk(str(p))
            if isinstance(ds, datasets.DatasetDict):
                ds = ds[split] if split in ds else ds[next(iter(ds))]
            return ds
        if p.is_file():
            kind = "parquet" if p.suffix == ".parquet" else "json"
            return datasets.load_dataset(kind, data_files=str(p), split="train")
        return datasets.load_dataset(name, subset, split=split)
    except Exception as e:      # the Hub unreachable, a bad file: one line naming the dataset
        raise PoolError(f"dataset {name!r}: cannot load ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


def read_hf(name, spec_col=None, rtl_col=None, subset=None, split="train", top_col=None, id_col=None,
            license=None):
    """Candidates of a dataset (preset name such as 'codev-r1', Hub name, or local file/folder)."""
    preset = HF_PRESETS.get(name) or next((v for v in HF_PRESETS.values() if v["name"] == name), None)
    if preset:
        name, subset = preset["name"], subset or preset["subset"]
        spec_col, rtl_col = spec_col or preset["spec_col"], rtl_col or preset["rtl_col"]
    if not rtl_col:
        raise PoolError(f"dataset {name!r}: give the RTL column (--rtl-col)")
    ds = load_dataset_rows(name, subset, split)
    short = Path(name).name if Path(name).exists() else name
    src = f"hf:{short}"
    for i, row in enumerate(ds):
        try:
            rtl = get_path(row, rtl_col)
            spec = get_path(row, spec_col) if spec_col else ""
        except KeyError as e:
            raise PoolError(f"dataset {name!r} row {i}: {e.args[0]}") from None
        if not isinstance(rtl, str):
            raise PoolError(f"dataset {name!r} row {i}: column {rtl_col!r} is {type(rtl).__name__}, not text")
        rid = str(get_path(row, id_col)) if id_col else str(i)
        yield {"id": f"{short}/{rid}", "source": src, "kind": "design",
               "license": license or f"see the dataset card of {name}",
               "provenance": {"dataset": name, "subset": subset, "split": split, "row": i},
               "spec": spec if isinstance(spec, str) else json.dumps(spec),
               "files": [("design.sv", strip_fence(rtl))], "top": get_path(row, top_col) if top_col else None}


# ----------------------------------------------------------------------------------------------
# Module structure (pyslang syntax only, `include lines blanked as sim.py does)
# ----------------------------------------------------------------------------------------------

_INCLUDE = re.compile(r"(`include\s+\")([^\"]+)(\")")


def scan_modules(files):
    """{order: [module], file_of: {module: path}, text_of: {module: file text}, uses: {module: set},
    packages: set(paths that declare a package)}; raises ValueError on a file that is no Verilog."""
    K = pyslang.syntax.SyntaxKind
    order, file_of, text_of, uses, packages = [], {}, {}, {}, set()
    for path, text in files:
        blank = re.sub(r"`include\b[^\n]*", lambda m: " " * len(m.group(0)), text)
        tree = pyslang.syntax.SyntaxTree.fromText(blank, os.path.basename(path))
        def visit(n):
            if n.kind in (K.ModuleDeclaration, K.ProgramDeclaration):
                name = n.header.name.valueText
                if name and name not in file_of:
                    order.append(name)
                    file_of[name], text_of[name] = path, text
                    uses[name] = set()
                    cur = name
                    for m in n.members:
                        m.visit(lambda x, cur=cur: _use(x, cur))
                return False
            if n.kind == K.PackageDeclaration:
                packages.add(path)
            return True

        def _use(x, cur):
            if x.kind == K.HierarchyInstantiation:
                uses[cur].add(x.type.valueText)
            return True

        tree.root.visit(visit)
    return {"order": order, "file_of": file_of, "text_of": text_of, "uses": uses, "packages": packages}


def closure(top, uses):
    seen, todo = set(), [top]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo.extend(u for u in uses.get(m, ()) if u in uses)
    return seen


def module_header(text, name):
    """The comment paragraphs right before `module name` plus its header up to the first `);`."""
    m = re.search(r"^[ \t]*module\s+" + re.escape(name) + r"\b", text, re.M)
    if not m:
        return ""
    before = text[:m.start()].rstrip("\n").split("\n")
    comments = []
    for line in reversed(before):
        s = line.strip()
        if s.startswith(("//", "/*", "*")) or (s.endswith("*/")):
            comments.append(line)
        elif s == "" and comments:
            comments.append(line)
        elif s.startswith("`") or s == "":
            continue
        else:
            break
    end = text.find(");", m.start())
    head = text[m.start(): end + 2 if end != -1 else m.start() + 2000]
    return ("\n".join(reversed(comments)).strip() + "\n" + head).strip()[:3000]


def normalise(text):
    """Comments and whitespace removed (for de-duplication)."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"\s+", "", text)


def design_files(cand):
    """(top, [{name, content}]) of a candidate, or raises ValueError(reason, detail)."""
    files = [(p, t) for p, t in cand["files"] if isinstance(t, str) and p.endswith(RTL_EXT)]
    if not files:
        raise ValueError("no_module", "no .v/.sv file")
    try:
        info = scan_modules(files)
    except Exception as e:     # pyslang failing on bytes that are no Verilog
        raise ValueError("no_module", f"cannot parse ({type(e).__name__})")
    if not info["order"]:
        raise ValueError("no_module", "no module declaration")
    top = cand.get("top")
    if top:
        if top not in info["file_of"]:
            raise ValueError("top_not_found", f"top {top!r} not among {', '.join(info['order'][:8])}")
    else:
        used = set().union(*info["uses"].values())
        roots = [m for m in info["order"] if m not in used]
        if len(roots) != 1:
            raise ValueError("several_tops", f"{len(roots)} root modules ({', '.join(roots[:5])})")
        top = roots[0]
    need = {info["file_of"][m] for m in closure(top, info["uses"])}
    with_modules = set(info["file_of"].values())
    headers = [(p, t) for p, t in files if p not in with_modules and p not in info["packages"]]
    pkgs = [(p, t) for p, t in files if p in info["packages"] and p not in with_modules]
    mods = [(p, t) for p, t in files if p in need]
    by_name = {os.path.basename(p): t for p, t in files}
    used_headers = set()
    out, seen = [], set()
    for p, t in pkgs + mods:
        out.append((p, inline_includes(t, by_name, used_headers)))
    out = [(p, t) for p, t in headers if os.path.basename(p) not in used_headers] + out
    for p, _ in out:
        name = os.path.basename(p)
        if name in seen or not re.fullmatch(r"[A-Za-z0-9_.+-]+", name) or name.startswith("."):
            raise ValueError("bad_file_names", f"file name {name!r} repeated or unusable")
        seen.add(name)
    return top, [{"name": os.path.basename(p), "content": t} for p, t in out]


def inline_includes(text, headers, used, depth=0):
    """`include "x" lines replaced by the text of header x of the design (by base name, recursively), so
    pyslang (sim.py, the teacher) sees the macros and declarations; includes not in the design stay."""
    def sub(m):
        name = os.path.basename(m.group(2))
        if name not in headers or depth > 8:
            return m.group(0)
        used.add(name)
        body = inline_includes(headers[name], headers, used, depth + 1)
        return f"// begin included file {name}\n{body.rstrip()}\n// end included file {name}"
    return _INCLUDE.sub(sub, text)


# ----------------------------------------------------------------------------------------------
# Token counting
# ----------------------------------------------------------------------------------------------

class Tokens:
    """count(text) and prompt(messages) in SmolLM2 tokens, or the chars/token estimate."""

    def __init__(self, kind="smollm2"):
        self.kind, self.tok = kind, None
        if kind == "smollm2":
            try:
                from transformers import AutoTokenizer
                self.tok = AutoTokenizer.from_pretrained(common.gguf_to_hf_folder(common.default_model_path()))
                self.tok.model_max_length = 10 ** 9      # counting only: no warning on long designs
            except Exception as e:     # the model is missing: say so and fall back
                print(f"design_pool: SmolLM2 tokenizer unavailable ({type(e).__name__}: {e}); "
                      f"using {CHARS_PER_TOKEN} chars/token", file=sys.stderr)
                self.kind = "chars"
        elif kind != "chars":
            raise PoolError(f"tokenizer must be 'smollm2' or 'chars', not {kind!r}")

    def count(self, text):
        if self.tok is None:
            return math.ceil(len(text) / CHARS_PER_TOKEN)
        return len(self.tok(text, add_special_tokens=False)["input_ids"])

    def prompt(self, messages):
        if self.tok is None:
            return math.ceil(sum(len(m["content"]) for m in messages) / CHARS_PER_TOKEN) + 10 * len(messages)
        return len(common.chat_ids(self.tok, messages))


# ----------------------------------------------------------------------------------------------
# The pool
# ----------------------------------------------------------------------------------------------

def make_task(cand, top, rtl_files, n_tokens):
    inst = designs.instance_name(cand["id"], top)
    rtl = "\n".join(f["content"] for f in rtl_files)
    return {
        "id": cand["id"],
        "spec_files": [{"name": "spec.md", "content": cand["spec"]}] if cand["spec"].strip() else [],
        "rtl_files": rtl_files,
        "dut_module_name": top,
        "dut_instance_name": inst,
        "instruction": designs.instruction_text(top, inst),
        "targets": [{"inst_name": inst, "metric": "overall_average", "target_percentage": 90.0}],
        "difficulty": designs.difficulty({}, rtl),
        "is_agentic": False,
        "license": cand["license"],
        "provenance": cand["provenance"],
        "source": {"pool_source": cand["source"], "kind": cand["kind"]},
        "rtl_tokens": n_tokens,
    }


def _check_compiles(tasks, workers, cfg):
    """sim.prepare_check on every task (threads: the work is the sandboxed iverilog subprocess)."""
    with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as ex:
        futs = [ex.submit(sim.prepare_check, t["rtl_files"], t["dut_module_name"], cfg) for t in tasks]
        out = []
        for f in tqdm(futs, desc="compile (sim.py prepare)", unit="design", file=sys.stderr):
            out.append(f.result())
    return out


def _teacher_check(task):
    """None when the template teacher drives the design, else (reason, detail)."""
    try:
        info = teacher.analyze_dut(task)
        teacher.template_answer(task, "strong", 0)
    except teacher.TeacherError as e:
        return "teacher_cannot_drive", str(e)
    except Exception as e:        # pyslang surprises on odd RTL: the teacher cannot drive it either
        return "teacher_cannot_drive", f"{type(e).__name__}: {e}"
    if not any(p["dir"] == "input" for p in info["ports"]):
        return "no_inputs", "the top has no input port"
    return None


class Funnel:
    """Per-source counts of the filters (funnel, rejected reasons, kinds read and kept) and a sample of the
    rejected designs with their reasons: what pool_stats.json reports."""

    def __init__(self):
        self.sources, self.examples = {}, []

    def of(self, src):
        return self.sources.setdefault(src, {"funnel": {f: 0 for f in FUNNEL}, "rejected": Counter(),
                                             "kinds_read": Counter(), "kinds_pool": Counter()})

    def passed(self, task, stage):
        self.of(task["source"]["pool_source"])["funnel"][stage] += 1

    def reject(self, task_or_cand, reason, detail=""):
        src = task_or_cand["source"]["pool_source"] if "rtl_files" in task_or_cand else task_or_cand["source"]
        self.of(src)["rejected"][reason] += 1
        if len(self.examples) < 2000:
            self.examples.append({"id": task_or_cand["id"], "reason": reason, "detail": str(detail)[:300]})

    def report(self):
        """{source: funnel, rejected, kinds_read, kinds_pool, real_designs} and the pool's kinds."""
        kinds = Counter()
        for s in self.sources.values():
            kinds.update(s["kinds_pool"])
        return dict(kinds), {src: {"funnel": s["funnel"], "rejected": dict(s["rejected"].most_common()),
                                   "kinds_read": dict(s["kinds_read"]), "kinds_pool": dict(s["kinds_pool"]),
                                   "real_designs": sum(s["kinds_pool"].values())}
                             for src, s in self.sources.items()}


def read_unique(sources, toks, k, funnel):
    """1. read, parse, top, size, de-duplicate: the candidates of every source as tasks."""
    tasks, seen = [], set()
    for source in sources:
        for cand in tqdm(source, desc="read", unit="design", file=sys.stderr, leave=False):
            s = funnel.of(cand["source"])
            s["funnel"]["read"] += 1
            s["kinds_read"][cand["kind"]] += 1
            try:
                top, rtl_files = design_files(cand)
            except ValueError as e:
                reason, detail = e.args if len(e.args) == 2 else ("no_module", str(e))
                funnel.reject(cand, reason, detail)
                continue
            s["funnel"]["parsed"] += 1
            rtl = "\n".join(f["content"] for f in rtl_files)
            n = toks.count(rtl)
            if n < k["min_tokens"] or n > k["max_tokens"]:
                funnel.reject(cand, "too_small" if n < k["min_tokens"] else "too_large", f"{n} tokens")
                continue
            s["funnel"]["size_ok"] += 1
            key = hashlib.sha256((top + "\0" + "\0".join(sorted(normalise(f["content"]) for f in rtl_files)))
                                 .encode()).hexdigest()
            if key in seen:
                funnel.reject(cand, "duplicate")
                continue
            seen.add(key)
            s["funnel"]["unique"] += 1
            tasks.append(make_task(cand, top, rtl_files, n))
    return tasks


def take_sample(tasks, sample, seed, funnel):
    """A seeded sample: enough shuffled candidates that the later filters still leave `sample`."""
    random.Random(seed).shuffle(tasks)
    for t in tasks[SAMPLE_SLACK * sample + 8:]:
        funnel.reject(t, "not_sampled")
    return tasks[:SAMPLE_SLACK * sample + 8]


def decontaminate(tasks, eval_tasks, threshold, funnel):
    """2. drop the tasks too close to any evaluation task -> (kept tasks, rows of the dropped ones)."""
    decon = []
    if eval_tasks:
        _, dropped = decontam.contamination_filter(tasks, list(eval_tasks), threshold=threshold)
        drop_ids = {d["id"] for d in dropped}
        by_id = {t["id"]: t for t in tasks}
        for d in dropped:
            t = by_id[d["id"]]
            funnel.reject(t, "contaminated", f"{d['eval_id']} ngram {d['ngram_f1']} rouge_l {d['rouge_l_f1']}")
            decon.append({**d, "source": t["source"]["pool_source"]})
        tasks = [t for t in tasks if t["id"] not in drop_ids]
    for t in tasks:
        funnel.passed(t, "decontaminated")
    return tasks, decon


def keep_compiling(tasks, workers, cfg, funnel):
    """3. the tasks that compile alone and instrument (sim.py prepare)."""
    kept = []
    for t, (ok, msg) in zip(tasks, _check_compiles(tasks, workers, cfg)):
        if ok:
            kept.append(t)
            funnel.passed(t, "compiles")
        else:
            funnel.reject(t, "instrument_error" if msg.startswith("prepare failed") else "compile_error", msg)
    return kept


def keep_drivable(tasks, toks, max_prompt_tokens, funnel):
    """4. the template teacher drives it; 5. its prompt fits (sets t["prompt_tokens"])."""
    kept = []
    for t in tqdm(tasks, desc="teacher + prompt", unit="design", file=sys.stderr):
        bad = _teacher_check(t)
        if bad:
            funnel.reject(t, *bad)
            continue
        funnel.passed(t, "teacher_drives")
        n = toks.prompt(common.build_messages(t))
        if n > max_prompt_tokens:
            funnel.reject(t, "prompt_too_long", f"{n} tokens")
            continue
        t["prompt_tokens"] = n
        funnel.passed(t, "prompt_fits")
        kept.append(t)
    return kept


class Calibration:
    """6. the teacher's testbenches simulated on each task (teacher.calibrate): what is kept, and the totals."""

    def __init__(self, n_tasks):
        self.to_calibrate, self.calibrated, self.n_pool, self.unreached, self.passed = n_tasks, 0, 0, 0, 0
        self.strong, self.rtl_tokens, self.prompt_tokens = [], [], []

    def keep(self, t, k, funnel):
        """True when the calibrated task t goes into the pool (counted), False when it is rejected."""
        if k["sample"] and self.n_pool >= k["sample"]:
            funnel.reject(t, "not_sampled")      # the sample is full: calibrated, not kept
            return False
        cal = t["icarus_calibration"]
        target = next(x["target_percentage"] for x in t["targets"] if x["metric"] == teacher.ICARUS_METRIC)
        if not cal["reached_pct"]:
            self.unreached += 1
            funnel.reject(t, "teacher_reaches_nothing", json.dumps({a: cal[a] for a in ("strong_pct", "long_pct")}))
            if not k["keep_unreached"]:
                return False
        else:
            funnel.passed(t, "teacher_reaches")
        funnel.of(t["source"]["pool_source"])["kinds_pool"][t["source"]["kind"]] += 1
        sp = cal["strong_pct"]
        self.strong.append(sp or 0.0)
        self.passed += sp is not None and sp >= target
        self.n_pool += 1
        self.rtl_tokens.append(t["rtl_tokens"])
        self.prompt_tokens.append(t["prompt_tokens"])
        return True


def pool_stats(complete, cal, funnel, decon, eval_tasks, k, toks, t0):
    """The pool_stats.json document."""
    pool_by_kind, sources = funnel.report()
    n = max(1, len(cal.strong))
    return {
        "complete": complete, "calibrated": cal.calibrated, "to_calibrate": cal.to_calibrate,
        "real_designs": cal.n_pool,
        "pool_by_kind": pool_by_kind,
        "sources": sources,
        "teacher": {"level": "strong", "mean_coverage_pct": round(sum(cal.strong) / n, 2),
                    "pass_rate_vs_icarus_target": round(cal.passed / n, 4),
                    "designs_reaching_nothing": cal.unreached},
        "decontamination": {"eval_files": [e if isinstance(e, str) else f"<{len(e)} tasks>" for e in eval_tasks],
                            "threshold": k["threshold"], "dropped": len(decon), "rows": decon},
        "rtl_tokens": cal.rtl_tokens, "prompt_tokens": cal.prompt_tokens,
        "config": {**k, "tokenizer": toks.kind, "chars_per_token": CHARS_PER_TOKEN if toks.kind == "chars" else None},
        "seconds": round(time.time() - t0, 1),
        "rejected_examples": funnel.examples,
    }


def write_json(path, doc):
    """Write doc to path through a temporary file, so a reader never sees half of it."""
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def build_pool(sources, out_dir, eval_tasks=(), *, log=None, **knobs):
    """Filter and calibrate the candidate designs of `sources` -> pool.jsonl + pool_stats.json in out_dir.

    sources: iterables of candidates (read_corpus / read_hf / read_folder).
    eval_tasks: evaluation task files (JSONL paths) or lists of task dicts to decontaminate against.
    knobs: see DEFAULTS (min_tokens, max_tokens, max_prompt_tokens, threshold, workers, chunk, tokenizer,
    keep_unreached, sim_timeout_s, sample, seed). Returns the stats dict (also written as pool_stats.json)."""
    unknown = set(knobs) - set(DEFAULTS) - {"submodules", "max_submodules"}
    if unknown:
        raise PoolError(f"unknown knob(s): {', '.join(sorted(unknown))}")
    k = {**DEFAULTS, **knobs}
    say = log or (lambda msg: print(msg, file=sys.stderr))
    t0 = time.time()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    toks = Tokens(k["tokenizer"])
    funnel = Funnel()

    tasks = read_unique(sources, toks, k, funnel)
    say(f"design_pool: {len(tasks)} unique designs in size bounds ({time.time() - t0:.0f}s)")
    if k["sample"]:
        tasks = take_sample(tasks, k["sample"], k["seed"], funnel)
    tasks, decon = decontaminate(tasks, eval_tasks, k["threshold"], funnel)
    say(f"design_pool: {len(tasks)} after decontamination ({len(decon)} dropped, {time.time() - t0:.0f}s)")
    cfg = sim.ScoreConfig(timeout_s=k["sim_timeout_s"])
    tasks = keep_compiling(tasks, k["workers"], cfg, funnel)
    tasks = keep_drivable(tasks, toks, k["max_prompt_tokens"], funnel)
    say(f"design_pool: {len(tasks)} designs to calibrate ({time.time() - t0:.0f}s)")

    # 6. calibrate in chunks, streamed to pool.jsonl; pool_stats.json is rewritten after every chunk with
    #    complete = false until the end
    pool_path, cal = out / "pool.jsonl", Calibration(len(tasks))
    with open(pool_path, "w") as f, tqdm(total=len(tasks), desc="calibrate (teacher sims)", unit="design",
                                         file=sys.stderr) as bar:
        for i in range(0, len(tasks), k["chunk"]):
            if k["sample"] and cal.n_pool >= k["sample"]:
                break
            chunk = teacher.calibrate(tasks[i:i + k["chunk"]], workers=k["workers"], cfg=cfg)
            for t in chunk:
                if cal.keep(t, k, funnel):
                    f.write(json.dumps(t) + "\n")
            f.flush()
            cal.calibrated += len(chunk)
            bar.update(len(chunk))
            write_json(out / "pool_stats.json", pool_stats(False, cal, funnel, decon, eval_tasks, k, toks, t0))
    result = pool_stats(True, cal, funnel, decon, eval_tasks, k, toks, t0)
    write_json(out / "pool_stats.json", result)
    say(f"design_pool: {cal.n_pool} designs -> {pool_path} ({result['seconds']:.0f}s)")
    return result


# ----------------------------------------------------------------------------------------------
# Report (results/corpus.md, corpus.json, corpus_tokens.png)
# ----------------------------------------------------------------------------------------------

def hardware():
    import platform
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?") \
        if os.path.exists("/proc/cpuinfo") else platform.processor()
    return f"{os.cpu_count()} CPU cores ({cpu}), {platform.system()} {platform.release()}"


def write_report(stats_path, results_dir, command="", commit=""):
    """results_dir/corpus.json (the stats without per-design examples, plus command, commit, hardware),
    corpus.md (tables) and corpus_tokens.png (histogram of RTL tokens of the pool)."""
    st = json.loads(Path(stats_path).read_text())
    res = Path(results_dir)
    res.mkdir(parents=True, exist_ok=True)
    doc = {k: v for k, v in st.items() if k not in ("rejected_examples", "rtl_tokens", "prompt_tokens")}
    doc["decontamination"] = {**st["decontamination"], "rows": st["decontamination"]["rows"]}
    toks = st.get("rtl_tokens") or []
    ptoks = st.get("prompt_tokens") or []
    q = (lambda xs, f: sorted(xs)[min(len(xs) - 1, int(f * len(xs)))] if xs else None)
    doc["rtl_tokens_quantiles"] = {p: q(toks, p / 100) for p in (0, 10, 50, 90, 100)}
    doc["prompt_tokens_quantiles"] = {p: q(ptoks, p / 100) for p in (0, 10, 50, 90, 100)}
    doc.update(command=command, commit=commit, hardware=hardware())
    (res / "corpus.json").write_text(json.dumps(doc, indent=1) + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.hist(toks, bins=40, color="#4477aa")
    ax.set_xlabel("RTL tokens (SmolLM2 tokenizer)" if st["config"]["tokenizer"] == "smollm2" else "RTL tokens (chars/2.5)")
    ax.set_ylabel("designs")
    ax.set_title(f"real-design pool: {st['real_designs']} designs")
    fig.tight_layout()
    fig.savefig(res / "corpus_tokens.png", dpi=110)
    plt.close(fig)
    L = ["# Real-design pool from the shared corpus", ""]
    if not st.get("complete", True):
        L += [f"**Partial run**: {st['calibrated']} of {st['to_calibrate']} designs calibrated when this was "
              "written; the counts up to `prompt_fits` are final, `teacher_reaches` and the pool are partial.", ""]
    L += [f"Command: `{command}`", "", f"Commit: `{commit}`; hardware: {doc['hardware']}; "
          f"{st['seconds'] / 60:.1f} min.", "",
          f"**real_designs: {st['real_designs']}** (by kind: "
          + ", ".join(f"{k} {v}" for k, v in sorted(st["pool_by_kind"].items())) + ")", "",
          "## Funnel per source (designs left after each filter)", "",
          "| source | " + " | ".join(FUNNEL) + " | pool |", "|---" * (len(FUNNEL) + 2) + "|"]
    for src, s in st["sources"].items():
        L.append(f"| {src} | " + " | ".join(str(s["funnel"][f]) for f in FUNNEL) + f" | {s['real_designs']} |")
    L += ["", "## Rejections per source (reason: count)", ""]
    for src, s in st["sources"].items():
        L.append(f"- {src}: " + ", ".join(f"{r} {n}" for r, n in s["rejected"].items()))
    L += ["", "## Kinds (read -> pool)", "", "| source | kind | read | pool |", "|---|---|---|---|"]
    for src, s in st["sources"].items():
        for kind, n in s["kinds_read"].items():
            L.append(f"| {src} | {kind} | {n} | {s['kinds_pool'].get(kind, 0)} |")
    t = st["teacher"]
    L += ["", "## Strong template teacher on the pool", "",
          f"Mean overall coverage of the strong template: {t['mean_coverage_pct']} %; pass rate against the "
          f"Icarus-calibrated target (`icarus_overall_average` = min(90, floor(best of strong, long, "
          f"long+refine))): {100 * t['pass_rate_vs_icarus_target']:.1f} %; designs the teacher reaches nothing on "
          f"(dropped): {t['designs_reaching_nothing']}.", "",
          "## Decontamination against the evaluation files", "",
          f"Files: {', '.join(st['decontamination']['eval_files'])}; ROUGE-L / 5-gram F1 >= "
          f"{st['decontamination']['threshold']} (data.decontam.contamination_filter): "
          f"{st['decontamination']['dropped']} designs dropped.", ""]
    for r in st["decontamination"]["rows"][:40]:
        L.append(f"- `{r['id']}` ~ `{r['eval_id']}` (5-gram F1 {r['ngram_f1']}, ROUGE-L {r['rouge_l_f1']})")
    c = st["config"]
    L += ["", "## Size bounds and tokens", "",
          f"RTL tokens in [{c['min_tokens']}, {c['max_tokens']}], chat prompt <= {c['max_prompt_tokens']} tokens "
          f"(tokenizer: {c['tokenizer']}). The authors keep RTL > 1000 tokens; on this corpus that would leave "
          "fewer than 1,000 designs before the compile and teacher filters, so the lower bound is 300. "
          "The upper bound 4000 keeps system prompt + spec + RTL + a ~2k-token answer inside SmolLM2's 8k context.",
          "", f"Pool RTL tokens (min/p10/median/p90/max): {list(doc['rtl_tokens_quantiles'].values())}; "
          f"prompt tokens: {list(doc['prompt_tokens_quantiles'].values())}.", "",
          "![RTL tokens](corpus_tokens.png)", ""]
    (res / "corpus.md").write_text("\n".join(L) + "\n")
    return doc


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--corpus", nargs="*", default=[], help="shared-corpus .jsonl(.gz) files")
    ap.add_argument("--hf", action="append", default=[],
                    help="dataset: preset (codev-r1), Hub name, local .jsonl/.parquet file or save_to_disk folder")
    ap.add_argument("--spec-col", action="append", default=[], help="spec column path per --hf (e.g. question[1].content)")
    ap.add_argument("--rtl-col", action="append", default=[], help="RTL column path per --hf (e.g. ground_truth[0].content)")
    ap.add_argument("--top-col", default=None, help="column with the top module name (else the single root)")
    ap.add_argument("--hf-subset", default=None)
    ap.add_argument("--hf-split", default="train")
    ap.add_argument("--hf-license", default=None, help="licence recorded on every task of the dataset")
    ap.add_argument("--folder", action="append", default=[], help="folder of .v/.sv designs")
    ap.add_argument("--eval-tasks", nargs="*", default=[], help="evaluation task JSONL files to decontaminate against")
    ap.add_argument("--out", help="output folder (pool.jsonl, pool_stats.json); keep it out of git")
    ap.add_argument("--limit", type=int, default=None, help="only the first N candidates of each source")
    for name in ("min_tokens", "max_tokens", "max_prompt_tokens", "max_submodules", "workers", "chunk"):
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=DEFAULTS[name])
    ap.add_argument("--sample", type=int, default=None, help="a seeded random sample of N pool designs (cheap: "
                    "only 2N + 8 shuffled candidates go through the compile, teacher and calibration steps)")
    ap.add_argument("--seed", type=int, default=0, help="seed of --sample")
    ap.add_argument("--threshold", type=float, default=DEFAULTS["threshold"])
    ap.add_argument("--sim-timeout", type=float, default=DEFAULTS["sim_timeout_s"])
    ap.add_argument("--tokenizer", default=DEFAULTS["tokenizer"], choices=["smollm2", "chars"])
    ap.add_argument("--no-submodules", action="store_true", help="whole projects only")
    ap.add_argument("--keep-unreached", action="store_true", help="keep designs the teacher reaches nothing on")
    ap.add_argument("--report", metavar="POOL_STATS", help="only write results/corpus.{md,json,png} from a "
                    "pool_stats.json (with --command / --commit of the run) and exit")
    ap.add_argument("--results", default="results")
    ap.add_argument("--command", default="", help="the run's command line, for --report")
    ap.add_argument("--commit", default="", help="the run's commit, for --report")
    args = ap.parse_args(argv)
    if args.report:
        if not Path(args.report).is_file():
            sys.exit(f"error: {args.report}: no such file")
        write_report(args.report, args.results, args.command, args.commit)
        print(f"wrote {args.results}/corpus.md, corpus.json, corpus_tokens.png")
        return
    if not (args.corpus or args.hf or args.folder) or not args.out:
        ap.error("give --out and at least one source: --corpus, --hf or --folder")
    if args.hf and len(args.rtl_col) not in (0, len(args.hf)):
        ap.error("give one --rtl-col per --hf (or none, for presets)")
    import itertools
    lim = (lambda it: itertools.islice(it, args.limit)) if args.limit else (lambda it: it)
    try:
        for p in args.corpus + args.eval_tasks:
            if not Path(p).is_file():
                raise PoolError(f"{p}: no such file")
        sources = [lim(read_corpus(p, not args.no_submodules, args.max_submodules)) for p in args.corpus]
        for i, name in enumerate(args.hf):
            sources.append(lim(read_hf(name, args.spec_col[i] if i < len(args.spec_col) else None,
                                       args.rtl_col[i] if i < len(args.rtl_col) else None, args.hf_subset,
                                       args.hf_split, args.top_col, license=args.hf_license)))
        sources += [lim(read_folder(p)) for p in args.folder]
        stats = build_pool(sources, args.out, args.eval_tasks, min_tokens=args.min_tokens,
                           max_tokens=args.max_tokens, max_prompt_tokens=args.max_prompt_tokens,
                           max_submodules=args.max_submodules, submodules=not args.no_submodules,
                           workers=args.workers, chunk=args.chunk, threshold=args.threshold,
                           sim_timeout_s=args.sim_timeout, tokenizer=args.tokenizer,
                           keep_unreached=args.keep_unreached, sample=args.sample, seed=args.seed)
    except PoolError as e:
        sys.exit(f"error: {e}")
    for src, s in stats["sources"].items():
        print(f"{src}: " + " -> ".join(f"{k} {v}" for k, v in s["funnel"].items())
              + f"; rejected {s['rejected']}")
    print(f"real_designs {stats['real_designs']} {stats['pool_by_kind']}; strong teacher mean coverage "
          f"{stats['teacher']['mean_coverage_pct']}%, pass rate {stats['teacher']['pass_rate_vs_icarus_target']}")


if __name__ == "__main__":
    main()
