"""Tests of the real-design pool importer (data/design_pool.py): every source kind on fixtures the test
writes itself, the `datasets` loader on a local dataset in the authors' columns, and each filter's
rejection reason (known answers).

Run: python -m pytest -q tests/test_design_pool.py
"""
import gzip
import json

import pytest

from data import design_pool as dp

COUNTER = """// A 4-bit counter with enable.
module counter4 (input clk, input rst_n, input en, output reg [3:0] q);
  always @(posedge clk or negedge rst_n)
    if (!rst_n) q <= 4'd0;
    else if (en) q <= q + 4'd1;
endmodule
"""
# the same design with other comments and spacing: a duplicate after normalisation
COUNTER_DUP = "/* copy */ module counter4 (input clk, input rst_n, input en,\n output reg [3:0] q);\n" \
              "always @(posedge clk or negedge rst_n) if (!rst_n) q <= 4'd0; else if (en) q <= q + 4'd1;\nendmodule\n"
SUB = """`include "defs.vh"
// Inverts its input when `inv` is high.
module cond_inv (input inv, input [`W-1:0] a, output [`W-1:0] y);
  assign y = inv ? ~a : a;
endmodule
"""
TOP = """module proj_top (input clk, input rst, input [7:0] d, output reg [7:0] q);
  wire [7:0] t;
  cond_inv u_inv (.inv(d[0]), .a(d), .y(t));
  always @(posedge clk) if (rst) q <= 8'd0; else q <= t;
endmodule
"""
MUX = "module mux2w (input [3:0] a, input [3:0] b, input s, output [3:0] y);\n  assign y = s ? b : a;\nendmodule\n"
REAL_PORT = "module realin (input clk, input real x, output reg y);\n  always @(posedge clk) y <= x > 1.0;\nendmodule\n"
NO_INPUT = "module osc (output reg y);\n  initial y = 1'b0;\n  always #5 y = ~y;\nendmodule\n"
INT_ONLY = "module pass_int (input int a, output int b);\n  assign b = a;\nendmodule\n"
PARSE_ERR = "module broken (input a, output y);\n  assign y = a +;\nendmodule\n"
UNDEF_CELL = "module uses_cell (input a, output y);\n  sky130_fd_sc_hd__inv_1 u0 (.A(a), .Y(y));\nendmodule\n"
TWO_TOPS = MUX + "module other_top (input a, output y);\n  assign y = ~a;\nendmodule\n"
SHIFT = ("module zyx_quokka (input wombat_clk, input [5:0] kiwi_bits, output reg [5:0] emu_hold);\n"
         + "".join(f"  localparam [5:0] PLATYPUS_{i} = 6'd{i * 7 % 64};\n" for i in range(15))
         + "  always @(posedge wombat_clk) emu_hold <= kiwi_bits ^ PLATYPUS_3;\nendmodule\n")
TINY = "module t;\nendmodule\n"
BIG = "module big (input [7:0] a, output [7:0] y);\n" + "".join(
    f"  wire [7:0] w{i} = a ^ 8'd{i};\n" for i in range(60)) + "  assign y = w0;\nendmodule\n"


def rec(rid, files, top=None, source="library", spec="A design."):
    return {"id": rid, "source": source, "license": "MIT", "spec": spec, "rtl_files": files,
            "top_module": top, "provenance": {"repo": "me/fixtures", "commit": "0" * 40, "path": rid}}


def write_corpus(path, recs):
    with gzip.open(path, "wt") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    return path


KNOBS = dict(tokenizer="chars", min_tokens=20, max_tokens=400, workers=2, chunk=8)


# --- readers -------------------------------------------------------------------------------------

def test_get_path_known_answers():
    row = {"question": [{"role": "system", "content": "sys"}, {"role": "user", "content": "spec!"}],
           "ground_truth": json.dumps([{"content": "module m; endmodule"}])}
    assert dp.get_path(row, "question[1].content") == "spec!"
    assert dp.get_path(row, "ground_truth[0].content") == "module m; endmodule"   # JSON text decoded
    assert dp.get_path({"a": {"b": [1, 2, 3]}}, "a.b[-1]") == 3
    with pytest.raises(KeyError, match=r"no 'x' at question\[0\].content"):
        dp.get_path(row, "question[0].content.x")
    with pytest.raises(dp.PoolError, match="bad column path"):
        dp.get_path(row, "question[1]!")


def test_corpus_reader_and_submodules(tmp_path):
    p = write_corpus(tmp_path / "proj.jsonl.gz", [rec(
        "tinytapeout/x/proj", {"src/inc/defs.vh": "`define W 8\n", "src/cond_inv.v": SUB, "src/top.v": TOP},
        top="proj_top", source="tinytapeout", spec="# Project\nDocs of the project.")])
    cands = list(dp.read_corpus(p))
    assert [(c["id"], c["kind"], c["top"]) for c in cands] == [
        ("tinytapeout/x/proj", "project", "proj_top"), ("tinytapeout/x/proj#cond_inv", "submodule", "cond_inv")]
    sub = cands[1]
    assert sub["spec"].startswith("# Project\nDocs of the project.")
    assert "// Inverts its input when `inv` is high." in sub["spec"] and "module cond_inv (input inv" in sub["spec"]
    top, files = dp.design_files(sub)
    # only the sub-module's closure; the included header is inlined in place of the `include line
    assert top == "cond_inv" and [f["name"] for f in files] == ["cond_inv.v"]
    assert files[0]["content"] == SUB.replace('`include "defs.vh"', '// begin included file defs.vh\n'
                                                                     '`define W 8\n// end included file defs.vh')
    top, files = dp.design_files(cands[0])
    assert top == "proj_top" and [f["name"] for f in files] == ["cond_inv.v", "top.v"]
    assert list(dp.read_corpus(p, submodules=False))[0]["kind"] == "project"
    assert len(list(dp.read_corpus(p, submodules=False))) == 1


def test_design_files_includes_and_name_clash():
    cand = {"id": "x", "top": "m", "files": [("inc/d.vh", "`define W 4\n"), ("inc/unused.vh", "`define U 1\n"),
                                            ("m.v", '`include "inc/d.vh"\n`include "missing.vh"\n'
                                                    'module m(input [`W-1:0] a); endmodule\n')]}
    top, files = dp.design_files(cand)
    assert [f["name"] for f in files] == ["unused.vh", "m.v"]         # a header nobody includes stays, first
    assert files[1]["content"].startswith('// begin included file d.vh\n`define W 4\n// end included file d.vh\n'
                                          '`include "missing.vh"\n')
    clash = {"id": "y", "top": "m", "files": [("a/s.v", "module s1; endmodule\n"), ("b/s.v", "module s2; endmodule\n"),
                                             ("m.v", "module m(input a); s1 u1(); s2 u2(); endmodule\n")]}
    with pytest.raises(ValueError) as e:
        dp.design_files(clash)
    assert e.value.args[0] == "bad_file_names"


def test_folder_reader(tmp_path):
    root = tmp_path / "designs"
    root.mkdir()
    (root / "counter4.v").write_text(COUNTER)
    (root / "counter4.md").write_text("Counts when enabled.")
    (root / "mux2w.sv").write_text(MUX)
    (root / "proj").mkdir()
    (root / "proj" / "top.v").write_text(TOP)
    (root / "proj" / "cond_inv.v").write_text(SUB)
    (root / "proj" / "defs.vh").write_text("`define W 8\n")
    (root / "proj" / "README.md").write_text("# proj\nThe project.")
    cands = {c["id"]: c for c in dp.read_folder(root)}
    assert sorted(cands) == ["designs/counter4", "designs/mux2w", "designs/proj"]
    assert cands["designs/counter4"]["spec"] == "Counts when enabled."
    assert cands["designs/mux2w"]["spec"] == ""
    assert cands["designs/proj"]["spec"].startswith("# proj")
    top, files = dp.design_files(cands["designs/proj"])
    assert top == "proj_top" and [f["name"] for f in files] == ["cond_inv.v", "top.v"]
    with pytest.raises(dp.PoolError, match="not a folder"):
        list(dp.read_folder(tmp_path / "nope"))


def authors_rows():
    """Rows in the columns of zhuyaoyu/CodeV-R1-dataset (subset sft)."""
    return [{"question": [{"role": "system", "content": "You are a Verilog designer."},
                          {"role": "user", "content": "Design a 4-bit counter with enable."}],
             "ground_truth": [{"role": "assistant", "content": "```verilog\n" + COUNTER + "```"}]},
            {"question": [{"role": "system", "content": "s"}, {"role": "user", "content": "A 2:1 mux of 4-bit words."}],
             "ground_truth": [{"role": "assistant", "content": MUX}]}]


def test_hf_loader_local_jsonl_parquet_and_saved(tmp_path):
    import datasets
    rows = authors_rows()
    jl = tmp_path / "codev.jsonl"
    jl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "codev.parquet"))
    ds.save_to_disk(str(tmp_path / "codev_saved"))
    for src in (jl, tmp_path / "codev.parquet", tmp_path / "codev_saved"):
        cands = list(dp.read_hf(str(src), "question[1].content", "ground_truth[0].content"))
        assert [c["spec"] for c in cands] == ["Design a 4-bit counter with enable.", "A 2:1 mux of 4-bit words."]
        assert cands[0]["files"] == [("design.sv", COUNTER)]          # the fence is stripped
        assert cands[1]["files"] == [("design.sv", MUX)]
        assert cands[0]["source"] == f"hf:{src.name}" and cands[0]["provenance"]["row"] == 0
        assert [dp.design_files(c)[0] for c in cands] == ["counter4", "mux2w"]
    with pytest.raises(dp.PoolError, match=r"row 0: 'nope\[0\]': no 'nope'"):
        list(dp.read_hf(str(jl), "question[1].content", "nope[0]"))


def test_hf_preset_is_one_argument_from_the_hub(tmp_path, monkeypatch):
    import datasets
    calls = []

    def fake_load(name, subset=None, split=None, **kw):
        calls.append((name, subset, split))
        return datasets.Dataset.from_list(authors_rows())

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    cands = list(dp.read_hf("codev-r1"))
    assert calls == [("zhuyaoyu/CodeV-R1-dataset", "sft", "train")]
    assert cands[0]["spec"] == "Design a 4-bit counter with enable." and cands[0]["source"] == "hf:zhuyaoyu/CodeV-R1-dataset"

    def unreachable(*a, **k):
        raise ConnectionError("Couldn't reach the Hub\nsecond line")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(dp.PoolError, match=r"^dataset 'zhuyaoyu/CodeV-R1-dataset': cannot load \(ConnectionError: "
                                           r"Couldn't reach the Hub\)$"):
        list(dp.read_hf("zhuyaoyu/CodeV-R1-dataset"))


# --- the filters (known rejection reasons) and the pool --------------------------------------------

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pool")
    corpus = write_corpus(tmp / "lib.jsonl.gz", [
        rec("lib/counter4", {"rtl/counter4.v": COUNTER}, top="counter4"),
        rec("lib/counter4_copy", {"rtl/c.v": COUNTER_DUP}, top="counter4"),
        rec("lib/proj", {"src/inc/defs.vh": "`define W 8\n", "src/cond_inv.v": SUB, "src/top.v": TOP},
            top="proj_top", source="tinytapeout", spec="# Project"),
        rec("lib/notop", {"m.v": MUX}, top="nope"),
        rec("lib/nomodule", {"m.v": "// only a comment, no design here at all, sorry\n"}),
        rec("lib/tiny", {"t.v": TINY}),
        rec("lib/big", {"big.v": BIG}),
        rec("lib/realin", {"r.v": REAL_PORT}),
        rec("lib/osc", {"o.v": NO_INPUT}),
        rec("lib/pass_int", {"p.v": INT_ONLY}),
        rec("lib/broken", {"b.v": PARSE_ERR}),
        rec("lib/uses_cell", {"u.v": UNDEF_CELL}),
        rec("lib/longspec", {"m.v": MUX.replace("mux2w", "mux2l")}, spec="words " * 6000),
        rec("lib/evalcopy", {"e.v": SHIFT}),
    ])
    folder = tmp / "fold"
    folder.mkdir()
    (folder / "two.v").write_text(TWO_TOPS)
    (folder / "mux2w.sv").write_text(MUX)
    evals = tmp / "eval.jsonl"
    evals.write_text(json.dumps({"id": "eval_mux", "rtl_files": [{"name": "m.sv", "content": SHIFT}],
                                 "dut_module_name": "zyx_quokka", "dut_instance_name": "uut"}) + "\n")
    out = tmp / "out"
    stats = dp.build_pool([dp.read_corpus(corpus), dp.read_folder(folder)], out, [str(evals)], **KNOBS)
    pool = [json.loads(line) for line in (out / "pool.jsonl").read_text().splitlines()]
    return stats, pool, out


@pytest.mark.needs_iverilog
def test_each_filter_rejects_with_its_reason(built):
    stats, pool, out = built
    why = {r["id"]: r["reason"] for r in stats["rejected_examples"]}
    assert why == {
        "lib/counter4_copy": "duplicate", "lib/notop": "top_not_found", "lib/nomodule": "no_module",
        "lib/tiny": "too_small", "lib/big": "too_large", "lib/realin": "teacher_cannot_drive",
        "lib/osc": "no_inputs", "lib/pass_int": "teacher_reaches_nothing", "lib/broken": "instrument_error",
        "lib/uses_cell": "compile_error", "lib/longspec": "prompt_too_long", "lib/evalcopy": "contaminated",
        "fold/two": "several_tops"}
    lib = stats["sources"]["lib"]
    assert lib["funnel"] == {"read": 15, "parsed": 13, "size_ok": 11, "unique": 10, "decontaminated": 9,
                             "compiles": 7, "teacher_drives": 5, "prompt_fits": 4, "teacher_reaches": 3}
    assert lib["kinds_read"] == {"module": 13, "project": 1, "submodule": 1}
    assert stats["sources"]["folder:fold"]["rejected"] == {"several_tops": 1}
    assert stats["decontamination"]["dropped"] == 1 and stats["decontamination"]["rows"][0]["eval_id"] == "eval_mux"
    saved = json.loads((out / "pool_stats.json").read_text())
    assert saved["real_designs"] == stats["real_designs"] == len(pool) == 4


@pytest.mark.needs_iverilog
def test_pool_tasks_have_the_dev_schema_and_a_calibrated_target(built):
    stats, pool, _ = built
    by_id = {t["id"]: t for t in pool}
    assert sorted(by_id) == ["fold/mux2w", "lib/counter4", "lib/proj", "lib/proj#cond_inv"]
    assert stats["pool_by_kind"] == {"module": 1, "project": 1, "submodule": 1, "design": 1}
    for t in pool:
        for k in ("id", "spec_files", "rtl_files", "dut_module_name", "dut_instance_name", "instruction",
                  "targets", "difficulty", "is_agentic", "license", "provenance"):
            assert k in t, k
        icarus = [x for x in t["targets"] if x["metric"] == "icarus_overall_average"]
        assert len(icarus) == 1 and icarus[0]["inst_name"] == t["dut_instance_name"]
        cal = t["icarus_calibration"]
        assert icarus[0]["target_percentage"] == min(90.0, int(cal["reached_pct"])) > 0
        assert f"'{t['dut_instance_name']}'" in t["instruction"]
    c = by_id["lib/counter4"]
    assert c["license"] == "MIT" and c["provenance"]["repo"] == "me/fixtures"
    assert c["rtl_files"] == [{"name": "counter4.v", "content": COUNTER}]
    sub = by_id["lib/proj#cond_inv"]
    assert [f["name"] for f in sub["rtl_files"]] == ["cond_inv.v"]
    assert sub["source"] == {"pool_source": "lib", "kind": "submodule"}
    strong = [t["icarus_calibration"]["strong_pct"] for t in pool]
    assert stats["teacher"]["mean_coverage_pct"] == round(sum(strong) / len(strong), 2)


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        dp.main(["--corpus", str(tmp_path / "missing.jsonl.gz"), "--out", str(tmp_path / "o")])
    assert str(e.value) == f"error: {tmp_path / 'missing.jsonl.gz'}: no such file"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "rtl_files": {"m.v": "module m; endmodule"}}\n{oops\n')
    with pytest.raises(dp.PoolError, match=r"bad.jsonl:2: invalid JSON"):
        list(dp.read_corpus(bad))


@pytest.mark.needs_iverilog
def test_report_files(built, tmp_path):
    stats, pool, out = built
    dp.main(["--report", str(out / "pool_stats.json"), "--results", str(tmp_path), "--command", "python x", "--commit", "abc"])
    doc = json.loads((tmp_path / "corpus.json").read_text())
    assert doc["real_designs"] == 4 and doc["command"] == "python x" and doc["commit"] == "abc"
    assert doc["sources"]["lib"]["funnel"]["teacher_reaches"] == 3 and "rejected_examples" not in doc
    md = (tmp_path / "corpus.md").read_text()
    assert "**real_designs: 4**" in md and "| lib | 15 | 13 | 11 | 10 | 9 | 7 | 5 | 4 | 3 | 3 |" in md
    assert "- folder:fold: several_tops 1" in md and (tmp_path / "corpus_tokens.png").stat().st_size > 1000


@pytest.mark.needs_iverilog
def test_sample_is_seeded_and_bounded(tmp_path):
    """--sample N keeps at most N designs, drawn by the seed: the same seed gives the same designs, the
    designs not drawn are counted as not_sampled."""
    corpus = write_corpus(tmp_path / "lib.jsonl.gz", [
        rec("lib/counter4", {"c.v": COUNTER}, top="counter4"),
        rec("lib/mux", {"m.v": MUX}, top="mux2w"),
        rec("lib/shift", {"s.v": SHIFT}, top="zyx_quokka")])
    picks = []
    for run in ("a", "b"):
        stats = dp.build_pool([dp.read_corpus(corpus)], tmp_path / run, **KNOBS, sample=1, seed=3)
        pool = [json.loads(x) for x in (tmp_path / run / "pool.jsonl").read_text().splitlines()]
        assert stats["real_designs"] == len(pool) == 1
        (src,) = stats["sources"].values()
        assert sum(src["rejected"].values()) == 2      # the other two, for some reason (not_sampled at least once)
        picks.append(pool[0]["id"])
    assert picks[0] == picks[1]
