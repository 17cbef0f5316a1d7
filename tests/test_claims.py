"""evaluate.claims: the paper's four claims from eval folders, with paired bootstrap intervals and verdicts.
Known answers: constant per-task differences give exact intervals; designed expert tables give known gaps."""
import json

import numpy as np
import pytest

import evaluate

N = 40


def write_model(root, name, pass_rates):
    per_task = {f"t{i:02d}": {"samples": 5, "passes": 0, "pass_rate": float(p), "cov_mean": float(p) / 2,
                              "cov_max": 0.0, "syn_rate": 100.0} for i, p in enumerate(pass_rates)}
    d = root / name
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps({"agentic": {"per_task": per_task}, "direct": {"per_task": per_task}}))


@pytest.fixture
def run(tmp_path):
    half = [100.0] * (N // 2) + [0.0] * (N // 2)
    models = {"sft0": [0.0] * N, "sft1": [50.0] * N, "sft2": [100.0] * N,      # gap 100, exactly
              "rl0": half, "rl1": half[::-1], "rl2": [0.0] * N,                # complementary: oracle 100, best 50
              "soup": half,                                                    # equals the best expert (rl0)
              "opd": [60.0] * N, "opd_nogate": [60.0] * N}                     # +10 over the soup; = no gate
    for name, rates in models.items():
        write_model(tmp_path / "eval", name, rates)
    return tmp_path / "eval"


def test_the_four_claims_have_their_known_answers(run):
    c = evaluate.claims(run, n_boot=500)
    assert c["tasks"] == N and c["missing"] == [] and c["best_expert"] == "rl0"
    a = c["claims"]["a"]
    assert a["sft_gap"]["point"] == 100.0 and a["sft_gap"]["ci95"] == [100.0, 100.0]
    assert a["expert_gap"]["point"] == 50.0          # rl0/rl1 at 50, rl2 at 0
    assert a["gap_shrink"]["point"] == 50.0 and a["gap_shrink"]["ci95"][0] > 0 and a["verdict"] == "holds"
    b = c["claims"]["b"]
    assert b["oracle_minus_best"]["point"] == 50.0 and 25 < b["oracle_minus_best"]["ci95"][0] < 50 < b["oracle_minus_best"]["ci95"][1] < 75
    assert b["verdict"] == "holds" and b["sft_oracle_minus_best"] == 0.0   # sft2 dominates on every task
    cc = c["claims"]["c"]
    assert cc["soup_minus_best"]["point"] == 0.0 and cc["soup_minus_best"]["ci95"] == [0.0, 0.0] and cc["verdict"] == "holds"
    d = c["claims"]["d"]
    assert d["opd_minus_soup"]["point"] == 10.0 and d["opd_minus_soup"]["ci95"][0] > -45   # soup is 0/100 per task
    assert d["opd_minus_nogate"]["ci95"] == [0.0, 0.0] and d["opd_minus_nogate"]["verdict"] == "does not hold"
    assert d["verdict"] == "does not hold"


def test_cov_metric_and_missing_models_and_the_command(run, tmp_path, capsys):
    import shutil
    shutil.rmtree(run / "opd")
    out = tmp_path / "claims.json"
    assert evaluate.main(["claims", str(run), "--metric", "cov_mean", "--n-boot", "200", "--out", str(out)]) == 0
    c = json.loads(out.read_text())
    assert c["missing"] == ["d"] and c["metric"] == "cov_mean"
    assert c["claims"]["a"]["sft_gap"]["point"] == 50.0        # cov_mean is half the pass rate in the fixture
    text = capsys.readouterr().out
    assert "| (a) the staged SFT checkpoints differ" in text and "**holds**" in text and "Not measured (models missing): d" in text


def test_verdicts_and_a_paired_interval():
    assert evaluate.verdict([0.5, 3.0]) == "holds"
    assert evaluate.verdict([-1.0, 3.0]) == "inconclusive"
    assert evaluate.verdict([-3.0, -0.5]) == "does not hold"
    assert evaluate.verdict([0.0, 0.0]) == "does not hold"             # no difference at all
    assert evaluate.verdict([-1.5, 1.0], margin=2.0) == "holds"         # non-inferiority within 2 points
    assert evaluate.verdict([-2.5, -0.1], margin=2.0) == "does not hold"
    # paired: a model that is another plus a constant has an exact interval, however noisy the tasks are
    base = np.random.default_rng(1).uniform(0, 100, N)
    r = evaluate.paired_bootstrap(np.stack([base + 7.0, base], axis=1), lambda a: a[..., 0].mean(-1) - a[..., 1].mean(-1))
    assert r["point"] == pytest.approx(7.0) and r["ci95"] == pytest.approx([7.0, 7.0])


def test_no_model_folder_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no sft0-2 / rl0-2 / soup / opd folder"):
        evaluate.claims(tmp_path)
