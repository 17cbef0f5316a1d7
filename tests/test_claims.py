"""evaluate.claims: the paper's four claims from eval folders, with paired bootstrap intervals and verdicts.
Known answers: constant per-task differences give exact intervals; designed expert tables give known gaps."""
import json

import numpy as np
import pytest

import evaluate

N = 40


def write_model(root, name, pass_rates, skill=()):
    per_task = {f"t{i:02d}": {"samples": 5, "passes": round(p / 20), "pass_rate": float(p), "cov_mean": float(p) / 2,
                              "cov_max": 0.0, "syn_rate": 100.0, **({"skill": f"t{i:02d}" in skill} if skill else {})}
                for i, p in enumerate(pass_rates)}
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
    assert c["missing"] == [] and all(r["tasks"] == N and r["mode"] == "agentic" for r in c["claims"].values())
    assert c["claims"]["b"]["best_expert"] == "rl0"       # rl0 and rl1 tie at 50: the first in order
    a = c["claims"]["a"]
    assert a["sft_gap"]["point"] == 100.0 and a["sft_gap"]["ci95"] == [100.0, 100.0]
    assert a["sft_gap"]["noise_floor"] < 40 and a["sft_gap"]["verdict"] == "holds"   # shuffled: ~50 each
    assert a["expert_gap"]["point"] == 50.0          # rl0/rl1 at 50, rl2 at 0
    assert a["gap_shrink"]["point"] == 50.0 and a["gap_shrink"]["ci95"][0] > 0 and a["verdict"] == "holds"
    b = c["claims"]["b"]["oracle_minus_best"]
    # each resample re-picks its best expert (rl0 or rl1, whichever has more of its tasks): the gain is at most 50
    assert b["point"] == 50.0 and 25 < b["ci95"][0] < 50 and b["ci95"][1] == 50.0
    # each task's 5 passes dealt out among the 15 samples of 3 experts give a gain of ~10-20 points by chance
    assert 5 < b["noise_floor"] < 30 and b["p"] < 0.01 and c["claims"]["b"]["verdict"] == "holds"
    assert c["claims"]["b"]["sft_oracle_minus_best"] == 0.0   # sft2 is best on every task
    assert c["claims"]["b"]["room"] == {"points": 50.0, "tasks": 20, "none_score": 0}   # rl1 passes rl0's misses
    assert all(r["separating_tasks"] == N for r in c["claims"].values())
    cc = c["claims"]["c"]
    assert cc["soup_minus_best"]["point"] == 0.0 and cc["soup_minus_best"]["ci95"] == [0.0, 0.0] and cc["verdict"] == "holds"
    d = c["claims"]["d"]
    assert d["opd_minus_soup"]["point"] == 10.0 and d["opd_minus_soup"]["ci95"][0] > -45   # soup is 0/100 per task
    assert d["opd_minus_nogate"]["ci95"] == [0.0, 0.0] and d["opd_minus_nogate"]["verdict"] == "does not hold"
    assert d["verdict"] == "does not hold"


def test_models_that_differ_only_by_sampling_noise_are_neither_different_nor_complementary(tmp_path):
    """Six models drawn from the same per-task pass probabilities (5 samples each): the SFT gap and the experts'
    oracle gain are above 0 by construction, yet below their noise floors, so (a) and (b) do not hold (or are
    inconclusive, when the top of their interval reaches the floor)."""
    rng = np.random.default_rng(7)
    p = rng.uniform(0, 1, N)
    for name in ("sft0", "sft1", "sft2", "rl0", "rl1", "rl2"):
        write_model(tmp_path / "e", name, 100.0 * rng.binomial(5, p) / 5)
    c = evaluate.claims(tmp_path / "e", n_boot=500)
    assert c["claims"]["a"]["sft_gap"]["point"] > 0 and c["claims"]["a"]["sft_gap"]["ci95"][0] > 0
    assert c["claims"]["a"]["sft_gap"]["verdict"] != "holds" and c["claims"]["a"]["verdict"] != "holds"
    b = c["claims"]["b"]
    assert b["oracle_minus_best"]["point"] > 5 and b["verdict"] != "holds"
    assert b["oracle_minus_best"]["p"] > 0.05 and c["missing"] == ["c", "d"]
    # an expert that passes everything the others pass, and more: no complementarity, the gain is 0
    write_model(tmp_path / "dom", "rl0", [100.0] * N)
    for name in ("rl1", "rl2"):
        write_model(tmp_path / "dom", name, 100.0 * rng.binomial(5, p) / 5)
    dom = evaluate.claims(tmp_path / "dom", n_boot=200)["claims"]["b"]
    assert dom["best_expert"] == "rl0" and dom["oracle_minus_best"]["point"] == 0.0 and dom["verdict"] == "does not hold"


def test_a_saturated_split_shows_how_little_room_it_leaves(tmp_path, capsys):
    """36 tasks every model passes, 3 no model passes (like a task no stimulus can pass) and one where the experts
    differ: 1 task separates the models, the best expert (rl0, 60 % there) leaves 8.5 points of room on 4 tasks,
    3 of them at 0 for every expert, and no expert beats it anywhere: an oracle gain of 0."""
    rates = {m: [100.0] * 36 + [0.0] * 3 for m in ("sft0", "sft1", "sft2", "rl0", "rl1", "rl2")}
    for m, last in (("sft0", 20.0), ("sft1", 40.0), ("sft2", 60.0), ("rl0", 60.0), ("rl1", 40.0), ("rl2", 40.0)):
        write_model(tmp_path / "eval", m, rates[m] + [last])
    c = evaluate.claims(tmp_path / "eval", n_boot=200)
    b = c["claims"]["b"]
    assert b["best_expert"] == "rl0" and b["oracle_minus_best"]["point"] == 0.0      # rl0 is best on its mean
    assert b["room"] == {"points": pytest.approx((3 * 100 + 40) / 40), "tasks": 4, "none_score": 3}
    assert b["separating_tasks"] == 1 and c["claims"]["a"]["separating_tasks"] == 1
    evaluate.main(["claims", str(tmp_path / "eval")])
    out = capsys.readouterr().out
    assert "40 tasks, the models differ on 1, best expert rl0" in out and "room above rl0 +8.5 on 4 tasks, 3 of them at 0" in out


def test_each_claim_uses_its_own_models_tasks_and_mode(run):
    """A model with direct results on fewer tasks changes only the claim that uses it."""
    m = json.loads((run / "opd" / "metrics.json").read_text())
    short = {t: v for t, v in list(m["direct"]["per_task"].items())[:5]}
    (run / "opd" / "metrics.json").write_text(json.dumps({"direct": {"per_task": short}}))
    c = evaluate.claims(run, n_boot=200)
    assert (c["claims"]["d"]["mode"], c["claims"]["d"]["tasks"], c["claims"]["d"]["dropped_tasks"]) == ("direct", 5, N - 5)
    assert all((c["claims"][k]["mode"], c["claims"][k]["tasks"]) == ("agentic", N) for k in "abc")


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
    assert evaluate.verdict([-2.5, -0.1], margin=2.0) == "inconclusive"      # may or may not be within 2 points
    assert evaluate.verdict([-5.0, -2.5], margin=2.0) == "does not hold"     # worse by more than the margin
    # paired: a model that is another plus a constant has an exact interval, however noisy the tasks are
    base = np.random.default_rng(1).uniform(0, 100, N)
    r = evaluate.paired_bootstrap(np.stack([base + 7.0, base], axis=1), lambda a: a[..., 0].mean(-1) - a[..., 1].mean(-1))
    assert r["point"] == pytest.approx(7.0) and r["ci95"] == pytest.approx([7.0, 7.0])


def test_a_split_evaluated_in_two_parts_gives_the_claims_of_the_whole(run, tmp_path):
    """Each model's per-task tables of two folders (tasks t00-t14 and t15-t39) are joined: the claims equal those of
    the one folder that holds all 40; a task in both folders is an error, not a silent overwrite."""
    for name in ("sft0", "sft1", "sft2", "rl0", "rl1", "rl2", "soup", "opd", "opd_nogate"):
        m = json.loads((run / name / "metrics.json").read_text())
        for part, keep in (("p1", lambda t: t < "t15"), ("p2", lambda t: t >= "t15")):
            d = tmp_path / part / name
            d.mkdir(parents=True)
            d.joinpath("metrics.json").write_text(json.dumps(
                {k: {"per_task": {t: r for t, r in m[k]["per_task"].items() if keep(t)}} for k in m}))
    whole, joined = evaluate.claims(run, n_boot=300), evaluate.claims(tmp_path / "p1", tmp_path / "p2", n_boot=300)
    assert joined["more_dirs"] == [str(tmp_path / "p2")]
    assert joined["claims"] == whole["claims"] and joined["means"] == whole["means"]
    assert evaluate.claims(tmp_path / "p1", n_boot=300)["claims"]["a"]["tasks"] == 15
    with pytest.raises(SystemExit, match="task t00 is in two of the folders"):
        evaluate.claims(tmp_path / "p1", run, n_boot=300)


def test_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no sft0-2 / rl0-2 / soup / opd folder"):
        evaluate.claims(tmp_path)
    with pytest.raises(SystemExit, match="is not a folder"):
        evaluate.claims(tmp_path / "nope")
    with pytest.raises(SystemExit, match="n_boot must be at least 1"):
        evaluate.claims(tmp_path, n_boot=0)


def test_pooled_samples_null_deals_each_tasks_passes_among_unequal_sample_counts():
    """Known invariants of the dealing: every draw keeps each task's total passes, no model gets more passes than
    it has samples, and a model with twice the samples gets about twice the passes on average."""
    passes = np.array([[3, 0, 6], [0, 0, 0], [5, 5, 10]])
    samples = np.array([[5, 5, 10], [5, 5, 10], [5, 5, 10]])
    draws = evaluate.pooled_samples_null(passes, samples, lambda a: a, n_draws=400)   # rates in percent
    counts = np.rint(draws * samples / 100).astype(int)                              # (draws, tasks, models)
    assert (counts.sum(axis=-1) == passes.sum(axis=1)).all() and (counts <= samples).all()
    assert (counts[:, 1] == 0).all() and (counts[:, 2] == samples[2]).all()        # none, and all: nothing to deal
    share = counts[:, 0].mean(axis=0)
    assert abs(share[2] - 2 * share[0]) < 0.5 and abs(share.sum() - 9) < 1e-9
    with pytest.raises(ValueError, match="at least one sample"):
        evaluate.pooled_samples_null(passes, samples * 0, lambda a: a)


def test_claims_on_the_skill_split(tmp_path, capsys):
    """Even tasks are the skill split: there rl0 passes the first half and rl1 the second (oracle 100, best 50);
    on the odd tasks every expert passes (random stimulus solves them). All tasks: oracle gain 25; skill: 50."""
    skill = {f"t{i:02d}" for i in range(0, N, 2)}
    first = {f"t{i:02d}" for i in range(0, N // 2, 2)}
    rl0 = [100.0 if f"t{i:02d}" not in skill or f"t{i:02d}" in first else 0.0 for i in range(N)]
    rl1 = [100.0 if f"t{i:02d}" not in skill or f"t{i:02d}" not in first else 0.0 for i in range(N)]
    for name, rates in {"rl0": rl0, "rl1": rl1, "rl2": [0.0] * N}.items():
        write_model(tmp_path / "eval", name, rates, skill=skill)
    every = evaluate.claims(tmp_path / "eval", n_boot=200)
    assert every["claims"]["b"]["oracle_minus_best"]["point"] == 25.0 and "skill_tasks" not in every
    flagged = evaluate.claims(tmp_path / "eval", n_boot=200, skill=True)
    b = flagged["claims"]["b"]
    assert flagged["skill_tasks"] == N // 2 and b["tasks"] == N // 2 and b["dropped_tasks"] == 0
    assert b["oracle_minus_best"]["point"] == 50.0 and b["verdict"] == "holds"
    assert evaluate.claims(tmp_path / "eval", n_boot=200, skill=skill)["claims"] == flagged["claims"]
    # the split as a task file, or as a floor file (the tasks random never passes)
    tasks = tmp_path / "skill.jsonl"
    tasks.write_text("".join(json.dumps({"id": t, "rtl_files": [{"name": "m.sv", "content": "module m; endmodule\n"}],
                                         "dut_module_name": "m", "dut_instance_name": "uut"})
                             + "\n" for t in sorted(skill)))
    floor = tmp_path / "floor.json"
    floor.write_text(json.dumps({"version": 1, "tasks": {f"t{i:02d}:0": {"id": f"t{i:02d}", "random_cov": 50.0,
                                                                       "random_pass": 0.0 if i % 2 == 0 else 1.0}
                                                        for i in range(N)}}))
    assert evaluate.skill_file_ids(tasks) == skill == evaluate.skill_file_ids(floor)
    assert evaluate.main(["claims", str(tmp_path / "eval"), "--skill", str(floor), "--n-boot", "200",
                          "--out", str(tmp_path / "c.json")]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["skill_tasks"] == N // 2
    assert f"on the skill split ({N // 2} tasks" in capsys.readouterr().out
    for name in ("rl0", "rl1", "rl2"):                # evaluated without a floor: nothing is flagged
        write_model(tmp_path / "plain", name, [50.0] * N)
    with pytest.raises(SystemExit, match="flagged skill"):
        evaluate.claims(tmp_path / "plain", n_boot=200, skill=True)
