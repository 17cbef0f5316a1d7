"""Data parallelism (dist.py) on CPU: the same SFT, RL and OPD steps run by 2 gloo processes and by 1
process must give the same LoRA update, and a 2-process checkpoint resumes in 1 process.

The 2-process runs are launched once per module with `python -m torch.distributed.run --standalone
--nproc_per_node 2 tests/test_dist.py --worker OUT` (the launcher `accelerate launch --multi_gpu` uses;
`accelerate launch --cpu` would start one process), so this file is also the worker. Rollouts are
scripted (fixed completions and rewards per task and round), so both runs see the same groups.

Run: python -m pytest -q tests/test_dist.py
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402
import torch  # noqa: E402

import common  # noqa: E402
import dist  # noqa: E402
import distill  # noqa: E402
import evaluate  # noqa: E402
import rl  # noqa: E402
import rundir  # noqa: E402
import sft  # noqa: E402
from helpers import EXPERTS_SEED, deadline_after  # noqa: E402
from onpolicy import Group, Sample, Score  # noqa: E402

SEED = EXPERTS_SEED   # the `experts` fixture's base (conftest.py); also the runs' seed
TASKS = [{"id": f"t{k}"} for k in range(6)]
TEXTS = ["initial a = 0;", "initial begin b = 1; #5 b = 0; end", "reg [3:0] c;",
         "always @(posedge clk) d <= ~d; // a longer line", "wire e;", "assign f = g & h;"]


# -----------------------------------------------------------------------------
# scripted rollouts: completions and rewards are fixed per (task, round, sample)

def _reward(task_id, rnd, j):
    k = int(task_id[1:])
    return [0.0, 1.0 + 0.1 * k, 1.5, 1.2 + 0.05 * rnd][(k + rnd + j) % 4]


def rollout_source(model, tok, tasks, *, step, first_index):
    """Two rounds of G=2 samples per task; records which tasks this rank rolled out."""
    calls = Path(os.environ["DIST_TEST_OUT"]) / f"calls_rank{dist.rank()}.jsonl"
    with open(calls, "a") as f:
        f.write(json.dumps({"step": step, "first_index": first_index, "tasks": [t["id"] for t in tasks]}) + "\n")
    prompt = lambda task: tok(f"module {task['id']}; endmodule", add_special_tokens=False)["input_ids"]
    groups = []
    for t, task in enumerate(tasks):
        k = int(task["id"][1:])
        for rnd in (1, 2):
            samples = []
            for j in range(2):
                text, r = TEXTS[(k + 2 * rnd + j) % len(TEXTS)], _reward(task["id"], rnd, j)
                samples.append(Sample(task["id"], rnd, [], text, prompt(task), tok(text, add_special_tokens=False)["input_ids"],
                                      False, Score(r, "ok" if r else "compile_error", r - 1 if r else None, r >= 1.5, r > 0, True)))
            groups.append(Group(first_index + t, task["id"], rnd, samples))
    return groups, {"t_gen": 0.0, "t_sim": 0.0}


def teacher_source(model, tok, groups, group_tasks, teachers, *, step):
    """Teacher rewards per group: teacher (task + round) % 2 beats the student on even tasks only."""
    out = []
    for g in groups:
        k = int(g.task_id[1:])
        best = max(g.rewards) + (0.3 if k % 2 == 0 else -0.3)
        out.append([[best] if i == (k + g.round) % 2 else [0.0] for i in range(len(teachers))])
    return out, {"t_gen": 0.0, "t_sim": 0.0}


def rl_args(out, *extra):
    return rl.parse_args(["--model", "tiny", "--tasks", "unused", "--out", str(out), "--steps", "2",
                          "--prompts-per-step", "3", "--group-size", "2", "--rounds", "2", "--lr", "1e-2",
                          "--save-every", "1", "--profile", "paper", "--seed", str(SEED), "--plot-every", "0",
                          "--max-prompt-tokens", "-1", "--max-tokens-per-micro", "64",
                          "--no-gradient-checkpointing", *extra])


def opd_args(paths, out, *extra):
    return distill.parse_args(["--model", "tiny", "--student", paths["student"], "--teachers", paths["t0"], paths["t1"],
                               "--tasks", "unused", "--out", str(out), "--seed", str(SEED), "--lr", "1e-2",
                               "--steps", "1", "--prompts-per-step", "3", "--group-size", "2", "--on-fail", "rl",
                               "--plot-every", "0", "--no-gradient-checkpointing", "--max-prompt-tokens", "-1", *extra])


def chat(i):
    return [{"role": "user", "content": f"<context>module m{i}(input clk); endmodule</context>" + " x" * (3 * i)},
            {"role": "assistant", "content": common.render_answer(
                f"tb_{i}.sv", f"module tb;\n  reg clk = 0;\n  m{i} uut(.clk(clk));\n" + "  initial #1;\n" * (i % 3)
                + "endmodule")}]


SFT_ROWS = [{"messages": chat(i)} for i in range(12)]


def run_sft(out, stop_after=None, resume=False):
    model, tok = common.tiny_model(seed=0)
    return sft.train_sft(model, tok, SFT_ROWS, out, batch_size=2, grad_accum=3, lr=1e-2, lora_r=4, lora_alpha=8,
                         lora_dropout=0.0, seed=SEED, save_every=1, stop_after_steps=stop_after, resume=resume,
                         progress=False)


EVAL_TASKS = [{"id": f"e{k}", "spec_files": [], "rtl_files": [{"name": f"m{k}.sv", "content": f"module m{k}; endmodule\n"}],
               "dut_module_name": f"m{k}", "dut_instance_name": "dut", "instruction": f"Write a testbench for m{k}.",
               "targets": [], "difficulty": "easy", "is_agentic": False} for k in range(5)]


def eval_policy(messages_list):
    """A deterministic policy: an unparseable answer naming the task (no simulation needed)."""
    return [f"no code for {m[-1]['content'][-40:]!r}" for m in messages_list]


def run_eval():
    samples, metrics = evaluate.run_eval(eval_policy, EVAL_TASKS, n=2, rounds=1, sim_workers=1, n_boot=0, verbose=False)
    return [(s["task_id"], s["sample"], [r["text"] for r in s["rounds"]]) for s in samples], metrics


def worker(out):
    """What each of the 2 processes runs: one SFT step, two RL steps, one OPD step, an eval, an RL deadline stop."""
    out = Path(out)
    os.environ["DIST_TEST_OUT"] = str(out)
    torch.set_num_threads(1)
    run_sft(out / "sft", stop_after=1)
    rl.run(rl_args(out / "rl"), source=rollout_source, tasks=TASKS)
    paths = json.loads((out / "experts.json").read_text())
    distill.run(opd_args(paths, out / "opd"), source=rollout_source, teacher_source=teacher_source, tasks=TASKS)
    samples, metrics = run_eval()
    if dist.is_main():
        (out / "eval.json").write_text(json.dumps({"samples": samples, "num_tasks": metrics["num_tasks"],
                                                   "timing": metrics["timing"]}))
    real, rundir.Deadline = rundir.Deadline, deadline_after(1)          # RL stopped at a deadline after step 1
    code = rl.run(rl_args(out / "rl_deadline", "--save-every", "10"), source=rollout_source, tasks=TASKS)
    rundir.Deadline = real
    (out / f"deadline_rank{dist.rank()}.json").write_text(json.dumps(code))
    print(f"rank {dist.rank()} of {dist.world()} done", file=sys.stderr)
    dist.shutdown()


# -----------------------------------------------------------------------------
# the helpers with one process and with a simulated world

def test_one_process_needs_no_process_group(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert (dist.rank(), dist.world(), dist.is_main()) == (0, 1, True) and dist._state is None
    assert dist.shard([1, 2, 3]) == [1, 2, 3] and dist.gather({"a": 1}) == [{"a": 1}]
    assert dist.gather_lists([4, 5]) == [4, 5] and dist.all_sum({"x": 2.5}) == {"x": 2.5}
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 2.0)
    dist.sync_grads([p])
    assert p.grad.tolist() == [2.0, 2.0, 2.0]
    assert dist.cpu_share() == (os.cpu_count() or 1)


@pytest.mark.parametrize("n", [0, 1, 5, 8])
@pytest.mark.parametrize("w", [1, 2, 3])
def test_shard_blocks_are_contiguous_balanced_and_cover_the_list(monkeypatch, n, w):
    items, blocks = list(range(n)), []
    monkeypatch.setattr(dist, "world", lambda: w)
    for r in range(w):
        monkeypatch.setattr(dist, "rank", lambda r=r: r)
        blocks.append(dist.shard(items))
    assert [x for b in blocks for x in b] == items                  # gather(shard(x)) is x, in order
    assert max(map(len, blocks)) - min(map(len, blocks)) <= 1


def test_chorus_mini_gpus_launches_the_training_and_eval_stages_with_accelerate():
    import chorus_mini
    import profiles
    o = Path("/tmp/run")
    for gpus, head in ((1, ["python"]), (4, ["accelerate", "launch", "--multi_gpu", "--num_processes", "4"])):
        c = profiles.apply_overrides(profiles.PROFILES["smoke"], [f"gpus={gpus}"])
        cmds = [chorus_mini.sft_cmd(c, o, "M", "d.jsonl"), chorus_mini.rl_cmd(c, o, "M", 0),
                chorus_mini.opd_cmd(c, o, "M", "opd"), chorus_mini.eval_cmd(c, o, "M", None, o / "t", o / "e", 1, 0)]
        for cmd, script in zip(cmds, ["sft.py", "rl.py", "distill.py", "evaluate.py"]):
            assert cmd.argv[:len(head)] == head and script in cmd.argv
            assert str(cmd).startswith(" ".join(head))                     # printed as it runs
    assert chorus_mini.merge_cmd(c, o, "soup").argv[0] == "python"         # one process: not a training stage


# -----------------------------------------------------------------------------
# 2 processes vs 1

@pytest.fixture(scope="module")
def two_procs(tmp_path_factory, experts):
    """Run the worker under 2 gloo processes once; returns its output folder."""
    out = tmp_path_factory.mktemp("dist2")
    (out / "experts.json").write_text(json.dumps(experts[0]))
    env = {**os.environ, "DIST_TEST_OUT": str(out), "PYTHONPATH": str(ROOT)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(Path(__file__).resolve()), "--worker", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"2-process worker failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert "rank 0 of 2 done" in proc.stderr and "rank 1 of 2 done" in proc.stderr
    return out


def _weights(ckpt):
    return torch.load(Path(ckpt) / "optimizer.pt", weights_only=False)["trainable"]


def assert_same_weights(a, b, moved_from=None):
    """Equal within fp32 noise, while one update moves some weight by > 1e-3. The two processes sum the
    gradients in another order, and Adam amplifies that rounding where a gradient is near 0: ~1e-6 after two
    steps on most CPUs this ran on, 1.4e-5 on one (one weight of step 2); 5e-5 stays 20x under a move."""
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys() and wa
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=5e-5, rtol=1e-5), (k, float((wa[k] - wb[k]).abs().max()))
    if moved_from is not None:        # the update was not a no-op (else equality would say nothing)
        w0 = _weights(moved_from) if not isinstance(moved_from, dict) else moved_from
        assert max(float((wa[k] - w0[k]).abs().max()) for k in wa) > 1e-3


def _log(path):
    return rundir.read_log(Path(path) / "log.jsonl")


def test_sft_step_on_two_processes_equals_one_and_resumes_in_one(two_procs, tmp_path):
    torch.set_num_threads(1)
    one = tmp_path / "sft1"
    init = {k: v.clone() for k, v in run_sft(tmp_path / "sft0", stop_after=0)["model"].named_parameters() if v.requires_grad}
    run_sft(one, stop_after=1)
    two = two_procs / "sft"
    assert_same_weights(one / "ckpt/step_000001", two / "ckpt/step_000001", moved_from=init)
    l1, l2 = _log(one), _log(two)
    assert len(l2) == 1 and l2[0]["target_tokens"] == l1[0]["target_tokens"]      # rank 0 alone wrote it
    for k in ("loss", "grad_norm"):          # the summed gradient has the one-process norm (not half, not double)
        assert l2[0][k] == pytest.approx(l1[0][k], rel=1e-4)
    assert json.loads((two / "result.json").read_text())["setup"]["processes"] == 2
    # resume the 2-process run in 1 process: it continues exactly as the 1-process run does
    shutil.copytree(two, tmp_path / "sft2")
    w1 = _weights(one / "ckpt/step_000001")
    run_sft(one, resume=True)
    run_sft(tmp_path / "sft2", resume=True)
    assert len(_log(one)) == 2 and (tmp_path / "sft2/done.json").exists()
    assert_same_weights(one / "ckpt/step_000002", tmp_path / "sft2/ckpt/step_000002", moved_from=w1)
    assert [r["loss"] for r in _log(tmp_path / "sft2")] == pytest.approx([r["loss"] for r in _log(one)], rel=1e-4)


def test_rl_steps_on_two_processes_equal_one_and_resume_in_one(two_procs, tmp_path, monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.setenv("DIST_TEST_OUT", str(tmp_path))
    one, two = tmp_path / "rl1", two_procs / "rl"
    rl.run(rl_args(one), source=rollout_source, tasks=TASKS)
    # each rank rolled out its block of the step's 3 prompts (rank 0: 1, rank 1: 2); the single process all 3
    calls = [[json.loads(l) for l in (two_procs / f"calls_rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)]
    rl_calls = [[c for c in cs if c["step"] < 2][:2] for cs in calls]
    assert [len(c["tasks"]) for c in rl_calls[0]] == [1, 1] and [len(c["tasks"]) for c in rl_calls[1]] == [2, 2]
    assert [c["first_index"] for c in rl_calls[0]] == [0, 3] and [c["first_index"] for c in rl_calls[1]] == [1, 4]
    assert_same_weights(one / "ckpt/step_000001", two / "ckpt/step_000001", moved_from=two / "ckpt/step_000002")
    assert_same_weights(one / "ckpt/step_000002", two / "ckpt/step_000002", moved_from=one / "ckpt/step_000001")
    l1, l2 = _log(one), _log(two)
    assert [r["step"] for r in l2] == [1, 2]
    for k in ("reward", "cursor", "num_tokens", "groups", "frac_reward_zero_std"):
        assert [r[k] for r in l2] == [r[k] for r in l1], k
    for k in ("loss", "grad_norm", "entropy", "ratio"):
        assert [r[k] for r in l2] == pytest.approx([r[k] for r in l1], rel=1e-4), k
    assert (two / "done.json").exists() and json.loads((two / "result.json").read_text())["setup"]["processes"] == 2
    # a 2-process run "killed" after step 1, resumed in 1 process: the same step 2
    resumed = tmp_path / "rl2"
    shutil.copytree(two, resumed)
    shutil.rmtree(resumed / "ckpt/step_000002")
    shutil.rmtree(resumed / "adapter")
    (resumed / "done.json").unlink()
    rl.run(rl_args(resumed, "--resume"), source=rollout_source, tasks=TASKS)
    assert_same_weights(one / "ckpt/step_000002", resumed / "ckpt/step_000002", moved_from=one / "ckpt/step_000001")
    assert [r["cursor"] for r in _log(resumed)] == [3, 6]
    assert json.loads((resumed / "result.json").read_text())["setup"]["processes"] == 1


def test_opd_step_on_two_processes_equals_one(two_procs, tmp_path, monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.setenv("DIST_TEST_OUT", str(tmp_path))
    paths = json.loads((two_procs / "experts.json").read_text())
    one, two = tmp_path / "opd1", two_procs / "opd"
    distill.run(opd_args(paths, one), source=rollout_source, teacher_source=teacher_source, tasks=TASKS)
    l1, l2 = _log(one), _log(two)
    assert l2[0]["opd_groups"] == l1[0]["opd_groups"] > 0 and l2[0]["rl_groups"] == l1[0]["rl_groups"] > 0
    for k in ("loss", "grad_norm", "opd/log_ratio", "opd/b", "opd/advantage"):
        assert l2[0][k] == pytest.approx(l1[0][k], rel=1e-4, abs=1e-6), k
    student = {k: v for k, v in common.load_adapter(common.tiny_model(seed=SEED)[0], paths["student"],
                                                    trainable=True).named_parameters() if v.requires_grad}
    assert_same_weights(one / "ckpt/step_000001", two / "ckpt/step_000001", moved_from=student)


def test_a_deadline_stop_on_two_processes_stops_both_at_one_step_checkpointed(two_procs):
    assert [json.loads((two_procs / f"deadline_rank{r}.json").read_text()) for r in (0, 1)] == [75, 75]
    d = two_procs / "rl_deadline"
    assert rundir.latest_checkpoint(d / "ckpt").name == "step_000001" and not (d / "done.json").exists()
    assert json.loads((d / rundir.DEADLINE_MARKER).read_text())["step"] == 1


def test_eval_on_two_processes_gathers_every_task_in_order(two_procs):
    got = json.loads((two_procs / "eval.json").read_text())
    samples, metrics = run_eval()
    assert [list(x) for x in samples] == got["samples"] and got["num_tasks"] == 5
    assert [t["samples"] for t in got["timing"]] == [t["samples"] for t in metrics["timing"]] == [10, 10]


if __name__ == "__main__" and "--worker" in sys.argv:
    worker(sys.argv[sys.argv.index("--worker") + 1])
