"""bench/gpu/small3_call.sh (one job of the round-3 run on a GPU machine) on CPU with a synthetic kept state: it
restores the run folder (data, stage folders, each finished SFT stage's adapter as its picked checkpoint and
as the step 0 of the stage cut after it), runs
the commands with $RUN and a deadline, and packs the named paths back in parts, leaving optimizer state behind."""
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tar_bytes(members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
    return buf.getvalue()


def test_a_job_restores_the_run_runs_and_packs_back(tmp_path):
    state, adapters, stage, out = (tmp_path / n for n in ("state", "adapters", "stage", "out"))
    (state / "sft0").mkdir(parents=True)
    (state / "data.tgz").write_bytes(_tar_bytes({"data/done.json": b"{}"}))
    (state / "sft0/result.json").write_text(json.dumps({"outcome": {"val_best_adapter": "val_ckpt/step_000312/adapter"}}))
    (state / "sft0/done.json").write_text("{}")
    (state / "rl0/ckpt/step_000033").mkdir(parents=True)
    (state / "rl0/ckpt/step_000033/optimizer.pt").write_text("moments")
    (state / "rl0/ckpt/step_000033/meta.json").write_text("{}")
    (state / "sft1").mkdir()                                    # finished: its pick is published
    (state / "sft1/result.json").write_text(json.dumps({"outcome": {"val_best_adapter": "val_ckpt/step_000624/adapter"}}))
    (state / "sft1/done.json").write_text("{}")
    (state / "sft2/ckpt/step_000209").mkdir(parents=True)       # a stage cut at a deadline, kept without step 0
    (state / "sft2/ckpt/step_000209/meta.json").write_text("{}")
    for name in ("sft0", "sft1"):
        (adapters / name).mkdir(parents=True)
        (adapters / name / "adapter_config.json").write_text(json.dumps({"from": name}))
    stage.mkdir()
    (stage / "env.sh").write_text("export STAGED=yes\n")        # set up by an earlier job
    (stage / "smollm2.gguf").write_text("model")
    out.mkdir()
    env = {**os.environ, "STAGE": str(stage), "OUT": str(out), "STATE": str(state), "ADAPTERS": str(adapters),
           "CARRY": str(tmp_path / "no_carry"),
           "LINK": str(tmp_path / "runs/s3"), "TAR_PATHS": "sft0 rl0"}
    cmd = ('echo "$STAGED $CHORUS_DEADLINE" > $OUT/env.txt; echo "$RUN" > $OUT/run.txt; touch runs_s3_made; '
           'mkdir -p $STAGE/s3/rl0/ckpt/step_000040 && echo {} > $STAGE/s3/rl0/ckpt/step_000040/meta.json')
    t0 = time.time()
    proc = subprocess.run(["bash", str(ROOT / "bench/gpu/small3_call.sh"), "100", cmd.replace("runs_s3_made",
                          str(tmp_path / "runs/s3/made"))], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = stage / "s3"
    assert (run / "data/done.json").is_file() and (run / "rl0/ckpt/step_000033/meta.json").is_file()
    read = lambda p: json.loads((run / p / "adapter_config.json").read_text())["from"]   # noqa: E731
    assert read("sft0/val_ckpt/step_000312/adapter") == "sft0" and read("sft1/val_ckpt/step_000624/adapter") == "sft1"
    assert read("sft2/val_ckpt/step_000000/adapter") == "sft1"       # sft2 resumes from sft1's pick
    assert not (run / "sft1/val_ckpt/step_000000").exists()          # a finished stage needs no step 0
    assert (run / "sft2/ckpt/step_000209").is_dir()
    assert (run / "made").is_file()                                   # LINK points at the run folder
    staged, deadline = (out / "env.txt").read_text().split()
    assert staged == "yes" and t0 + 100 - 30 - 2 <= int(deadline) <= time.time() + 100 - 30   # 30 s kept to pack
    assert f"--out {tmp_path / 'runs/s3'}" in (out / "run.txt").read_text()
    assert f"model={stage / 'smollm2.gguf'}" in (out / "run.txt").read_text()
    with tarfile.open(out / "back.tgz.part00") as tar:
        names = tar.getnames()
    assert "sft0/result.json" in names and "rl0/ckpt/step_000040/meta.json" in names
    assert not any("step_000033" in n for n in names)                # only the newest checkpoint travels back
    assert not any(n.endswith("optimizer.pt") for n in names)


def test_a_job_that_only_carries_parts_stops_after_staging(tmp_path):
    (tmp_path / "carry/c0").mkdir(parents=True)
    (tmp_path / "carry/c0/bundle.tar.part000").write_text("part")       # the manifest comes with the last part
    env = {**os.environ, "STAGE": str(tmp_path / "stage"), "OUT": str(tmp_path), "STATE": str(tmp_path / "none"),
           "CARRY": str(tmp_path / "carry")}
    proc = subprocess.run(["bash", str(ROOT / "bench/gpu/small3_call.sh"), "100", "echo ran"], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 0 and "staged: bundle.tar.part000" in proc.stdout and "ran" not in proc.stdout
    assert (tmp_path / "stage/carry/bundle.tar.part000").read_text() == "part"


def test_the_state_travels_in_pieces_beside_the_parts(tmp_path):
    """A staging job restores the piece of state it carries; a later job adds the pieces it carries and leaves the
    folders the machine already has (they are newer); a job with commands but no data yet stops with one line."""
    stage, state, adapters = tmp_path / "stage", tmp_path / "state", tmp_path / "adapters"
    (tmp_path / "carry/c0").mkdir(parents=True)
    (tmp_path / "carry/c0/bundle.tar.part000").write_text("part")
    (state / "sft0").mkdir(parents=True)
    (state / "sft0/result.json").write_text(json.dumps({"outcome": {"val_best_adapter": "val_ckpt/step_000312/adapter"}}))
    (state / "sft0/done.json").write_text("{}")
    env = {**os.environ, "STAGE": str(stage), "OUT": str(tmp_path), "STATE": str(state), "ADAPTERS": str(adapters),
           "CARRY": str(tmp_path / "carry"), "LINK": str(tmp_path / "runs/s3")}
    job = lambda: subprocess.run(["bash", str(ROOT / "bench/gpu/small3_call.sh"), "100", "echo ran"],   # noqa: E731
                                 capture_output=True, text=True, env=env, timeout=60)
    proc = job()                                   # first piece: sft0's folder, without its adapter
    assert proc.returncode == 0 and "restored sft0 from" in proc.stdout and "ran" not in proc.stdout
    (stage / "s3/sft0/log.jsonl").write_text("newer")                  # the machine moves on
    (state / "sft0/log.jsonl").write_text("older")
    (state / "sft0").rename(tmp_path / "kept_sft0")                    # this job carries data and the adapter
    (state / "data.tgz").write_bytes(_tar_bytes({"data/done.json": b"{}"}))
    (adapters / "sft0").mkdir(parents=True)
    (adapters / "sft0/adapter_config.json").write_text("{}")
    proc = job()
    assert "restored data sft0/val_ckpt/step_000312/adapter from" in proc.stdout
    assert (stage / "s3/sft0/log.jsonl").read_text() == "newer"
    assert (stage / "s3/sft0/val_ckpt/step_000312/adapter/adapter_config.json").is_file()
    assert "run folder:" not in job().stdout                          # nothing new: nothing said
    (stage / "env.sh").write_text("")                                  # set up; commands run once data is there
    (stage / "smollm2.gguf").write_text("model")
    shutil.rmtree(stage / "s3/data")
    (state / "data.tgz").unlink()
    proc = job()
    assert proc.returncode == 1 and "no run folder yet: carry" in proc.stdout and "ran" not in proc.stdout


def test_folders_without_files_are_no_piece_of_the_state(tmp_path):
    """A checkout whose pieces are hidden from the carry may arrive with their folders but no files: such a folder
    is not restored, nor an adapter folder without adapter_config.json; one a job restored empty before gives way
    to the real folder when a later job carries it."""
    stage, state, adapters = tmp_path / "stage", tmp_path / "state", tmp_path / "adapters"
    (state / "rl0/ckpt/step_000033/adapter").mkdir(parents=True)        # a hidden piece: folders, no files
    (state / "sft0").mkdir(parents=True)
    (state / "sft0/result.json").write_text(json.dumps({"outcome": {"val_best_adapter": "val_ckpt/step_000312/adapter"}}))
    (state / "sft0/done.json").write_text("{}")
    (adapters / "sft0").mkdir(parents=True)                              # hidden too
    (stage / "s3/r/rl0/ckpt").mkdir(parents=True)                        # restored empty by an earlier job
    env = {**os.environ, "STAGE": str(stage), "OUT": str(tmp_path), "STATE": str(state), "ADAPTERS": str(adapters),
           "CARRY": str(tmp_path / "carry"), "LINK": str(tmp_path / "runs/s3")}
    job = lambda: subprocess.run(["bash", str(ROOT / "bench/gpu/small3_call.sh"), "100", "echo ran"],   # noqa: E731
                                 capture_output=True, text=True, env=env, timeout=60)
    proc = job()
    assert "restored sft0 from" in proc.stdout and not (stage / "s3/rl0").exists()
    assert not (stage / "s3/sft0/val_ckpt").exists()
    (state / "rl0/ckpt/step_000033/meta.json").write_text("{}")          # later jobs carry the real pieces
    (state / "r/rl0/ckpt").mkdir(parents=True)
    (state / "r/rl0/ckpt/meta.json").write_text("{}")
    (adapters / "sft0/adapter_config.json").write_text("{}")
    proc = job()
    assert "restored r rl0 sft0/val_ckpt/step_000312/adapter from" in proc.stdout, proc.stdout
    assert (stage / "s3/rl0/ckpt/step_000033/meta.json").is_file() and (stage / "s3/r/rl0/ckpt/meta.json").is_file()
    assert (stage / "s3/sft0/val_ckpt/step_000312/adapter/adapter_config.json").is_file()


def test_a_job_passes_on_the_commands_status_and_names_a_missing_path(tmp_path):
    """The commands' exit status is the job's (75: a stage stopped at its deadline); TAR_PATHS naming a path the run
    folder lacks is said and fails the job, while the paths that exist still come back."""
    stage, out = tmp_path / "stage", tmp_path / "out"
    (stage / "s3/data").mkdir(parents=True)                  # a run folder an earlier job restored
    (stage / "s3/sft1").mkdir()
    (stage / "s3/sft1/log.jsonl").write_text("{}")
    (stage / "env.sh").write_text("")
    (stage / "smollm2.gguf").write_text("model")
    out.mkdir()
    env = {**os.environ, "STAGE": str(stage), "OUT": str(out), "CARRY": str(tmp_path / "none"),
           "STATE": str(tmp_path / "no_state"), "LINK": str(tmp_path / "runs/s3")}
    job = lambda cmd, paths: subprocess.run(["bash", str(ROOT / "bench/gpu/small3_call.sh"), "100", cmd],   # noqa: E731
                                            capture_output=True, text=True, env={**env, "TAR_PATHS": paths}, timeout=60)
    assert job("exit 75", "sft1").returncode == 75
    proc = job("true", "sft1 sweep")
    assert proc.returncode == 1 and "TAR_PATHS names sweep" in proc.stdout
    with tarfile.open(out / "back.tgz.part00") as tar:
        assert "sft1/log.jsonl" in tar.getnames()
