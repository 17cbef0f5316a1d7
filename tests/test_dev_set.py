"""data/dev_set.py on small git repositories written here, laid out as VerilogEval v2 and RTLLM v2.0 are.

Run: python -m pytest -q tests/test_dev_set.py
No network. The round trip through ../shared/data/dev_tasks.jsonl skips itself where that file is missing.
"""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from data import dev_set

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "dev_tasks.jsonl"
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": os.devnull}
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git_repo(path, files):
    """A git repository at `path` holding `files` ({relative path: text}); returns its commit."""
    for rel, text in files.items():
        p = path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(text.encode("utf-8"))
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "fixture"]):
        subprocess.run(["git", "-C", str(path), *argv], check=True, env=GIT_ENV, capture_output=True)
    return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], check=True, env=GIT_ENV,
                          capture_output=True, text=True).stdout.strip()


def commit_change(path, rel, text):
    (path / rel).write_text(text)
    subprocess.run(["git", "-C", str(path), "commit", "-q", "-am", "change"], check=True, env=GIT_ENV,
                   capture_output=True)


VE_FILES = {
    "dataset_spec-to-rtl/Prob001_inv_prompt.txt": "\nImplement TopModule: out is not in.\n",
    "dataset_spec-to-rtl/Prob001_inv_ref.sv": "\nmodule RefModule (\n  input in,\n  output out\n);\n  assign out = ~in;\nendmodule\n",
    "dataset_spec-to-rtl/Prob001_inv_test.sv": "module tb(); endmodule\n",
    "dataset_spec-to-rtl/Prob002_nor_prompt.txt": "Implement TopModule: a NOR gate.\n",
    "dataset_spec-to-rtl/Prob002_nor_ref.sv": "module RefModule (input a, b, output y);\r\n  assign y = ~(a | b);\r\nendmodule\r\n",
    "dataset_spec-to-rtl/Prob003_noref_prompt.txt": "A prompt without a reference design.\n",
    "README.md": "fixture\n",
}
COUNTER = ("`timescale 1ns/1ns\nmodule cnt_core (input clk, rst_n, output reg [3:0] q);\n"
           "  always @(posedge clk or negedge rst_n) if (!rst_n) q <= 0; else q <= q + 1;\nendmodule\n"
           "module counter4 (input clk, rst_n, output [3:0] q);\n  cnt_core core (.clk(clk), .rst_n(rst_n), .q(q));\nendmodule\n")
COUNTER_TB = ("`timescale 1ns/1ns\r\nmodule testbench;\r\n  reg clk = 0, rst_n = 0;\r\n  wire [3:0] q;\r\n"
              "  integer fd;\r\n  counter4 u_cnt (.clk(clk), .rst_n(rst_n), .q(q));\r\n  always #5 clk = ~clk;\r\n"
              "  initial begin fd = $fopen(\"expected.txt\", \"r\"); #12 rst_n = 1; #200 $finish; end\r\nendmodule\r\n")
RTLLM_FILES = {
    "Control/Counter/counter4/design_description.txt": "Please act as a professional verilog designer.\n\nA 4-bit counter.\n",
    "Control/Counter/counter4/verified_counter4.v": COUNTER,
    "Control/Counter/counter4/testbench.v": COUNTER_TB,
    "Control/Counter/counter4/expected.txt": "0\n1\n2\n",
    "Control/Counter/counter4/unused.dat": "not named by the testbench\n",
    "Control/Counter/counter4/makefile": "all:\n",
    "Logic/xor2/design_description.txt": "An XOR gate.\n",
    "Logic/xor2/verified_xor_gate.v": "module xor2 (input a, b, output y);\n  assign y = a ^ b;\nendmodule\n",
    "Logic/no_rtl/design_description.txt": "A folder without verified RTL is not a task.\n",
}


@pytest.fixture
def repos(tmp_path):
    ve, rt = tmp_path / "verilog-eval", tmp_path / "RTLLM"
    return ve, git_repo(ve, VE_FILES), rt, git_repo(rt, RTLLM_FILES)


def run_build(tmp_path, ve, ve_commit, rt, rt_commit, *extra):
    out = tmp_path / "dev.jsonl"
    rc = dev_set.main(["build", "--verilog-eval", str(ve), "--verilog-eval-commit", ve_commit, "--rtllm", str(rt),
                       "--rtllm-commit", rt_commit, "--out", str(out), *extra])
    return rc, {t["id"]: t for t in map(json.loads, out.read_text().splitlines())}


def test_builds_every_design_in_the_kit_schema(tmp_path, repos):
    ve, ve_c, rt, rt_c = repos
    rc, tasks = run_build(tmp_path, ve, ve_c, rt, rt_c, "--manifest", "", "--no-check-tb")
    assert rc == 0
    assert sorted(tasks) == ["rtllm_v2/counter4", "rtllm_v2/xor2", "verilog_eval_spec_to_rtl/Prob001_inv",
                             "verilog_eval_spec_to_rtl/Prob002_nor"]
    inv = tasks["verilog_eval_spec_to_rtl/Prob001_inv"]
    assert list(inv) == ["id", "spec_files", "rtl_files", "dut_module_name", "dut_instance_name", "instruction",
                         "targets", "difficulty", "is_agentic", "source", "license"]
    assert inv["spec_files"] == [{"name": "spec.md", "content": VE_FILES["dataset_spec-to-rtl/Prob001_inv_prompt.txt"]}]
    assert inv["rtl_files"] == [{"name": "Prob001_inv_dut.sv",
                                 "content": VE_FILES["dataset_spec-to-rtl/Prob001_inv_ref.sv"].replace("RefModule", "TopModule")}]
    assert inv["dut_module_name"] == "TopModule" and inv["dut_instance_name"] == "uut"
    assert inv["targets"] == [{"inst_name": "uut", "metric": "overall_average", "target_percentage": 90.0}]
    assert inv["source"] == {"benchmark": "VerilogEval-v2 spec-to-rtl", "repo": "NVlabs/verilog-eval", "commit": ve_c,
                             "path": "dataset_spec-to-rtl/Prob001_inv_{prompt.txt,ref.sv,test.sv}"}
    # line endings are kept as stored (the shared file keeps RTLLM's \r\n testbenches)
    assert "\r\n" in tasks["verilog_eval_spec_to_rtl/Prob002_nor"]["rtl_files"][0]["content"]
    cnt = tasks["rtllm_v2/counter4"]
    assert cnt["dut_module_name"] == "counter4"              # the root, not the instantiated core
    assert cnt["dut_instance_name"] == "u_cnt"               # from testbench.v
    assert cnt["reference_tb"] == {"name": "testbench.v", "content": COUNTER_TB}
    assert [f["name"] for f in cnt["aux_files"]] == ["expected.txt"]   # only the data files the testbench names
    assert cnt["source"]["path"] == "Control/Counter/counter4" and cnt["source"]["commit"] == rt_c
    xor = tasks["rtllm_v2/xor2"]
    assert xor["dut_module_name"] == "xor2" and xor["dut_instance_name"] == "uut" and "reference_tb" not in xor
    assert xor["rtl_files"][0]["name"] == "verified_xor_gate.v"


def test_the_manifest_picks_the_tasks_their_order_and_instance_names(tmp_path, repos):
    ve, ve_c, rt, rt_c = repos
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"tasks": {"rtllm_v2/xor2": "dut", "verilog_eval_spec_to_rtl/Prob002_nor": "inst_TopModule",
                                              "rtllm_v2/counter4": "u_cnt"}}))
    rc, tasks = run_build(tmp_path, ve, ve_c, rt, rt_c, "--manifest", str(manifest), "--no-check-tb")
    assert rc == 0 and list(tasks) == ["rtllm_v2/xor2", "verilog_eval_spec_to_rtl/Prob002_nor", "rtllm_v2/counter4"]
    nor = tasks["verilog_eval_spec_to_rtl/Prob002_nor"]
    assert nor["dut_instance_name"] == "inst_TopModule" and nor["targets"][0]["inst_name"] == "inst_TopModule"
    assert "'inst_TopModule'" in nor["instruction"]
    # an id the sources lack is reported and fails the build
    manifest.write_text(json.dumps({"tasks": {"rtllm_v2/xor2": "uut", "rtllm_v2/gone": "uut"}}))
    rc, tasks = run_build(tmp_path, ve, ve_c, rt, rt_c, "--manifest", str(manifest), "--no-check-tb")
    assert rc == 1 and list(tasks) == ["rtllm_v2/xor2"]


def test_the_pinned_commit_is_read_not_the_newest(tmp_path, repos):
    ve, ve_c, rt, rt_c = repos
    commit_change(ve, "dataset_spec-to-rtl/Prob001_inv_prompt.txt", "changed after the pin\n")
    _, tasks = run_build(tmp_path, ve, ve_c, rt, rt_c, "--manifest", "", "--no-check-tb")
    assert tasks["verilog_eval_spec_to_rtl/Prob001_inv"]["spec_files"][0]["content"].startswith("\nImplement")
    with pytest.raises(SystemExit, match="checkout"):
        run_build(tmp_path, ve, "0" * 40, rt, rt_c, "--manifest", "")


def test_a_plain_folder_is_read_as_it_is(tmp_path, repos):
    ve, ve_c, rt, rt_c = repos
    plain = tmp_path / "plain"
    shutil.copytree(rt, plain, ignore=shutil.ignore_patterns(".git"))
    _, tasks = run_build(tmp_path, ve, ve_c, plain, rt_c, "--manifest", "", "--no-check-tb")
    assert tasks["rtllm_v2/xor2"]["rtl_files"][0]["content"] == RTLLM_FILES["Logic/xor2/verified_xor_gate.v"]


@pytest.mark.needs_iverilog
def test_a_reference_testbench_that_does_not_compile_is_dropped(tmp_path, repos):
    ve, ve_c, rt, rt_c = repos
    commit_change(rt, "Control/Counter/counter4/testbench.v", "module testbench;\n  counter4 u_cnt (.clk(1'b0), .nope(q));\n  initial $finish;\nendmodule\n")
    new = subprocess.run(["git", "-C", str(rt), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    _, tasks = run_build(tmp_path, ve, ve_c, rt, new, "--manifest", "", "--sim-workers", "1")
    cnt = tasks["rtllm_v2/counter4"]
    assert "reference_tb" not in cnt and "aux_files" not in cnt and cnt["dut_instance_name"] == "u_cnt"
    _, tasks = run_build(tmp_path, ve, ve_c, rt, rt_c, "--manifest", "", "--sim-workers", "1")
    assert tasks["rtllm_v2/counter4"]["reference_tb"]["content"] == COUNTER_TB      # the original one runs


def shared_rows():
    if not SHARED.is_file():
        pytest.skip(f"{SHARED} is not here (a clone of the kit has no ../shared)")
    return [json.loads(line) for line in SHARED.read_text().splitlines() if line.strip()]


def test_round_trip_of_the_shared_dev_set(tmp_path):
    """Repositories laid out from the shared file's own rows give back those rows, task for task."""
    rows = [r for r in shared_rows() if r["id"].startswith(("verilog_eval", "rtllm_v2/"))]
    ve_files, rt_files = {}, {}
    for r in rows:
        spec, rtl = r["spec_files"][0]["content"], r["rtl_files"][0]
        if r["id"].startswith("verilog_eval"):
            name = r["id"].split("/")[1]
            ve_files[f"dataset_spec-to-rtl/{name}_prompt.txt"] = spec
            ve_files[f"dataset_spec-to-rtl/{name}_ref.sv"] = rtl["content"].replace("TopModule", "RefModule")
        else:
            d = r["source"]["path"]
            rt_files[f"{d}/design_description.txt"] = spec
            rt_files[f"{d}/{rtl['name']}"] = rtl["content"]
            for f in [r.get("reference_tb")] + r.get("aux_files", []):
                if f:
                    rt_files[f"{d}/{f['name']}"] = f["content"]
    ve_c = git_repo(tmp_path / "ve", ve_files)
    rt_c = git_repo(tmp_path / "rt", rt_files)
    out = tmp_path / "dev.jsonl"
    rc = dev_set.main(["build", "--verilog-eval", str(tmp_path / "ve"), "--rtllm", str(tmp_path / "rt"),
                       "--verilog-eval-commit", ve_c, "--rtllm-commit", rt_c, "--no-check-tb", "--out", str(out)])
    assert rc == 0
    built = [json.loads(line) for line in out.read_text().splitlines()]
    for b in built:     # the fixture's commits stand in for the pinned ones
        b["source"]["commit"] = dev_set.VERILOG_EVAL["commit"] if b["id"].startswith("verilog") else dev_set.RTLLM["commit"]
    assert [b["id"] for b in built] == [r["id"] for r in rows] and len(built) == 204
    assert built == rows


def test_the_manifest_matches_the_shared_dev_set(tmp_path):
    shared_rows()
    dev_set.write_manifest(SHARED, tmp_path / "m.json")
    assert json.loads((tmp_path / "m.json").read_text())["tasks"] == dev_set.load_manifest(dev_set.MANIFEST)
    assert {r["source"]["commit"] for r in shared_rows() if r["id"].startswith("rtllm_v2/")} == {dev_set.RTLLM["commit"]}
    assert {r["source"]["commit"] for r in shared_rows()
            if r["id"].startswith("verilog_eval")} == {dev_set.VERILOG_EVAL["commit"]}
