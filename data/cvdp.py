"""Import raw CVDP JSONL files (NVlabs/cvdp_benchmark layouts) into the kit's task schema.

Both CVDP layouts are read:
- non-agentic: {id, categories, input: {prompt, context}, output: {response, context}, harness: {files}}
- agentic:     {id, categories, system_message?, prompt, context, patch, harness}; in the public v1.0.2
               release context/patch/harness are the file dicts themselves ({path: text}); the older
               form wraps them as {files: {path: text}}. Both are read.

For category cid012 (stimulus testbench + coverage):
- DUT RTL: the harness `src/*.sv|*.v` files (else context files under `rtl/`);
- top module: `TOPLEVEL` in `src/.env` when it names a module, else the one module no other RTL module
  instantiates (the prompt breaks ties). Some records put the instance's name in TOPLEVEL (`TOPLEVEL = uut`
  beside `module gf_multiplier`): such a TOPLEVEL is read as the instance name instead;
- target: `TARGET` in `src/.env` (else a `TARGET=` line of any harness file, e.g. docker-compose.yml),
  on the instance the harness checks, as {inst_name, metric: "overall_average", target_percentage};
  a record with the DUT RTL but no TARGET anywhere is imported with CVDP's usual 90 and
  source.target_default = true;
- instance name: from the harness check (`metrics["uut"]["Average"]`; `metrics[v]["Average"]` with
  `v = "uut"` assigned in the same file, whatever the variable's name; or `dut = "uut"` in src/process.py),
  else a TOPLEVEL that names no module, else the prompt ("instantiated as `uut`", "Instantiate the `X` module
  as `uut`", "instance name `uut`"), else the reference testbench's instantiation of the top module;
- spec files: the prompt (as spec.md) plus context `docs/*`; reference testbench: the `verif/` file of
  the solution (output.context or patch), kept as `reference_tb` (never shown to the model).

Every malformed line raises CvdpError naming the file, the line number, the record id and the reason; with
--keep-going the good rows are written and all bad lines are listed. Records of other categories
are counted and reported (use --categories to import them too).

CLI:
  python data/cvdp.py IN.jsonl [IN2.jsonl ...] --out tasks.jsonl [--categories cid012] [--keep-going]
Files written: --out (one task per line, schema of docs/interfaces.md `load_tasks`).
"""
import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

import pyslang

RTL_EXT = (".sv", ".v", ".svh", ".vh")
DEFAULT_TARGET = 90.0       # CVDP's usual overall-average target, for a record whose harness names none


class CvdpError(ValueError):
    """A malformed CVDP record; the message names the file and line."""


def _files_of(obj, where):
    """File name -> text of a files object: {path: text}, or the wrapped form {files: {path: text}}."""
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise ValueError(f"{where} is {type(obj).__name__}, expected an object of file name -> text")
    if isinstance(obj.get("files"), dict):
        obj = obj["files"]
    return {k: v for k, v in obj.items() if isinstance(v, str)}


def _env(text):
    out = {}
    for line in text.splitlines():
        m = re.match(r"\s*([A-Za-z_]\w*)\s*=\s*(.*?)\s*$", line)
        if m:
            out[m.group(1)] = m.group(2).strip().strip('"').strip("'")
    return out


def _modules(rtl_files):
    """(defined module names in order, set of instantiated module names)."""
    defined, used = [], set()
    K = pyslang.syntax.SyntaxKind
    for f in rtl_files:
        tree = pyslang.syntax.SyntaxTree.fromText(f["content"], f["name"])

        def visit(n):
            if n.kind == K.ModuleDeclaration:
                defined.append(n.header.name.valueText)
            elif n.kind == K.HierarchyInstantiation:
                used.add(n.type.valueText)
            return True

        tree.root.visit(visit)
    return defined, used


QUOTE = r"[`'\"*]*"       # the quotes and emphasis a prompt puts around a name: `uut`, 'uut', **uut**


def _instance_name(prompt, harness, top=None, ref_tb="", toplevel=None):
    for text in harness.values():
        m = re.search(r"metrics\s*\[\s*[\"'](\w+)[\"']\s*\]\s*\[\s*[\"']Average", text)
        if m:
            return m.group(1)
    for name, text in harness.items():
        if not name.endswith(".py"):
            continue
        # metrics[v]["Average"] with v = "name" assigned in the file (v is `dut`, `uut`, `inst`, ... in the release)
        for var in re.findall(r"metrics\s*\[\s*([A-Za-z_]\w*)\s*\]\s*\[\s*[\"']Average", text):
            m = re.search(r"^\s*" + var + r"\s*=\s*[\"'](\w+)[\"']", text, re.M)
            if m:
                return m.group(1)
        m = re.search(r"^\s*dut\s*=\s*[\"'](\w+)[\"']", text, re.M)
        if m:
            return m.group(1)
    if toplevel:
        return toplevel
    q = QUOTE
    m = re.search(r"instantiated\s+(?:as|with(?:\s+the)?\s+instance\s+name)\s+" + q + r"(\w+)", prompt, re.I) \
        or re.search(r"instantiate\s+(?:the\s+)?(?:module\s+)?" + q + r"\w+" + q + r"\s+(?:module\s+)?as\s+" + q
                     + r"(\w+)", prompt, re.I) \
        or re.search(r"instance\s+name\s+(?:should\s+be\s+|is\s+|as\s+)?[`'\"*]+(\w+)", prompt, re.I)
    if m:
        return m.group(1)
    m = re.search(r"(?<!module )\b" + re.escape(top) + r"(?:\s*#\s*\((?:[^()]|\([^()]*\))*\))?\s+(\w+)\s*\(", ref_tb) \
        if top and ref_tb else None
    return m.group(1) if m else None


def convert_record(rec, source_path="", line_no=0):
    """One raw CVDP record -> one task dict (raises ValueError with the reason)."""
    if not isinstance(rec, dict):
        raise ValueError("record is not a JSON object")
    for k in ("id", "categories", "harness"):
        if k not in rec:
            raise ValueError(f"missing field '{k}'")
    if "input" in rec:                          # non-agentic layout
        agentic = False
        if not isinstance(rec["input"], dict) or "prompt" not in rec["input"]:
            raise ValueError("field 'input' has no 'prompt'")
        prompt = rec["input"]["prompt"]
        context = _files_of(rec["input"].get("context"), "input.context")
        solution = _files_of((rec.get("output") or {}).get("context"), "output.context")
    elif "prompt" in rec:                       # agentic layout
        agentic = True
        prompt = rec["prompt"]
        context = _files_of(rec.get("context"), "context")
        solution = _files_of(rec.get("patch"), "patch")
    else:
        raise ValueError("neither 'input' (non-agentic) nor 'prompt' (agentic) present")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("empty prompt")
    harness = _files_of(rec["harness"], "harness")
    env = {}
    for name, text in harness.items():
        if Path(name).name == ".env":
            env.update(_env(text))
    if "TARGET" not in env:         # e.g. `- TARGET=90` under environment: in docker-compose.yml
        for text in harness.values():
            m = re.search(r"\bTARGET\s*[=:]\s*[\"']?([0-9.]+)", text)
            if m:
                env["TARGET"] = m.group(1)
                break
    rtl = [{"name": Path(n).name, "content": t} for n, t in sorted(harness.items())
           if n.startswith("src/") and n.endswith(RTL_EXT)]
    if not rtl:
        rtl = [{"name": Path(n).name, "content": t} for n, t in sorted(context.items())
               if n.startswith("rtl/") and n.endswith(RTL_EXT)]
    if not rtl:
        raise ValueError("no DUT RTL: no harness src/*.sv|*.v and no context rtl/* files")
    defined, used = _modules(rtl)
    if not defined:
        raise ValueError("no module declaration in the DUT RTL files")
    top = env.get("TOPLEVEL")
    toplevel_inst = None
    if top and top not in defined:          # it names the instance (`TOPLEVEL = uut`), not a module
        toplevel_inst, top = top, None
    if not top:
        tops = [m for m in defined if m not in used]
        named = [m for m in tops if re.search(r"\b" + re.escape(m) + r"\b", prompt)]
        if len(tops) == 1:
            top = tops[0]
        elif len(named) == 1:
            top = named[0]
        else:
            raise ValueError(f"cannot choose the top module among {tops or defined}")
    target_default = "TARGET" not in env
    try:
        target = float(env.get("TARGET", DEFAULT_TARGET))
    except ValueError:
        raise ValueError(f"TARGET={env['TARGET']!r} in src/.env is not a number")
    spec = [{"name": "spec.md", "content": prompt}] + [
        {"name": Path(n).name, "content": t} for n, t in sorted(context.items()) if n.startswith("docs/")]
    ref = [{"name": Path(n).name, "content": t} for n, t in sorted(solution.items())
           if n.startswith("verif/") and n.endswith(RTL_EXT)]
    inst = _instance_name(prompt, harness, top, ref[0]["content"] if ref else "", toplevel_inst)
    if not inst:
        raise ValueError("no instance name in the harness (metrics[...] or dut = ...), the prompt, "
                         "nor the reference testbench")
    cats = rec["categories"] if isinstance(rec["categories"], list) else [rec["categories"]]
    diff = next((c for c in cats if c in ("easy", "medium", "hard")), None)
    return {
        "id": rec["id"],
        "spec_files": spec,
        "rtl_files": rtl,
        "dut_module_name": top,
        "dut_instance_name": inst,
        "instruction": f"The top module is '{top}'. Instantiate it in the testbench with the instance name '{inst}'.",
        "targets": [{"inst_name": inst, "metric": "overall_average", "target_percentage": target}],
        "difficulty": diff,
        "is_agentic": agentic,
        "reference_tb": ref[0] if ref else None,
        "aux_files": None,
        "source": {"benchmark": "CVDP", "path": Path(source_path).name, "line": line_no,
                   "categories": cats, "target_default": target_default},
    }


def import_cvdp(paths, categories=("cid012",), keep_going=False):
    """Read raw CVDP JSONL files -> (tasks, report). report = {skipped_categories: Counter, errors: [str]}.

    Raises CvdpError on the first malformed line unless keep_going (then errors are collected).
    """
    tasks, errors, skipped = [], [], Counter()
    for path in paths:
        with open(path) as f:
            for no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    cats = rec.get("categories") if isinstance(rec, dict) else None
                    if categories and isinstance(cats, list) and not set(cats) & set(categories):
                        skipped[",".join(c for c in cats if c.startswith("cid")) or "?"] += 1
                        continue
                    tasks.append(convert_record(rec, path, no))
                except (json.JSONDecodeError, ValueError, KeyError, TypeError) as e:
                    kind = "invalid JSON" if isinstance(e, json.JSONDecodeError) else "bad record"
                    rid = rec.get("id") if not isinstance(e, json.JSONDecodeError) and isinstance(rec, dict) else None
                    msg = f"{path}:{no}: {kind}" + (f" {rid}" if rid else "") + f": {e}"
                    if not keep_going:
                        raise CvdpError(msg) from None
                    errors.append(msg)
    ids = Counter(t["id"] for t in tasks)
    dup = [i for i, c in ids.items() if c > 1]
    if dup:
        msg = f"duplicate task ids: {', '.join(dup[:5])}"
        if not keep_going:
            raise CvdpError(msg)
        errors.append(msg)
    return tasks, {"skipped_categories": skipped, "errors": errors}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("inputs", nargs="+", help="raw CVDP JSONL files")
    ap.add_argument("--out", required=True, help="output task JSONL")
    ap.add_argument("--categories", default="cid012", help="comma list of categories to import ('' = all)")
    ap.add_argument("--keep-going", action="store_true", help="write the good rows, list every bad line")
    args = ap.parse_args(argv)
    cats = tuple(c for c in args.categories.split(",") if c)
    try:
        tasks, rep = import_cvdp(args.inputs, cats, args.keep_going)
    except CvdpError as e:
        sys.exit(f"error: {e}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for t in tasks:
            f.write(json.dumps(t) + "\n")
    print(f"wrote {len(tasks)} tasks to {args.out}")
    for c, n in rep["skipped_categories"].items():
        print(f"skipped {n} records of category {c} (not in --categories {args.categories})")
    for e in rep["errors"]:
        print(f"error: {e}", file=sys.stderr)
    if rep["errors"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
