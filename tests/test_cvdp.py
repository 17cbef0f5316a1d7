"""Tests of the raw CVDP importer (data/cvdp.py).

Run: python -m pytest -q tests/test_cvdp.py
"""
import json

import pytest

from data import cvdp

RTL = "module mux2 (input a, input b, input s, output y);\n  assign y = s ? b : a;\nendmodule\n"
SUB = "module inv (input a, output y); assign y = ~a; endmodule\n"
TOP = "module top2 (input a, output y); inv u_inv (.a(a), .y(y)); endmodule\n"


def agentic_record(**over):
    rec = {"id": "cvdp_agentic_mux2_0001", "categories": ["cid012", "medium"],
           "system_message": "You are an agent.",
           "prompt": "Write stimulus for mux2. The module is instantiated as `dut_mux`.",
           "context": {"docs/spec.md": "# mux2\nA 2:1 mux.", "rtl/mux2.sv": RTL},
           "patch": {"verif/tb_mux2.sv": "module tb; endmodule\n"},
           "harness": {"files": {"src/.env": "TARGET = 85\nSIM = xrun\n", "src/process.py": "pass\n"}}}
    rec.update(over)
    return rec


def write(tmp_path, recs, name="in.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in recs) + "\n")
    return p


@pytest.mark.needs_shared
def test_real_cid012_record(shared_dir, tmp_path):
    src = shared_dir / "data" / "cvdp_example_cid012.jsonl"
    tasks, rep = cvdp.import_cvdp([src])
    assert len(tasks) == 1 and not rep["errors"]
    t = tasks[0]
    assert t["id"] == "cvdp_copilot_gf_multiplier_0039"
    assert t["dut_module_name"] == "gf_multiplier" and t["dut_instance_name"] == "uut"
    assert [f["name"] for f in t["rtl_files"]] == ["gf_multiplier.sv"]
    assert "module gf_multiplier" in t["rtl_files"][0]["content"]
    assert t["targets"] == [{"inst_name": "uut", "metric": "overall_average", "target_percentage": 90.0}]
    assert t["is_agentic"] is False and t["difficulty"] == "easy"
    assert t["spec_files"][0]["content"].startswith("Develop a testbench")
    assert t["reference_tb"]["name"] == "gf_multiplier_tb.sv"
    assert "'uut'" in t["instruction"] and "'gf_multiplier'" in t["instruction"]
    out = tmp_path / "tasks.jsonl"
    cvdp.main([str(src), "--out", str(out)])
    assert json.loads(out.read_text().splitlines()[0])["id"] == t["id"]


def test_agentic_layout_and_top_choice(tmp_path):
    tasks, _ = cvdp.import_cvdp([write(tmp_path, [agentic_record()])])
    t = tasks[0]
    assert t["is_agentic"] is True and t["dut_module_name"] == "mux2" and t["dut_instance_name"] == "dut_mux"
    assert t["targets"][0] == {"inst_name": "dut_mux", "metric": "overall_average", "target_percentage": 85.0}
    assert [f["name"] for f in t["spec_files"]] == ["spec.md", "spec.md"]
    assert t["reference_tb"]["name"] == "tb_mux2.sv"
    # harness src/ RTL wins over context; the top is the module nobody instantiates
    rec = agentic_record(harness={"files": {"src/.env": "TARGET = 90", "src/inv.sv": SUB, "src/top2.sv": TOP,
                                            "src/process.py": 'assert metrics ["u_top"]["Average"] >= 1'}})
    t = cvdp.import_cvdp([write(tmp_path, [rec])])[0][0]
    assert t["dut_module_name"] == "top2" and t["dut_instance_name"] == "u_top"
    assert sorted(f["name"] for f in t["rtl_files"]) == ["inv.sv", "top2.sv"]


def test_malformed_lines_name_line_and_reason(tmp_path):
    good = agentic_record()
    p = write(tmp_path, [good, "{not json"])
    with pytest.raises(cvdp.CvdpError, match=r"in.jsonl:2: invalid JSON"):
        cvdp.import_cvdp([p])
    bad_target = agentic_record(id="x2", harness={"files": {"src/.env": "TARGET = high"}})
    with pytest.raises(cvdp.CvdpError, match=r":1: bad record x2: TARGET='high' in src/.env is not a number"):
        cvdp.import_cvdp([write(tmp_path, [bad_target])])
    no_inst = agentic_record(id="x3", prompt="Write stimulus for mux2.")
    with pytest.raises(cvdp.CvdpError, match="bad record x3: no instance name"):
        cvdp.import_cvdp([write(tmp_path, [no_inst])])
    no_rtl = agentic_record(id="x4", context={})
    with pytest.raises(cvdp.CvdpError, match="bad record x4: no DUT RTL"):
        cvdp.import_cvdp([write(tmp_path, [no_rtl])])
    tasks, rep = cvdp.import_cvdp([write(tmp_path, [good, "{bad", bad_target])], keep_going=True)
    assert len(tasks) == 1 and len(rep["errors"]) == 2 and ":2:" in rep["errors"][0] and ":3:" in rep["errors"][1]


def test_other_categories_are_counted_not_silent(tmp_path, capsys):
    other = agentic_record(id="y1", categories=["cid013", "easy"])
    p = write(tmp_path, [agentic_record(), other])
    tasks, rep = cvdp.import_cvdp([p])
    assert len(tasks) == 1 and rep["skipped_categories"] == {"cid013": 1}
    cvdp.main([str(p), "--out", str(tmp_path / "o.jsonl")])
    assert "skipped 1 records of category cid013" in capsys.readouterr().out


# --- the public v1.0.2 release: agentic file dicts without a `files` key; `dut = "name"` harnesses ---

def v102_agentic_record(**over):
    """An agentic record as the public v1.0.2 release writes it: context/patch/harness ARE the file dicts."""
    rec = {"id": "cvdp_agentic_mux2_0002", "categories": ["cid012", "hard"],
           "system_message": "You are an agent.",
           "prompt": "Write a stimulus testbench for mux2 in verif/tb_mux2.sv.",
           "context": {"docs/spec.md": "# mux2", "rtl/mux2.sv": RTL},
           "patch": {"verif/tb_mux2.sv": "module tb_mux2;\n  mux2 u_mux (.a(a), .b(b), .s(s), .y(y));\nendmodule\n"},
           "harness": {"docker-compose.yml": "services:\n  test:\n    environment:\n      - TARGET=80\n",
                       "src/process.py": 'dut = "dut_m"\nassert metrics[dut]["Average"] >= float(os.getenv("TARGET"))\n'}}
    rec.update(over)
    return rec


def nonagentic_dut_record(**over):
    rec = {"id": "cvdp_copilot_top2_0007", "categories": ["cid012", "easy"],
           "input": {"prompt": "Develop a testbench that drives top2.", "context": {}},
           "output": {"response": "", "context": {"verif/top2_tb.sv": "module top2_tb; endmodule\n"}},
           "harness": {"files": {"src/.env": "TARGET = 95\nTOPLEVEL = top2\n", "src/inv.sv": SUB, "src/top2.sv": TOP,
                                 "src/process.py": "import os\n\ndut = 'u_top2'\nprint(metrics[dut]['Average'])\n"}}}
    rec.update(over)
    return rec


def test_v102_agentic_layout_file_dicts_and_dut_assignment(tmp_path):
    t = cvdp.import_cvdp([write(tmp_path, [v102_agentic_record()])])[0][0]
    assert t["is_agentic"] is True and t["dut_module_name"] == "mux2"
    assert [f["name"] for f in t["rtl_files"]] == ["mux2.sv"] and t["rtl_files"][0]["content"] == RTL
    assert t["dut_instance_name"] == "dut_m"                      # `dut = "dut_m"` in src/process.py
    assert t["targets"] == [{"inst_name": "dut_m", "metric": "overall_average", "target_percentage": 80.0}]
    assert t["source"]["target_default"] is False                 # TARGET from docker-compose.yml
    assert [f["name"] for f in t["spec_files"]] == ["spec.md", "spec.md"]
    assert t["reference_tb"]["name"] == "tb_mux2.sv"


def test_nonagentic_dut_assignment_form(tmp_path):
    t = cvdp.import_cvdp([write(tmp_path, [nonagentic_dut_record()])])[0][0]
    assert t["is_agentic"] is False and t["dut_module_name"] == "top2" and t["dut_instance_name"] == "u_top2"
    assert t["targets"][0]["target_percentage"] == 95.0 and t["difficulty"] == "easy"
    assert sorted(f["name"] for f in t["rtl_files"]) == ["inv.sv", "top2.sv"]


def test_both_layouts_and_both_instance_forms_in_one_file(tmp_path):
    recs = [agentic_record(),                                               # wrapped agentic, prompt name
            v102_agentic_record(),                                          # v1.0.2 agentic, dut = "..."
            nonagentic_dut_record(),                                        # non-agentic, dut = '...'
            nonagentic_dut_record(id="cvdp_copilot_top2_0008",              # non-agentic, metrics["..."]
                                  harness={"files": {"src/.env": "TARGET = 90", "src/inv.sv": SUB, "src/top2.sv": TOP,
                                                     "src/process.py": 'assert metrics["uut"]["Average"] >= 90'}})]
    tasks, rep = cvdp.import_cvdp([write(tmp_path, recs)])
    assert not rep["errors"]
    assert [(t["is_agentic"], t["dut_instance_name"]) for t in tasks] == [
        (True, "dut_mux"), (True, "dut_m"), (False, "u_top2"), (False, "uut")]


def test_missing_target_gets_the_default_and_instance_from_reference_tb(tmp_path):
    rec = v102_agentic_record(id="cvdp_agentic_mux2_0003", harness={"src/process.py": "pass\n"})
    t = cvdp.import_cvdp([write(tmp_path, [rec])])[0][0]
    assert t["dut_instance_name"] == "u_mux"                     # from `mux2 u_mux (` in the reference tb
    assert t["targets"][0]["target_percentage"] == cvdp.DEFAULT_TARGET == 90.0
    assert t["source"]["target_default"] is True


def test_v102_record_without_rtl_names_the_record(tmp_path):
    rec = v102_agentic_record(id="cvdp_agentic_empty_0001", context={"docs/spec.md": "# nothing"})
    with pytest.raises(cvdp.CvdpError, match=r"in.jsonl:1: bad record cvdp_agentic_empty_0001: no DUT RTL"):
        cvdp.import_cvdp([write(tmp_path, [rec])])


# --- the three ways the release names the checked instance that the importer once rejected ---

def process_py(var, inst):
    """A harness check in the release's shape whose instance sits in a variable that is not `dut`."""
    return (f'import os\n\n{var} = "{inst}"\n\n\ndef test_report(metrics):\n'
            f'    assert float(metrics[{var}]["Average"]) >= float(os.getenv("TARGET"))\n')


def test_harness_variable_other_than_dut_names_the_instance(tmp_path):
    rec = nonagentic_dut_record(id="cvdp_copilot_top2_0009",
                                harness={"files": {"src/.env": "TARGET = 90\n", "src/inv.sv": SUB, "src/top2.sv": TOP,
                                                   "src/process.py": process_py("uut", "uut")}})
    t = cvdp.import_cvdp([write(tmp_path, [rec])])[0][0]
    assert t["dut_instance_name"] == "uut" and t["targets"][0]["inst_name"] == "uut"
    # the variable's value counts, not its name; a stray `dut = ...` elsewhere does not win over the checked one
    rec["harness"]["files"]["src/process.py"] = process_py("checked", "u_top2") + 'dut = "not_this"\n'
    assert cvdp.import_cvdp([write(tmp_path, [rec])])[0][0]["dut_instance_name"] == "u_top2"


def test_toplevel_naming_the_instance_is_read_as_the_instance(tmp_path):
    rec = nonagentic_dut_record(id="cvdp_copilot_top2_0010",
                                input={"prompt": "Develop a testbench that drives top2.", "context": {}},
                                harness={"files": {"src/.env": "TARGET = 92\nTOPLEVEL = u_dut\n", "src/inv.sv": SUB,
                                                   "src/top2.sv": TOP, "src/process.py": "pass\n"}})
    t = cvdp.import_cvdp([write(tmp_path, [rec])])[0][0]
    assert t["dut_module_name"] == "top2"                   # chosen from the RTL: the module nobody instantiates
    assert t["dut_instance_name"] == "u_dut" and t["targets"][0]["target_percentage"] == 92.0
    # a TOPLEVEL that names a module stays the top module
    rec["harness"]["files"]["src/.env"] = "TARGET = 92\nTOPLEVEL = top2\n"
    rec["input"]["prompt"] = "Develop a testbench. The module is instantiated as `dut`."
    t = cvdp.import_cvdp([write(tmp_path, [rec])])[0][0]
    assert (t["dut_module_name"], t["dut_instance_name"]) == ("top2", "dut")


@pytest.mark.parametrize("sentence, inst", [
    ("Instantiate the `mux2` module as `dut_a` and drive every select value.", "dut_a"),
    ("instantiate the module **mux2** as 'dut_b'.", "dut_b"),
    ("Instantiate mux2 as `dut_c`.", "dut_c"),
])
def test_prompt_instantiate_the_module_as_name(tmp_path, sentence, inst):
    rec = v102_agentic_record(id="cvdp_agentic_mux2_0004", prompt="Write a stimulus testbench. " + sentence,
                              patch={}, harness={"src/process.py": "pass\n"})   # no harness name, no reference tb
    t = cvdp.import_cvdp([write(tmp_path, [rec])])[0][0]
    assert t["dut_module_name"] == "mux2" and t["dut_instance_name"] == inst
