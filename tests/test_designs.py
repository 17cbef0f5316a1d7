"""Tests for data/designs.py, its families (data/design_families.py, data/datapath_families.py, data/rtl_writer.py)
and data/decontam.py (synthetic design families).

Run: python -m pytest -q tests/test_designs.py          (about 20-40 s on 2 cores)
     python -m pytest -q tests/test_designs.py -m "not slow"
"""
import json
import random
import subprocess
import sys

import pytest

from data import decontam
from data import designs as D

ROOT = D.os.path.dirname(D.os.path.dirname(D.os.path.abspath(D.__file__)))


def _has_sim():
    try:
        import simpool  # noqa: F401  (imports sim.py, which needs pyslang)
        return True
    except Exception:
        return False


def test_registry():
    assert len(D.FAMILIES) >= 25
    assert len(D.VAL_FAMILIES) == 5 and set(D.VAL_FAMILIES) <= set(D.FAMILIES)
    for name, fn in D.FAMILIES.items():
        assert fn.__doc__, name


def test_deterministic_and_seed_dependent():
    for fam in D.FAMILIES:
        a, b = D.make_task(fam, 7), D.make_task(fam, 7)
        assert a == b, fam
    rtl = {D.make_task("fsm_random", s)["rtl_files"][0]["content"] for s in range(6)}
    assert len(rtl) == 6


def test_schema():
    for fam in D.FAMILIES:
        t = D.make_task(fam, 3)
        for key in ["id", "spec_files", "rtl_files", "dut_module_name", "dut_instance_name", "instruction",
                    "targets", "difficulty", "is_agentic", "family", "split", "reference_tb"]:
            assert key in t, (fam, key)
        inst, top = t["dut_instance_name"], t["dut_module_name"]
        assert t["id"] == f"syn_{fam}_3" and t["family"] == fam and t["is_agentic"] is False
        assert inst in ("dut", "uut", f"inst_{top}")
        assert f"'{top}'" in t["instruction"] and f"'{inst}'" in t["instruction"]
        assert t["targets"] == [{"inst_name": inst, "metric": "overall_average", "target_percentage": 90.0}]
        assert f"module {top}" in t["rtl_files"][0]["content"]
        assert f"{top} {inst} (" in t["reference_tb"]
        assert "## Ports" in t["spec_files"][0]["content"]
        assert t["split"] == ("val" if fam in D.VAL_FAMILIES else "train")
        assert t["difficulty"] in ("easy", "medium", "hard")
        json.dumps(t)


def test_instance_names_all_kinds():
    kinds = {D.instance_name(f"syn_x_{i}", "top").split("_")[0] for i in range(200)}
    assert kinds == {"dut", "uut", "inst"}


def test_generate_tasks_splits():
    train = D.generate_tasks(60, seed=1, split="train")
    val = D.generate_tasks(10, seed=1, split="val")
    assert len(train) == 60 and len({t["id"] for t in train}) == 60
    assert not {t["family"] for t in train} & set(D.VAL_FAMILIES)
    assert {t["family"] for t in val} == set(D.VAL_FAMILIES)
    assert [t["id"] for t in D.generate_tasks(5, seed=1, split="train")] == [t["id"] for t in train[:5]]
    only = D.generate_tasks(4, split="train", families=["counter", "alu"])
    assert [t["family"] for t in only] == ["counter", "alu", "counter", "alu"]
    with pytest.raises(ValueError):
        D.generate_tasks(2, split="train", families=["crc"])        # a val family
    with pytest.raises(ValueError):
        D.generate_tasks(2, families=["nope"])
    with pytest.raises(ValueError):
        D.generate_tasks(2, split="test")


def test_lcs_matches_dynamic_programming():
    def dp(a, b):
        prev = [0] * (len(b) + 1)
        for x in a:
            cur = [0]
            for j, y in enumerate(b):
                cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
            prev = cur
        return prev[-1]
    r = random.Random(0)
    for _ in range(200):
        a = [r.choice("abcd") for _ in range(r.randint(0, 30))]
        b = [r.choice("abcd") for _ in range(r.randint(0, 30))]
        assert decontam.lcs_length(a, b) == dp(a, b)
    assert decontam.rouge_l_f1(list("abc"), list("abc")) == 1.0


def test_contamination_filter_drops_copies_only():
    train = D.generate_tasks(8, seed=2, split="all")
    evals = [dict(train[0], id="eval_copy"),
             {"id": "eval_other", "rtl_files": [{"name": "x.v", "content": "module m(input a, output y); assign y = ~a; endmodule"}]}]
    kept, dropped = decontam.contamination_filter(train, [evals])
    assert [d["id"] for d in dropped] == [train[0]["id"]] and dropped[0]["eval_id"] == "eval_copy"
    assert len(kept) == 7


def test_cli_writes_jsonl(tmp_path):
    out = tmp_path / "t.jsonl"
    subprocess.run([sys.executable, "data/designs.py", "--n", "3", "--seed", "4", "--split", "val", "--out", str(out)],
                   cwd=ROOT, check=True, capture_output=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(r["split"] == "val" for r in rows)


@pytest.mark.needs_shared
def test_decontaminate_against_dev_tasks(shared_dir):
    kept, dropped = decontam.contamination_filter(D.generate_tasks(30, split="all"), [str(shared_dir / "data" / "dev_tasks.jsonl")])
    assert len(kept) + len(dropped) == 30 and len(kept) >= 20


@pytest.mark.needs_iverilog
def test_every_family_compiles_and_runs():
    """Each family, 2 seeds: RTL compiles without errors or warnings under iverilog -g2012 and the
    reference testbench runs to $finish."""
    for fam in D.FAMILIES:
        for seed in (0, 1):
            r = D.check_icarus(D.make_task(fam, seed))
            assert r["ok"], (fam, seed, r["errors"])
            assert not r["warnings"], (fam, seed, r["warnings"])


@pytest.mark.slow
@pytest.mark.needs_iverilog
@pytest.mark.skipif(not _has_sim(), reason="the scorer (sim.py, simpool.py) does not import here")
def test_ceilings_with_scorer():
    """Every family's reference testbench scores under sim.py with a sensible ceiling."""
    tasks = [D.make_task(f, 0) for f in D.FAMILIES]
    D.attach_ceilings(tasks)
    for t in tasks:
        assert t["ceiling"]["status"] == "ok", (t["id"], t["ceiling"])
        assert t["ceiling"]["overall"] is not None and t["ceiling"]["overall"] > 50, (t["id"], t["ceiling"])
