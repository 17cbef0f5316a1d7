"""The training corpus (../shared/data/corpus/*.jsonl.gz), rebuilt from public repositories through a manifest.

    python data/corpus_manifest.py manifest                                  # shared corpus -> data/corpus_manifest.json.gz
    python data/corpus_manifest.py build --sources ~/src/corpus_repos        # clones named owner__name or owner/name
    python data/corpus_manifest.py build --repo olofk/serv=~/src/serv --repo YosysHQ/picorv32=~/src/picorv32
    python data/corpus_manifest.py build --fetch --cache runs/corpus_src     # git clone + checkout at the pinned commits
    python data/corpus_manifest.py build --sources DIR --compare ../shared/data/corpus   # report equal/differing/missing

A clone of the kit has no ../shared/data/corpus (third-party data stays outside the repository). The committed
manifest data/corpus_manifest.json.gz holds pointers only, no third-party text: per record its id, corpus file,
source, licence, top module, repository, pinned commit, provenance path, and for each RTL file its key in the
record, its path in the repository and the sha256 of its text; plus how the spec is made (a rule name, the
spec's sha256, and whether the rule reproduces it from the repository files). Every record's licence
(Apache-2.0, MIT, ISC, SHL-0.51, CVDP's Apache-2.0/CC-BY-4.0) allows redistributing such a pointer; the licence is
still recorded per record, and `build` copies it into the rebuilt record as the shared file has it.

Where a record's files are in its repository (README.md of the shared corpus gives the rules):
  - tinytapeout (tinytapeout.jsonl.gz): provenance.path is the project folder; an rtl_files key is relative to it
    (repository path = path/key). Spec rule `tinytapeout-sky25a`: "# <title>", the info.yaml description,
    docs/info.md, "## Pinout" with the non-empty info.yaml pins; `tinytapeout-tt05`: title and description, then
    the info.yaml documentation fields how_it_works / how_to_test / external_hw as "## " sections, then the pins
    from documentation inputs/outputs/bidirectional. These rules follow the corpus README; whether they give the
    shared specs byte for byte cannot be checked without the upstream repositories, so build compares each
    rebuilt spec with the manifest's sha256 and reports how many match.
  - library (modules.jsonl.gz): rtl_files keys are repository paths; provenance.path is the file F defining the top
    module M. Spec rule `library-header` (library_spec below) rebuilds the spec from F's text alone: the
    Repository/File/Module lines, the comment lines before `module M` without licence/copyright lines,
    commented-out code or banner lines, and the module header with its blank and fold-marker lines dropped, cut
    at 3000 characters. It reproduces most shared specs exactly; the manifest marks each one (`exact`).
  - cvdp (cvdp_other.jsonl.gz): provenance.path is "<JSONL file in kmcho2019/cvdp_explorer>#L<line>"; an rtl_files
    key is the base name of a file of that datapoint (context, solution or harness). Spec rule `cvdp-prompt-docs`:
    the prompt, then the datapoint's docs/*.md files, joined by blank lines (an approximation, checked by sha256).

build: a source is a folder of clones (--sources), a mapping --repo OWNER/NAME=PATH, or --fetch (a plain
`git clone https://github.com/OWNER/NAME` + `git checkout COMMIT` into --cache). A git checkout is read at the
pinned commit (git cat-file; the work tree is not touched); a plain folder is read as it is (its commit cannot be
checked). Files are read as bytes and decoded as UTF-8, line endings kept. A file whose sha256 differs from the
manifest, or that is missing, skips its record with a one-line warning; skipped and unsourced records are
counted. Writes OUT/{tinytapeout,modules,cvdp_other}.jsonl.gz in the shared schema and key order, records in
manifest order. `--compare` reports, per file, records equal / differing (by field) / missing; exit status 1 when
any differs or is missing.
"""
import argparse
import gzip
import hashlib
import json
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "corpus"
MANIFEST = ROOT / "data" / "corpus_manifest.json.gz"
CORPUS_FILES = ("tinytapeout", "modules", "cvdp_other")
RECORD_KEYS = ("id", "source", "license", "spec", "rtl_files", "top_module", "provenance")
SPEC_LIMIT, SPEC_CUT = 3000, 2985          # library specs over 3000 characters are cut at a line end before 2985
TRUNCATED = "[truncated]"


def fail(msg):
    raise SystemExit(f"corpus_manifest: {msg}")


def sha256(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def progress(it, **kw):
    try:
        from tqdm import tqdm
    except ImportError:        # tqdm is in requirements.txt; the loop works without it
        return it
    return tqdm(it, leave=False, file=sys.stderr, **kw)


# ---------------------------------------------------------------- library specs (rule library-header)

# A comment line that names a licence or copyright is left out of the spec (the shared corpus drops them).
LICENCE_LINE = re.compile(r"copyright|licen[cs]e|spdx|permission is hereby|warrant|all rights reserved|"
                          r"this file is part of|unless required by applicable law|redistribution|"
                          r"provided that the following|merchantab|liabil", re.I)
COMMENTED_CODE = re.compile(r"\s*`")                 # e.g. a commented-out `timescale
BANNER = re.compile(r"[\s=\-*/#_~+]*")               # ////, ----, ==== lines separate paragraphs
FOLD = re.compile(r"\s*(\{\{\{|\}\}\})\s*")           # ZipCPU's editor fold markers
TOKEN = re.compile(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"", re.S)


def _mask(text):
    """text with comments and strings blanked (same length), so keywords inside them are not seen."""
    return TOKEN.sub(lambda t: " " * len(t.group(0)), text)


def _header_span(text, top):
    """(start, end) of `module top ... ;` (the header up to its first ';' outside parentheses), or None."""
    masked = _mask(text)
    m = re.search(r"\bmodule\s+" + re.escape(top) + r"\b", masked)
    if not m:
        return None
    depth = 0
    for i in range(m.start(), len(masked)):
        c = masked[i]
        depth += (c == "(") - (c == ")")
        if c == ";" and depth == 0:
            return m.start(), i + 1
    return m.start(), len(text)


def _paragraphs(lines):
    out, cur = [], []
    for line in lines + [""]:
        if line.strip():
            cur.append(line)
        elif cur:
            out.append(cur)
            cur = []
    return out


def _comment_text(pre):
    """The comments of `pre` as the spec shows them: each // line is its own paragraph, a /* */ comment keeps its
    blank-line paragraphs; licence lines (//) or paragraphs (/* */), banners and commented-out code dropped."""
    paras, group = [], []

    def flush():
        for para in _paragraphs(group):
            paras.extend(l.rstrip() for l in para
                         if not FOLD.fullmatch(l) and not LICENCE_LINE.search(l) and not BANNER.fullmatch(l))
        group.clear()

    last = 0
    for t in TOKEN.finditer(pre):
        s = t.group(0)
        if s.startswith('"'):
            continue
        if s.startswith("//"):
            gap = pre[last:t.start()]
            if group and (gap.count("\n") != 1 or gap.strip()):
                flush()
            line = re.sub(r"^/+", "", s)
            if not COMMENTED_CODE.match(line):
                group.append(line)
        else:
            flush()
            lines = []
            for j, line in enumerate(s[2:-2].split("\n")):
                line = (line.strip() if j else line.rstrip())
                line = re.sub(r"^\*+", "", line).rstrip()
                lines.append("" if BANNER.fullmatch(line) or COMMENTED_CODE.match(line) else line)
            for para in _paragraphs(lines):
                if not LICENCE_LINE.search("\n".join(para)):
                    paras.append("\n".join(l for l in para if not FOLD.fullmatch(l)))
        last = t.end()
    flush()
    return "\n\n".join(p for p in paras if p.strip()).strip()


def library_spec(repo, path, top, text):
    """The spec of library module `top` defined in file `path` (text `text`) of `repo`, as the corpus makes it."""
    head = f"Repository: {repo}\nFile: {path}\nModule: {top}\n\n"
    span = _header_span(text, top)
    if span is None:
        return head.rstrip("\n")
    start, end = span
    line_start = text.rfind("\n", 0, start) + 1
    if not text[line_start:start].strip():
        start = line_start
    pre = text[:start]
    k = pre.rfind("endmodule")
    comments = _comment_text(pre[k + len("endmodule"):] if k >= 0 else pre)
    header = [l.rstrip() for l in text[start:end].split("\n")
              if l.strip() and not re.fullmatch(r"\s*//\s*(\{\{\{|\}\}\})?\s*", l)]
    if not re.search(r"\b(input|output|inout)\b", _mask(text[start:end])):      # non-ANSI: add the declarations
        stop = text.find("endmodule", end)
        header += [l.rstrip() for l in text[end:stop if stop >= 0 else len(text)].split("\n")
                   if re.match(r"\s*(input|output|inout)\b", l)]
    spec = head + (comments + "\n\n" if comments else "") + "Interface (verbatim from the source):\n" + \
        "\n".join(header) + "\n"
    if len(spec) > SPEC_LIMIT:
        spec = spec[:SPEC_CUT]
        spec = spec[:spec.rfind("\n") + 1] + TRUNCATED
    return spec


# ---------------------------------------------------------------- TinyTapeout and CVDP specs

def tinytapeout_spec(info, info_md=None):
    """Spec of a TinyTapeout project from its info.yaml (parsed) and, for sky25a, docs/info.md (None for tt05)."""
    project, doc = info.get("project") or {}, info.get("documentation") or {}
    title = str(project.get("title") or doc.get("title") or "").strip()
    desc = str(project.get("description") or doc.get("description") or "").strip()
    parts = [f"# {title}", desc]
    if info_md is not None:
        parts.append(info_md.strip())
        pins = [f"- {k}: {str(v).strip()}" for k, v in (info.get("pinout") or {}).items()
                if v is not None and str(v).strip()]
    else:
        for key, name in (("how_it_works", "How it works"), ("how_to_test", "How to test"),
                          ("external_hw", "External hardware")):
            text = str(doc.get(key) or "").strip()
            if text:
                parts.append(f"## {name}\n{text}")
        pins = [f"- {pre}[{i}]: {str(v).strip()}" for pre, key in (("ui", "inputs"), ("uo", "outputs"),
                                                                    ("uio", "bidirectional"))
                for i, v in enumerate(doc.get(key) or []) if v is not None and str(v).strip()]
    if pins:
        parts.append("## Pinout\n" + "\n".join(pins))
    return "\n\n".join(p for p in parts if p)


def _files_of(obj):
    """{path: text} of a CVDP files object: {path: text} or {files: {path: text}}."""
    if not isinstance(obj, dict):
        return {}
    if isinstance(obj.get("files"), dict):
        obj = obj["files"]
    return {k: v for k, v in obj.items() if isinstance(v, str)}


def cvdp_files(dp):
    """Every file of a CVDP datapoint, solution first: [(path, text)] (both layouts, data/cvdp.py's docstring)."""
    inp, out = dp.get("input") or {}, dp.get("output") or {}
    objs = [out.get("context"), dp.get("patch"), inp.get("context"), dp.get("context"), dp.get("harness")]
    return [kv for o in objs for kv in _files_of(o).items()]


def cvdp_spec(dp):
    prompt = (dp.get("input") or {}).get("prompt") or dp.get("prompt") or ""
    context = _files_of((dp.get("input") or {}).get("context")) or _files_of(dp.get("context"))
    docs = [context[k] for k in sorted(context) if re.fullmatch(r"docs/[^/]+\.md", k)]
    return "\n\n".join(t.strip() for t in [prompt, *docs] if t.strip())


# ---------------------------------------------------------------- manifest

def spec_rule(rec):
    if rec["source"] == "library":
        return "library-header"
    if rec["source"] == "cvdp":
        return "cvdp-prompt-docs"
    return "tinytapeout-tt05" if rec["id"].startswith("tinytapeout/tt05/") else "tinytapeout-sky25a"


def repo_path(rec, key):
    """Where rtl_files[key] of a record lies in its repository (CVDP: the datapoint's JSONL line)."""
    path = rec["provenance"]["path"]
    if rec["source"] == "tinytapeout":
        return f"{path}/{key}"
    if rec["source"] == "library":
        return key
    return path


def read_corpus(folder, names=CORPUS_FILES):
    folder = Path(folder)
    if not folder.is_dir():
        fail(f"{folder} is not a folder (the shared corpus is ../shared/data/corpus; a clone does not have it)")
    out = {}
    for name in names:
        path = folder / f"{name}.jsonl.gz"
        if not path.is_file():
            continue
        rows = []
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    missing = [k for k in RECORD_KEYS if k not in row]
                except json.JSONDecodeError as e:
                    fail(f"{path}:{n}: not JSON ({e.msg})")
                if missing:
                    fail(f"{path}:{n}: record lacks {missing}")
                rows.append(row)
        out[name] = rows
    if not out:
        fail(f"{folder} holds none of {[n + '.jsonl.gz' for n in names]}")
    return out


def manifest_record(name, rec):
    prov = rec["provenance"]
    for key in rec["rtl_files"]:
        if key.startswith("/") or ".." in key.split("/"):
            fail(f"{rec['id']}: rtl_files key {key!r} is not a relative path")
    rule = spec_rule(rec)
    spec = {"rule": rule, "sha256": sha256(rec["spec"]), "exact": None}
    if rule == "library-header":
        text = rec["rtl_files"].get(prov["path"])
        spec["exact"] = text is not None and \
            library_spec(prov["repo"], prov["path"], rec["top_module"], text) == rec["spec"]
    elif rule == "tinytapeout-sky25a":
        spec["from"] = ["info.yaml", "docs/info.md"]
    elif rule == "tinytapeout-tt05":
        spec["from"] = ["info.yaml"]
    return {"id": rec["id"], "file": name, "source": rec["source"], "license": rec["license"],
            "top_module": rec["top_module"], "repo": prov["repo"], "commit": prov["commit"], "path": prov["path"],
            "files": [[key, repo_path(rec, key), sha256(text)] for key, text in rec["rtl_files"].items()],
            "spec": spec}


def make_manifest(corpus):
    records = [manifest_record(name, rec) for name, rows in corpus.items()
               for rec in progress(rows, desc=f"manifest {name}")]
    ids = Counter(r["id"] for r in records)
    dup = [i for i, n in ids.items() if n > 1]
    if dup:
        fail(f"ids not unique: {dup[:3]}")
    repos = defaultdict(set)
    for r in records:
        repos[r["repo"]].add(r["commit"])
    return {"about": "pointers to the training corpus's records in public repositories at pinned commits "
                     "(data/corpus_manifest.py; no third-party text)",
            "repos": {k: sorted(v) for k, v in sorted(repos.items())},
            "records": records}


def spec_counts(records):
    """{(file, rule): [exact, total]} over manifest records; exact is None where it cannot be checked here."""
    out = defaultdict(lambda: [0, 0])
    for r in records:
        c = out[(r["file"], r["spec"]["rule"])]
        c[0] += bool(r["spec"]["exact"])
        c[1] += 1
    return dict(out)


def write_manifest(corpus_dir=SHARED, out=MANIFEST):
    man = make_manifest(read_corpus(corpus_dir))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(man, separators=(",", ":")).encode()
    with open(out, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as g:   # mtime 0: same bytes each run
        g.write(data)
    print(f"corpus_manifest: {len(man['records'])} records of {len(man['repos'])} repositories -> {out} "
          f"({out.stat().st_size} bytes)")
    for (name, rule), (exact, total) in sorted(spec_counts(man["records"]).items()):
        how = f"{exact} reproduced exactly from the record's files" if rule == "library-header" else \
            "not checkable here (needs the upstream repository files); build checks them by sha256"
        print(f"corpus_manifest:   {name} {rule}: {total} specs, {how}")
    return man


def load_manifest(path):
    path = Path(path)
    if not path.is_file():
        fail(f"no manifest at {path} (write one with: python data/corpus_manifest.py manifest)")
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        man = json.loads(raw)
        man["records"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f"{path} is not a corpus manifest ({type(e).__name__}: {e})")
    return man


# ---------------------------------------------------------------- sources

class GitTree:
    """Files of a git checkout at one commit, read through one `git cat-file --batch` process."""

    def __init__(self, path, commit):
        self.path, self.commit = Path(path), commit
        ok = subprocess.run(["git", "-C", str(path), "cat-file", "-e", f"{commit}^{{commit}}"],
                            capture_output=True).returncode == 0
        self.proc = subprocess.Popen(["git", "-C", str(path), "cat-file", "--batch"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) if ok else None

    def read(self, rel):
        if self.proc is None:
            return None
        self.proc.stdin.write(f"{self.commit}:{rel}\n".encode())
        self.proc.stdin.flush()
        head = self.proc.stdout.readline().split()
        if len(head) != 3:                                      # "<name> missing" / "ambiguous"
            return None
        data = self.proc.stdout.read(int(head[2]))
        self.proc.stdout.read(1)
        return data if head[1] == b"blob" else None

    def close(self):
        if self.proc:
            self.proc.stdin.close()
            self.proc.wait()


class PlainTree:
    """A folder read as it is (its commit cannot be checked)."""

    def __init__(self, path):
        self.path = Path(path)

    def read(self, rel):
        p = self.path / rel
        return p.read_bytes() if p.is_file() else None

    def close(self):
        pass


def run_git(argv):
    print("corpus_manifest: " + " ".join(argv))
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode:
        fail(f"{' '.join(argv)} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")


def fetch(repo, commit, cache):
    """A clone of github.com/<repo> at `commit` under `cache` (reused when already there)."""
    dest = Path(cache) / repo.replace("/", "__")
    if not (dest / ".git").is_dir():
        dest.parent.mkdir(parents=True, exist_ok=True)
        run_git(["git", "clone", "--quiet", f"https://github.com/{repo}", str(dest)])
    run_git(["git", "-C", str(dest), "checkout", "--quiet", commit])
    return dest


def source_paths(args, repos):
    """{repo: folder} for the repositories that have a source."""
    out = {}
    if args.sources:
        base = Path(args.sources).expanduser()
        if not base.is_dir():
            fail(f"--sources {base} is not a folder")
        for repo in repos:
            for cand in (base / repo.replace("/", "__"), base / repo):
                if cand.is_dir():
                    out[repo] = cand
                    break
    for item in args.repo or []:
        name, sep, path = item.partition("=")
        if not sep or name.count("/") != 1 or not path:
            fail(f"--repo {item!r}: expected OWNER/NAME=PATH")
        if not Path(path).expanduser().is_dir():
            fail(f"--repo {item!r}: {path} is not a folder")
        out[name] = Path(path).expanduser()
    if args.fetch:
        for repo, commits in repos.items():
            if repo not in out:
                out[repo] = fetch(repo, commits[0], args.cache)
    return out


def open_tree(repo, path, commit):
    if (Path(path) / ".git").exists():
        tree = GitTree(path, commit)
        if tree.proc is None:
            print(f"corpus_manifest: warning: {repo}: commit {commit[:12]} is not in {path}; its records are skipped")
        return tree
    print(f"corpus_manifest: {repo}: {path} is not a git checkout: read as it is, commit {commit[:7]} not checked")
    return PlainTree(path)


# ---------------------------------------------------------------- build

class Skip(Exception):
    """A record that cannot be rebuilt: the message is its one-line reason."""


def _text(tree, rel, what):
    data = tree.read(rel)
    if data is None:
        raise Skip(f"{what} {rel} not found")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise Skip(f"{what} {rel} is not UTF-8")


class Builder:
    def __init__(self, trees):
        self.trees = trees
        self.lines = {}          # (repo, JSONL path) -> its lines, read once

    def datapoint(self, m):
        tree = self.trees[m["repo"]]
        path, _, line = m["path"].rpartition("#L")
        if (m["repo"], path) not in self.lines:
            self.lines[(m["repo"], path)] = _text(tree, path, "CVDP file").split("\n")
        lines = self.lines[(m["repo"], path)]
        if not line.isdigit() or not 0 < int(line) <= len(lines):
            raise Skip(f"{m['path']}: no such line")
        try:
            return json.loads(lines[int(line) - 1])
        except json.JSONDecodeError:
            raise Skip(f"{m['path']}: not a JSON line")

    def record(self, m):
        tree = self.trees[m["repo"]]
        rtl, dp = {}, None
        for key, rel, digest in m["files"]:
            if m["source"] == "cvdp":
                dp = dp or self.datapoint(m)
                cands = [t for p, t in cvdp_files(dp) if p.rsplit("/", 1)[-1] == key]
                text = next((t for t in cands if sha256(t) == digest), None)
                if text is None:
                    raise Skip(f"{key} {'changed (sha256 differs)' if cands else 'not in the datapoint'}")
            else:
                text = _text(tree, rel, "file")
                if sha256(text) != digest:
                    raise Skip(f"{rel} changed (sha256 differs from the manifest)")
            rtl[key] = text
        rule = m["spec"]["rule"]
        if rule == "library-header":
            spec = library_spec(m["repo"], m["path"], m["top_module"], rtl.get(m["path"], ""))
        elif rule == "cvdp-prompt-docs":
            spec = cvdp_spec(dp or self.datapoint(m))
        else:
            import yaml
            try:
                info = yaml.safe_load(_text(tree, f"{m['path']}/info.yaml", "file")) or {}
            except yaml.YAMLError:
                raise Skip(f"{m['path']}/info.yaml is not YAML")
            md = _text(tree, f"{m['path']}/docs/info.md", "file") if rule == "tinytapeout-sky25a" else None
            spec = tinytapeout_spec(info, md)
        return {"id": m["id"], "source": m["source"], "license": m["license"], "spec": spec, "rtl_files": rtl,
                "top_module": m["top_module"],
                "provenance": {"repo": m["repo"], "commit": m["commit"], "path": m["path"]}}


def write_jsonl_gz(path, rows):
    with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as g:
        for r in rows:
            g.write((json.dumps(r) + "\n").encode())


def build(args):
    man = load_manifest(args.manifest)
    records = [r for r in man["records"] if not args.only or r["file"] in args.only]
    repos = {}
    for r in records:
        repos.setdefault(r["repo"], [r["commit"]])
    paths = source_paths(args, repos)
    if not paths:
        fail("no source for any repository: give --sources DIR, --repo OWNER/NAME=PATH or --fetch")
    trees = {repo: open_tree(repo, path, repos[repo][0]) for repo, path in paths.items() if repo in repos}
    builder = Builder(trees)
    built, counts = defaultdict(list), Counter()
    spec_ok = Counter()
    try:
        for m in progress(records, desc="build"):
            if m["repo"] not in trees:
                counts["no source"] += 1
                continue
            try:
                rec = builder.record(m)
            except Skip as e:
                counts["skipped"] += 1
                print(f"corpus_manifest: warning: {m['id']}: {e}; skipped")
                continue
            built[m["file"]].append(rec)
            counts["built"] += 1
            spec_ok[(m["file"], m["spec"]["rule"], sha256(rec["spec"]) == m["spec"]["sha256"])] += 1
    finally:
        for t in trees.values():
            t.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in CORPUS_FILES:
        if name in built:
            write_jsonl_gz(out / f"{name}.jsonl.gz", built[name])
    print(f"corpus_manifest: {counts['built']} of {len(records)} records -> {out}; "
          f"{counts['skipped']} skipped (changed or missing files), {counts['no source']} without a source")
    for name, rule in sorted({(f, r) for f, r, _ in spec_ok}):
        same, total = spec_ok[(name, rule, True)], spec_ok[(name, rule, True)] + spec_ok[(name, rule, False)]
        print(f"corpus_manifest:   {name} {rule}: {same} of {total} specs equal the manifest's sha256")
    rc = 0
    if args.compare:
        rc = compare(built, args.compare, only=set(built) if not args.only else set(args.only))
    return rc or (1 if counts["skipped"] else 0)


def compare(built, where, only=None):
    """Print, per corpus file, how many built records equal / differ from (by field) / are missing in the
    shared ones; 0 when all are equal and none is missing."""
    where = Path(where)
    if where.is_dir():
        shared = read_corpus(where, [n for n in CORPUS_FILES if not only or n in only])
    elif where.is_file() and where.name.endswith(".jsonl.gz"):
        name = where.name[:-len(".jsonl.gz")]
        shared = read_corpus(where.parent, [name])
    else:
        fail(f"--compare {where}: not a corpus folder or a .jsonl.gz file")
    bad = 0
    for name, rows in shared.items():
        mine = {r["id"]: r for r in built.get(name, [])}
        equal, differ, fields = 0, 0, Counter()
        for row in rows:
            r = mine.get(row["id"])
            if r is None:
                continue
            keys = [k for k in RECORD_KEYS if r.get(k) != row.get(k)]
            fields.update(keys)
            equal += not keys
            differ += bool(keys)
        missing = sum(row["id"] not in mine for row in rows)
        extra = len(set(mine) - {row["id"] for row in rows})
        bad += differ + missing + extra
        by = ", ".join(f"{k} {n}" for k, n in fields.most_common())
        print(f"corpus_manifest: compare {name}: {equal} equal, {differ} differ{f' ({by})' if by else ''}, "
              f"{missing} missing of {len(rows)}" + (f", {extra} not in the shared file" if extra else ""))
    return 1 if bad else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("manifest", help="write the manifest from the shared corpus files")
    m.add_argument("--corpus", default=str(SHARED), help="folder of the corpus .jsonl.gz files")
    m.add_argument("--out", default=str(MANIFEST))
    b = sub.add_parser("build", help="rebuild the corpus records from the repositories")
    b.add_argument("--manifest", default=str(MANIFEST))
    b.add_argument("--sources", default=None, help="folder of clones named OWNER__NAME or OWNER/NAME")
    b.add_argument("--repo", action="append", metavar="OWNER/NAME=PATH", help="one repository's checkout or folder")
    b.add_argument("--fetch", action="store_true",
                   help="git clone each repository without a source from github.com into --cache, at its commit")
    b.add_argument("--cache", default=str(ROOT / "runs" / "corpus_src"))
    b.add_argument("--only", action="append", choices=CORPUS_FILES, help="rebuild only this corpus file")
    b.add_argument("--out", default=str(ROOT / "runs" / "corpus"), help="folder for the .jsonl.gz files")
    b.add_argument("--compare", default=None, help="shared corpus folder or one .jsonl.gz to compare with")
    args = p.parse_args(argv)
    if args.cmd == "manifest":
        write_manifest(args.corpus, args.out)
        return 0
    return build(args)


if __name__ == "__main__":
    sys.exit(main())
