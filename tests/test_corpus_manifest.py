"""data/corpus_manifest.py on small git repositories written here, laid out as the corpus's sources are.

Run: python -m pytest -q tests/test_corpus_manifest.py
No network. Tests reading ../shared/data/corpus skip themselves where it is missing (a clone has none).
"""
import gzip
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from data import corpus_manifest as cm

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "corpus"
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": os.devnull}
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(path, *argv):
    return subprocess.run(["git", "-C", str(path), *argv], check=True, env=GIT_ENV, capture_output=True,
                          text=True).stdout.strip()


def git_repo(path, files):
    """A git repository at `path` holding `files` ({relative path: text}); returns its commit."""
    write_files(path, files)
    git(path, "init", "-q")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "fixture")
    return git(path, "rev-parse", "HEAD")


def write_files(path, files):
    for rel, text in files.items():
        p = path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(text.encode("utf-8"))


# ---------------------------------------------------------------- fixture sources

TT_RTL = {"src/project.v": "`include \"defs.vh\"\r\nmodule tt_um_demo (input [7:0] ui_in, output [7:0] uo_out);\r\n"
                           "  assign uo_out = ~ui_in;\r\nendmodule\r\n",
          "src/defs.vh": "`define W 8\n"}
TT_INFO = ("project:\n  title: \"Demo inverter\"\n  author: \"t\"\n  description: \"Inverts the inputs\"\n"
           "  top_module: \"tt_um_demo\"\n  source_files:\n    - \"project.v\"\npinout:\n  ui[0]: \"a\"\n"
           "  ui[1]: \"\"\n  uo[0]: \"not a\"\n")
TT_MD = "<!--- template note -->\n\n## How it works\n\nIt inverts.\n"
TT_SPEC = ("# Demo inverter\n\nInverts the inputs\n\n<!--- template note -->\n\n## How it works\n\nIt inverts.\n\n"
           "## Pinout\n- ui[0]: a\n- uo[0]: not a")
TT05_INFO = ("project:\n  source_files:\n    - top.v\n  top_module: \"tt_um_old\"\ndocumentation:\n"
             "  title: \"Old counter\"\n  description: \"Counts.\"\n  how_it_works: |\n      Adds one.\n"
             "  how_to_test: \"\"\n  external_hw: |\n      A LED.\n  inputs:\n    - enable\n    - none\n"
             "  outputs:\n    - bit 0\n  bidirectional:\n    - \"\"\n")
TT05_SPEC = "# Old counter\n\nCounts.\n\n## How it works\nAdds one.\n\n## External hardware\nA LED.\n\n" \
            "## Pinout\n- ui[0]: enable\n- ui[1]: none\n- uo[0]: bit 0"
TT05_RTL = {"src/top.v": "module tt_um_old (input clk, output reg q);\n  always @(posedge clk) q <= ~q;\nendmodule\n"}
LIB_TOP = ("/*\n\nCopyright (c) 2024 Someone\n\nPermission is hereby granted, free of charge.\n\n*/\n\n"
           "// Language: Verilog 2001\n\n`timescale 1ns / 1ps\n\n/*\n * Two-stage synchroniser\n */\n"
           "module sync2 #(\n    parameter W = 1   // width\n)\n(\n    input  wire         clk,\n\n"
           "    input  wire [W-1:0] d,\n    output wire [W-1:0] q\n);\n\nflop #(.W(W)) f0 (.clk(clk), .d(d), .q(m));\n"
           "flop #(.W(W)) f1 (.clk(clk), .d(m), .q(q));\nendmodule\n")
LIB_SPEC = ("Repository: acme/rtl-lib\nFile: rtl/sync2.v\nModule: sync2\n\nLanguage: Verilog 2001\n\n"
            " Two-stage synchroniser\n\nInterface (verbatim from the source):\nmodule sync2 #(\n"
            "    parameter W = 1   // width\n)\n(\n    input  wire         clk,\n    input  wire [W-1:0] d,\n"
            "    output wire [W-1:0] q\n);\n")
LIB_FLOP = "module flop #(parameter W = 1) (input clk, input [W-1:0] d, output reg [W-1:0] q);\n" \
           "  always @(posedge clk) q <= d;\nendmodule\n"
LIB_FLOP_SPEC = ("Repository: acme/rtl-lib\nFile: rtl/flop.v\nModule: flop\n\nInterface (verbatim from the source):\n"
                 "module flop #(parameter W = 1) (input clk, input [W-1:0] d, output reg [W-1:0] q);\n")
CVDP_DP = {"id": "cvdp_copilot_demo_0001", "categories": ["cid006"],
           "input": {"prompt": "What does the `adder` module compute?",
                     "context": {"rtl/adder.sv": "module adder(input a, b, output y); assign y = a ^ b; endmodule\n",
                                 "docs/adder.md": "# Adder\nOne bit.\n"}},
           "output": {"response": "", "context": {}}, "harness": {"files": {"src/.env": "TOPLEVEL = adder\n"}}}
CVDP_SPEC = "What does the `adder` module compute?\n\n# Adder\nOne bit."
CVDP_JSONL = json.dumps({"id": "other"}) + "\n" + json.dumps(CVDP_DP) + "\n"
CVDP_FILE = "data/raw/cvdp_v1.0.2_nonagentic_code_comprehension.jsonl"


@pytest.fixture
def world(tmp_path):
    """Fixture repositories under tmp_path/src (named owner__name) and the corpus they give, under tmp_path/corpus."""
    src = tmp_path / "src"
    c_tt = git_repo(src / "TinyTapeout__tinytapeout-sky-25a-sources",
                    {**{f"tt_um_demo/{k}": v for k, v in TT_RTL.items()}, "tt_um_demo/info.yaml": TT_INFO,
                     "tt_um_demo/docs/info.md": TT_MD, "tt_um_demo/test/tb.v": "module tb; endmodule\n"})
    c_tt05 = git_repo(src / "TinyTapeout" / "tinytapeout-05-reharden",         # the owner/name layout
                      {**{f"tt_um_old/{k}": v for k, v in TT05_RTL.items()}, "tt_um_old/info.yaml": TT05_INFO})
    c_lib = git_repo(src / "acme__rtl-lib", {"rtl/sync2.v": LIB_TOP, "rtl/flop.v": LIB_FLOP, "README": "lib\n"})
    c_cvdp = git_repo(src / "kmcho2019__cvdp_explorer", {CVDP_FILE: CVDP_JSONL})
    tt_lic = "Apache-2.0"
    corpus = {
        "tinytapeout": [
            {"id": "tinytapeout/sky25a/tt_um_demo", "source": "tinytapeout", "license": tt_lic, "spec": TT_SPEC,
             "rtl_files": TT_RTL, "top_module": "tt_um_demo",
             "provenance": {"repo": "TinyTapeout/tinytapeout-sky-25a-sources", "commit": c_tt, "path": "tt_um_demo"}},
            {"id": "tinytapeout/tt05/tt_um_old", "source": "tinytapeout", "license": tt_lic, "spec": TT05_SPEC,
             "rtl_files": TT05_RTL, "top_module": "tt_um_old",
             "provenance": {"repo": "TinyTapeout/tinytapeout-05-reharden", "commit": c_tt05, "path": "tt_um_old"}}],
        "modules": [
            {"id": "acme/rtl-lib/rtl/sync2.v#sync2", "source": "library", "license": "MIT", "spec": LIB_SPEC,
             "rtl_files": {"rtl/sync2.v": LIB_TOP, "rtl/flop.v": LIB_FLOP}, "top_module": "sync2",
             "provenance": {"repo": "acme/rtl-lib", "commit": c_lib, "path": "rtl/sync2.v"}},
            {"id": "acme/rtl-lib/rtl/flop.v#flop", "source": "library", "license": "MIT", "spec": LIB_FLOP_SPEC,
             "rtl_files": {"rtl/flop.v": LIB_FLOP}, "top_module": "flop",
             "provenance": {"repo": "acme/rtl-lib", "commit": c_lib, "path": "rtl/flop.v"}}],
        "cvdp_other": [
            {"id": "cvdp_copilot_demo_0001", "source": "cvdp",
             "license": "Apache-2.0 (code) / CC-BY-4.0 (text); CVDP datapoint, Copyright 2025 NVIDIA Corporation",
             "spec": CVDP_SPEC, "rtl_files": {"adder.sv": CVDP_DP["input"]["context"]["rtl/adder.sv"]},
             "top_module": "adder",
             "provenance": {"repo": "kmcho2019/cvdp_explorer", "commit": c_cvdp, "path": f"{CVDP_FILE}#L2"}}]}
    cdir = tmp_path / "corpus"
    cdir.mkdir()
    for name, rows in corpus.items():
        cm.write_jsonl_gz(cdir / f"{name}.jsonl.gz", rows)
    manifest = tmp_path / "m.json.gz"
    cm.write_manifest(cdir, manifest)
    return {"src": src, "corpus": corpus, "cdir": cdir, "manifest": manifest, "out": tmp_path / "out"}


def built(out):
    return {p.name[:-len(".jsonl.gz")]: [json.loads(l) for l in gzip.open(p, "rt")] for p in sorted(out.glob("*.jsonl.gz"))}


def run_build(w, *extra):
    return cm.main(["build", "--manifest", str(w["manifest"]), "--out", str(w["out"]), *extra])


def test_manifest_holds_pointers_that_build_reads_back(world, capsys):
    man = cm.load_manifest(world["manifest"])
    assert [r["id"] for r in man["records"]] == [r["id"] for rows in world["corpus"].values() for r in rows]
    sync2 = next(r for r in man["records"] if r["id"].endswith("#sync2"))
    assert sync2["files"][0] == ["rtl/sync2.v", "rtl/sync2.v", cm.sha256(LIB_TOP)]
    assert sync2["spec"] == {"rule": "library-header", "sha256": cm.sha256(LIB_SPEC), "exact": True}
    tt = man["records"][0]
    assert tt["files"][0][:2] == ["src/project.v", "tt_um_demo/src/project.v"] and tt["license"] == "Apache-2.0"
    assert man["records"][-1]["files"] == [["adder.sv", f"{CVDP_FILE}#L2", cm.sha256(CVDP_DP["input"]["context"]["rtl/adder.sv"])]]
    assert LIB_TOP not in gzip.decompress(world["manifest"].read_bytes()).decode()     # no third-party text
    rc = run_build(world, "--sources", str(world["src"]), "--compare", str(world["cdir"]))
    assert rc == 0
    assert built(world["out"]) == world["corpus"]              # ids, rtl text (\r\n kept), specs, provenance commits
    out = capsys.readouterr().out
    assert "compare modules: 2 equal, 0 differ, 0 missing of 2" in out
    assert "tinytapeout tinytapeout-tt05: 1 of 1 specs equal the manifest's sha256" in out


def test_repo_mappings_and_the_pinned_commit(world, tmp_path):
    lib = world["src"] / "acme__rtl-lib"
    (lib / "rtl" / "flop.v").write_text("module flop; endmodule\n")     # changed after the pin
    git(lib, "commit", "-q", "-am", "later")
    moved = tmp_path / "elsewhere"
    shutil.move(str(lib), str(moved))
    rc = run_build(world, "--sources", str(world["src"]), "--repo", f"acme/rtl-lib={moved}", "--only", "modules")
    assert rc == 0
    assert built(world["out"])["modules"] == world["corpus"]["modules"]


def test_a_changed_file_is_caught_by_its_hash_and_its_record_skipped(world, tmp_path, capsys):
    plain = tmp_path / "plain"                      # a plain folder is read as it is, so the edit is seen
    shutil.copytree(world["src"] / "acme__rtl-lib", plain, ignore=shutil.ignore_patterns(".git"))
    (plain / "rtl" / "sync2.v").write_text(LIB_TOP + "// one more line\n")
    rc = run_build(world, "--repo", f"acme/rtl-lib={plain}", "--compare", str(world["cdir"] / "modules.jsonl.gz"))
    out = capsys.readouterr().out
    assert rc == 1
    assert "warning: acme/rtl-lib/rtl/sync2.v#sync2: rtl/sync2.v changed (sha256 differs from the manifest); skipped" in out
    assert "1 of 5 records" in out and "1 skipped" in out and "3 without a source" in out
    assert [r["id"] for r in built(world["out"])["modules"]] == ["acme/rtl-lib/rtl/flop.v#flop"]
    assert "compare modules: 1 equal, 0 differ, 1 missing of 2" in out


def test_a_commit_missing_from_a_checkout_skips_its_records(world, tmp_path, capsys):
    other = tmp_path / "other"
    git_repo(other, {"rtl/flop.v": LIB_FLOP})
    rc = run_build(world, "--repo", f"acme/rtl-lib={other}", "--only", "modules")
    out = capsys.readouterr().out
    assert rc == 1 and "is not in" in out and "2 skipped" in out


def test_bad_input_is_one_clear_line(world, tmp_path):
    with pytest.raises(SystemExit, match="not a folder"):
        cm.main(["manifest", "--corpus", str(tmp_path / "nowhere"), "--out", str(tmp_path / "m.json.gz")])
    with pytest.raises(SystemExit, match="--sources .* is not a folder"):
        run_build(world, "--sources", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit, match="expected OWNER/NAME=PATH"):
        run_build(world, "--repo", "acme-rtl-lib")
    with pytest.raises(SystemExit, match="no source for any repository"):
        run_build(world, "--sources", str(tmp_path / "corpus"))
    (tmp_path / "bad.json.gz").write_bytes(b"not gzip")
    with pytest.raises(SystemExit, match="is not a corpus manifest"):
        cm.main(["build", "--manifest", str(tmp_path / "bad.json.gz"), "--sources", str(world["src"])])


# ---------------------------------------------------------------- the shared corpus

def shared_corpus():
    if not (SHARED / "modules.jsonl.gz").is_file():
        pytest.skip(f"{SHARED} is not here (a clone of the kit has no ../shared)")
    return cm.read_corpus(SHARED)


def test_the_committed_manifest_matches_the_shared_corpus(tmp_path):
    corpus = shared_corpus()
    fresh = cm.make_manifest(corpus)
    assert fresh == cm.load_manifest(cm.MANIFEST)
    assert cm.MANIFEST.stat().st_size < 1_000_000
    counts = cm.spec_counts(fresh["records"])
    assert counts[("modules", "library-header")] == [1658, 1663]      # the rest differ; build reports them


def test_round_trip_of_the_shared_corpus_laid_out_as_folders(tmp_path, capsys):
    """The shared records' own files, written where the manifest says they lie, give back those records (specs
    aside where their rule needs upstream files: TinyTapeout's info.yaml, CVDP's datapoints)."""
    corpus = shared_corpus()
    src = tmp_path / "src"
    for rows in corpus.values():
        for r in rows:
            if r["source"] != "library":
                continue
            root = src / r["provenance"]["repo"].replace("/", "__")
            for key, text in r["rtl_files"].items():
                p = root / cm.repo_path(r, key)
                if not p.is_file():
                    p.parent.mkdir(parents=True, exist_ok=True)
                    p.write_bytes(text.encode("utf-8"))
    out = tmp_path / "out"
    rc = cm.main(["build", "--sources", str(src), "--only", "modules", "--out", str(out),
                  "--compare", str(SHARED / "modules.jsonl.gz")])
    text = capsys.readouterr().out
    assert "compare modules: 1658 equal, 5 differ (spec 5), 0 missing of 1663" in text and rc == 1
