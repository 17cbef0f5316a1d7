"""The dev set's VerilogEval v2 and RTLLM v2.0 tasks, built from the public repositories.

    python data/dev_set.py build                                  # clone both at the pinned commits -> runs/dev_tasks.jsonl
    python data/dev_set.py build --verilog-eval ~/src/verilog-eval --rtllm ~/src/RTLLM   # local checkouts
    python data/dev_set.py build --compare ../shared/data/dev_tasks.jsonl                # check against a copy
    python data/dev_set.py manifest ../shared/data/dev_tasks.jsonl                       # rewrite the manifest

Every number the kit reports on "the dev set" is measured on ../shared/data/dev_tasks.jsonl, which a clone of
the kit does not have. This script rebuilds 204 of its 206 tasks (the 2 CVDP examples are not rebuilt; get them
with data/cvdp.py from the CVDP release) with the same ids, RTL, specs, instance names, reference testbenches
and targets, from:
  - NVlabs/verilog-eval (MIT) at VERILOG_EVAL's commit: dataset_spec-to-rtl/ProbNNN_name_{prompt.txt,ref.sv}.
    The spec is prompt.txt; the RTL is ref.sv with its module renamed RefModule -> TopModule (the name the
    prompt asks for), in ProbNNN_name_dut.sv.
  - hkust-zhiyao/RTLLM (MIT) at RTLLM's commit: every folder with a design_description.txt (the spec) and a
    verified_*.v (the RTL; the top is its one module no other module instantiates). testbench.v becomes the
    task's reference_tb when it compiles and runs with the design in the kit's scorer (sim.py; without
    iverilog, or with --no-check-tb, every testbench is kept), and the data files it names become aux_files.

Which designs are tasks, and each task's instance name, come from data/dev_manifest.json (written from the
shared file by `manifest`): the shared file leaves out two VerilogEval problems, and its VerilogEval instance
names (uut, dut, inst_TopModule) follow no rule the sources give. `build --all` builds every design found,
named by the manifest where it has the id, else `uut` (RTLLM: the instance in testbench.v).

A source is a git URL or a local git checkout (cloned into a temporary folder and checked out at the pinned
commit, or at --*-commit), or a plain folder (read as it is; its commit cannot be checked, and the output's
`source.commit` is the pinned one). Files are read as bytes and decoded as UTF-8 with their line endings kept.
Writes: one JSON object per line (the task schema of sim.load_tasks), in manifest order.
"""
import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VERILOG_EVAL = {"benchmark": "VerilogEval-v2 spec-to-rtl", "repo": "NVlabs/verilog-eval",
                "commit": "c498220d0a52248f8e3fdffe279075215bde2da6", "url": "https://github.com/NVlabs/verilog-eval"}
RTLLM = {"benchmark": "RTLLM v2.0", "repo": "hkust-zhiyao/RTLLM",
         "commit": "41b26896e33b536940116a975626455eed3de65e", "url": "https://github.com/hkust-zhiyao/RTLLM"}
MANIFEST = ROOT / "data" / "dev_manifest.json"
TARGET = 90.0          # CVDP's default overall-average target; data/teacher.py calibrate adds Icarus ones
LICENSE = "MIT"        # both repositories' LICENSE
VE_DIR = "dataset_spec-to-rtl"
RTLLM_SKIP = {"design_description.txt", "makefile", "testbench.v"}   # not aux files


def read_text(path):
    """A file's text as stored: UTF-8, line endings untouched (Path.read_text would turn \\r\\n into \\n)."""
    return Path(path).read_bytes().decode("utf-8")


def checkout(src, commit, workdir):
    """A folder holding `src` at `commit`. src: a git URL or a local git checkout (cloned, then checked out),
    or a plain local folder (returned as it is)."""
    local = Path(src).expanduser()
    if local.is_dir() and not (local / ".git").exists():
        print(f"dev_set: {src} is not a git checkout: read as it is, commit {commit[:7]} not checked")
        return local
    dest = Path(tempfile.mkdtemp(prefix="dev_set_", dir=workdir))
    cmd = [["git", "clone", "--quiet", str(local if local.is_dir() else src), str(dest)],
           ["git", "-C", str(dest), "checkout", "--quiet", commit]]
    for argv in cmd:
        print("dev_set: " + " ".join(argv))
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"dev_set: {' '.join(argv)} failed: {r.stderr.strip()}")
    return dest


def task_row(tid, spec, rtl_name, rtl, top, inst, source):
    """One task in the shared file's key order."""
    return {"id": tid, "spec_files": [{"name": "spec.md", "content": spec}],
            "rtl_files": [{"name": rtl_name, "content": rtl}],
            "dut_module_name": top, "dut_instance_name": inst,
            "instruction": f"The top module is '{top}'. Instantiate it in the testbench with the instance name '{inst}'.",
            "targets": [{"inst_name": inst, "metric": "overall_average", "target_percentage": TARGET}],
            "difficulty": None, "is_agentic": False, "source": source, "license": LICENSE}


def verilog_eval_tasks(root, commit, instances):
    """{id: task} for every ProbNNN_name with a prompt.txt and a ref.sv."""
    out = {}
    for prompt in sorted((Path(root) / VE_DIR).glob("Prob*_prompt.txt")):
        name = prompt.name[:-len("_prompt.txt")]
        ref = prompt.with_name(f"{name}_ref.sv")
        if not ref.is_file():
            continue
        tid = f"verilog_eval_spec_to_rtl/{name}"
        rtl = re.sub(r"\bRefModule\b", "TopModule", read_text(ref))
        source = {k: VERILOG_EVAL[k] for k in ("benchmark", "repo")} | {
            "commit": commit, "path": f"{VE_DIR}/{name}_{{prompt.txt,ref.sv,test.sv}}"}
        out[tid] = task_row(tid, read_text(prompt), f"{name}_dut.sv", rtl, "TopModule",
                            instances.get(tid, "uut"), source)
    return out


def top_module(rtl_name, rtl, folder):
    """The one defined module no other module instantiates (the folder's name breaks a tie)."""
    from data.cvdp import _modules
    defined, used = _modules([{"name": rtl_name, "content": rtl}])
    roots = [m for m in defined if m not in used]
    if len(roots) == 1:
        return roots[0]
    if folder in roots:
        return folder
    raise ValueError(f"{rtl_name}: cannot tell the top module among {roots or defined}")


def rtllm_tasks(root, commit, instances):
    """{id: task} for every folder with a design_description.txt and one verified_*.v."""
    from data.cvdp import _instance_name
    out = {}
    root = Path(root)
    for desc in sorted(root.rglob("design_description.txt")):
        folder = desc.parent
        rtls = sorted(folder.glob("verified_*.v"))
        if len(rtls) != 1:
            print(f"dev_set: {folder.relative_to(root)}: {len(rtls)} verified_*.v files, skipped")
            continue
        tid = f"rtllm_v2/{folder.name}"
        rtl = read_text(rtls[0])
        top = top_module(rtls[0].name, rtl, folder.name)
        tb_path = folder / "testbench.v"
        tb = read_text(tb_path) if tb_path.is_file() else ""
        inst = instances.get(tid) or (_instance_name("", {}, top, tb) if tb else None) or "uut"
        source = {k: RTLLM[k] for k in ("benchmark", "repo")} | {
            "commit": commit, "path": folder.relative_to(root).as_posix()}
        task = task_row(tid, read_text(desc), rtls[0].name, rtl, top, inst, source)
        if tb:
            task["reference_tb"] = {"name": "testbench.v", "content": tb}
            aux = [p for p in sorted(folder.iterdir()) if p.is_file() and p.name not in RTLLM_SKIP
                   and p not in rtls and p.name in tb]
            if aux:
                task["aux_files"] = [{"name": p.name, "content": read_text(p)} for p in aux]
        out[tid] = task
    return out


def check_reference_tbs(tasks, workers=2):
    """Drop each reference testbench that does not compile and run with its design (sim.py status ok)."""
    import sim
    import simpool
    with_tb = [t for t in tasks if "reference_tb" in t]
    jobs = [sim.job_from_task(t, t["reference_tb"]["content"]) for t in with_tb]
    for task, res in zip(with_tb, simpool.simulate_many(jobs, workers=workers, verbose=False)):
        if res.status != "ok":
            print(f"dev_set: {task['id']}: reference testbench dropped ({res.status})")
            del task["reference_tb"]
            task.pop("aux_files", None)


def load_manifest(path):
    return json.loads(Path(path).read_text())["tasks"] if path else {}


def build(args):
    instances = load_manifest(args.manifest)
    work = Path(tempfile.mkdtemp(prefix="dev_set_"))
    try:
        found = {}
        if args.verilog_eval:
            commit = args.verilog_eval_commit or VERILOG_EVAL["commit"]
            found |= verilog_eval_tasks(checkout(args.verilog_eval, commit, work), commit, instances)
        if args.rtllm:
            commit = args.rtllm_commit or RTLLM["commit"]
            found |= rtllm_tasks(checkout(args.rtllm, commit, work), commit, instances)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ids = list(found) if args.all or not instances else [i for i in instances if i in found]
    missing = [] if args.all else [i for i in instances if i not in found and i.startswith(tuple(args.prefixes))]
    tasks = [found[i] for i in ids]
    if args.check_tb and shutil.which("iverilog"):
        check_reference_tbs(tasks, args.sim_workers)
    elif args.check_tb:
        print("dev_set: no iverilog on PATH: every reference testbench kept unchecked")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    print(f"dev_set: {len(tasks)} tasks -> {out}" + (f"; {len(missing)} manifest ids not found: {missing[:5]}"
                                                       if missing else ""))
    if args.compare:
        return compare(tasks, args.compare)
    return 1 if missing else 0


def compare(tasks, path):
    """Print how the built tasks differ from a task file's rows of the same ids; 0 when none does."""
    theirs = {t["id"]: t for t in map(json.loads, Path(path).read_text().splitlines()) if t.get("id")}
    differ = 0
    for t in tasks:
        other = theirs.get(t["id"])
        keys = ["(missing)"] if other is None else [k for k in t.keys() | other.keys() if t.get(k) != other.get(k)]
        if keys:
            differ += 1
            print(f"dev_set: {t['id']} differs from {path} in {sorted(keys)}")
    print(f"dev_set: {len(tasks) - differ} of {len(tasks)} tasks equal their row in {path}")
    return 1 if differ else 0


def write_manifest(path, out=MANIFEST):
    """data/dev_manifest.json from a task file: its VerilogEval and RTLLM ids, in order, with instance names."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    tasks = {r["id"]: r["dut_instance_name"] for r in rows if r["id"].startswith(("verilog_eval", "rtllm_v2/"))}
    Path(out).write_text(json.dumps({
        "about": f"ids and instance names of the dev set's VerilogEval v2 / RTLLM v2.0 tasks "
                 f"(data/dev_set.py manifest {Path(path).name})",
        "sources": {s["repo"]: s["commit"] for s in (VERILOG_EVAL, RTLLM)},
        "tasks": tasks}, indent=0) + "\n")
    print(f"dev_set: {len(tasks)} ids -> {out}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the tasks from the two repositories")
    b.add_argument("--verilog-eval", default=VERILOG_EVAL["url"], help="git URL, local checkout or folder ('' = skip)")
    b.add_argument("--rtllm", default=RTLLM["url"], help="git URL, local checkout or folder ('' = skip)")
    b.add_argument("--verilog-eval-commit", default=None, help=f"default: the pinned {VERILOG_EVAL['commit'][:7]}")
    b.add_argument("--rtllm-commit", default=None, help=f"default: the pinned {RTLLM['commit'][:7]}")
    b.add_argument("--manifest", default=str(MANIFEST), help="ids and instance names ('' = every design, default names)")
    b.add_argument("--all", action="store_true", help="every design found, not only the manifest's")
    b.add_argument("--no-check-tb", dest="check_tb", action="store_false",
                   help="keep every reference testbench without simulating it")
    b.add_argument("--sim-workers", type=int, default=2)
    b.add_argument("--out", default=str(ROOT / "runs" / "dev_tasks.jsonl"))
    b.add_argument("--compare", default=None, help="a task file to compare the built rows with (exit 1 on a difference)")
    m = sub.add_parser("manifest", help="rewrite data/dev_manifest.json from a task file")
    m.add_argument("tasks")
    m.add_argument("--out", default=str(MANIFEST))
    args = p.parse_args(argv)
    if args.cmd == "manifest":
        write_manifest(args.tasks, args.out)
        return 0
    args.prefixes = [p for p, src in (("verilog_eval", args.verilog_eval), ("rtllm_v2/", args.rtllm)) if src]
    return build(args)


if __name__ == "__main__":
    sys.exit(main())
