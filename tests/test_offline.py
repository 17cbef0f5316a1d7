"""bench/offline/offline.py, the air-gapped GPU server's bundle, set-up and resume, on CPU in tmp_path: a bundle cut
into parts unpacks to the same bytes, a missing or corrupt part is named and changes nothing, a path that would escape
DEST is refused, and a stage cut at the deadline is reported as resumable.

    python -m pytest -q tests/test_offline.py
"""
import json
import os
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "offline"))
import offline  # noqa: E402


def _put(path, data=b"x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def _files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _sources(tmp_path):
    """A wheel-less bundle's inputs: a GGUF of 2,500 bytes and a run folder with a finished and a cut stage."""
    gguf = _put(tmp_path / "src" / "tiny.gguf", os.urandom(2500))
    run = tmp_path / "src" / "myrun"
    _put(run / "sft0" / "done.json", "{}")
    _put(run / "sft0" / "adapter" / "adapter_model.safetensors", os.urandom(700))
    _put(run / "rl0" / "ckpt" / "step_000010" / "meta.json", '{"step": 10}')
    _put(run / "rl0" / "ckpt" / "step_000010" / "optimizer.pt", os.urandom(900))
    _put(run / "rl0" / "ckpt" / "step_000020" / "meta.json", '{"step": 20}')
    return gguf, run


def test_sizes_read_as_people_write_them():
    assert offline.parse_size("60M") == 60_000_000 and offline.parse_size("2Gi") == 2 * 2**30
    assert offline.parse_size("1000") == 1000 and offline.parse_size("1.5k") == 1500
    for bad in ("", "M", "-3", "0", "12 parsecs"):
        with pytest.raises(Exception):
            offline.parse_size(bad)


def test_a_bundle_in_parts_unpacks_to_the_same_files(tmp_path):
    gguf, run = _sources(tmp_path)
    offline.main(["bundle", "--out", str(tmp_path / "carry"), "--part-size", "1000", "--gguf", str(gguf),
                  "--run", str(run)])
    manifest = json.loads((tmp_path / "carry" / offline.MANIFEST).read_text())
    sizes = [p["bytes"] for p in manifest["parts"]]
    assert len(sizes) > 4 and set(sizes[:-1]) == {1000} and 0 < sizes[-1] <= 1000      # every part but the last full
    assert manifest["contents"] == ["models/tiny.gguf", "runs/myrun"]
    offline.main(["setup", str(tmp_path / "carry"), "--dest", str(tmp_path / "stage")])
    stage = tmp_path / "stage"
    assert (stage / "models" / "tiny.gguf").read_bytes() == gguf.read_bytes()
    assert _files(stage / "runs" / "myrun") == _files(run)
    assert "PYTHONPATH" in (stage / "env.sh").read_text()


def test_excluded_paths_stay_home(tmp_path):
    _, run = _sources(tmp_path)
    offline.main(["bundle", "--out", str(tmp_path / "c"), "--run", str(run), "--exclude", r"optimizer\.pt$"])
    offline.main(["setup", str(tmp_path / "c"), "--dest", str(tmp_path / "d")])
    got = _files(tmp_path / "d" / "runs" / "myrun")
    assert "rl0/ckpt/step_000010/meta.json" in got and not [k for k in got if k.endswith("optimizer.pt")]


def test_a_missing_or_corrupt_part_is_named_and_nothing_is_unpacked(tmp_path):
    gguf, _ = _sources(tmp_path)
    carry = tmp_path / "carry"
    offline.main(["bundle", "--out", str(carry), "--part-size", "1K", "--gguf", str(gguf)])
    (carry / "bundle.tar.part001").unlink()
    part = carry / "bundle.tar.part002"
    part.write_bytes(b"y" + part.read_bytes()[1:])
    with pytest.raises(SystemExit) as e:
        offline.main(["setup", str(carry), "--dest", str(tmp_path / "stage")])
    assert "bundle.tar.part001: missing" in str(e.value) and "bundle.tar.part002: sha256 differs" in str(e.value)
    assert not (tmp_path / "stage").exists()


def test_a_bundle_folder_is_never_written_over(tmp_path):
    gguf, _ = _sources(tmp_path)
    offline.main(["bundle", "--out", str(tmp_path / "c"), "--gguf", str(gguf)])
    with pytest.raises(SystemExit, match="already holds a bundle"):
        offline.main(["bundle", "--out", str(tmp_path / "c"), "--gguf", str(gguf)])


def test_setup_refuses_a_path_that_leaves_dest(tmp_path):
    """A hand-made bundle whose tar names ../outside: tarfile's data filter stops it (a bundle from elsewhere is
    untrusted input)."""
    carry = tmp_path / "carry"
    carry.mkdir()
    _put(tmp_path / "payload", "evil")
    with tarfile.open(carry / "t.tar", "w") as tar:
        tar.add(tmp_path / "payload", arcname="../outside")
    data = (carry / "t.tar").read_bytes()
    (carry / "t.tar").unlink()
    _put(carry / "bundle.tar.part000", data)
    (carry / offline.MANIFEST).write_text(json.dumps({"parts": [{"name": "bundle.tar.part000", "bytes": len(data),
                                                                 "sha256": offline.sha256(carry / "bundle.tar.part000")}],
                                                      "contents": ["x"]}))
    with pytest.raises(tarfile.FilterError):
        offline.main(["setup", str(carry), "--dest", str(tmp_path / "stage")])
    assert not (tmp_path / "outside").exists()


def test_install_commands_put_wheels_aside_and_tools_in_usr_only_as_root(tmp_path):
    _put(tmp_path / "wheels" / "a-1-py3-none-any.whl")
    _put(tmp_path / "debs" / "iverilog.deb")
    as_root = offline.install_commands(tmp_path, have_iverilog=False, is_root=True)
    pip = as_root[0][0]
    assert pip[1:4] == ["-m", "pip", "install"] and "--no-index" in pip and "--no-deps" in pip
    assert pip[pip.index("--target") + 1] == tmp_path / "site"
    assert as_root[1][0][:2] == ["dpkg", "-x"] and as_root[-1][0][:2] == ["cp", "-rn"]
    assert not [c for c, _ in offline.install_commands(tmp_path, have_iverilog=False, is_root=False) if c[0] == "cp"]
    assert "root/usr/bin" in offline.env_script(tmp_path, tools_in_usr=False)
    assert "root/usr/bin" not in offline.env_script(tmp_path, tools_in_usr=True)


def test_fetch_downloads_for_the_servers_python_without_dependencies(tmp_path):
    (pip, _), (apt, cwd) = offline.fetch_commands(tmp_path, ["gguf==0.19.0"], ["iverilog"], "3.12", ["any"])
    assert "--no-deps" in pip and "--only-binary=:all:" in pip and pip[-1] == "gguf==0.19.0"
    assert pip[pip.index("--python-version") + 1] == "3.12" and pip[pip.index("-d") + 1] == tmp_path / "wheels"
    assert apt == ["apt-get", "download", "iverilog"] and cwd == tmp_path / "debs"
    assert len(offline.fetch_commands(tmp_path, ["x"], [], "3.12", ["any"])) == 1


def test_resume_reports_each_stage_and_passes_a_deadline(tmp_path, monkeypatch, capsys):
    _, run = _sources(tmp_path)
    seen = {}

    def fake_run(argv, **kw):
        seen.update(argv=argv, env=kw["env"])
        return type("Done", (), {"returncode": offline.EXIT_DEADLINE})()

    monkeypatch.setattr(offline, "run", fake_run)
    code = offline.main(["resume", "--minutes", "10", "--slack", "30", "--", "--profile", "smoke", "--out", str(run),
                         "--only", "rl0"])
    out = capsys.readouterr().out
    assert code == offline.EXIT_DEADLINE and "same command continues it" in out
    assert "sft0: done" in out and "rl0: cut at step 20" in out
    assert seen["argv"][2:] == ["run", "--profile", "smoke", "--out", str(run), "--only", "rl0"]
    assert 0 < int(seen["env"]["CHORUS_DEADLINE"]) - __import__("time").time() <= 570


def test_publish_copies_a_finished_stage_and_names_the_model_file(tmp_path):
    run = tmp_path / "run"
    _put(run / "rl0" / "adapter" / "adapter_model.safetensors", b"weights")
    _put(run / "rl0" / "adapter" / "adapter_config.json", json.dumps({"base_model_name_or_path": "/root/.cache/x",
                                                                      "r": 16}))
    out = tmp_path / "pub" / "rl0"
    with pytest.raises(SystemExit, match="no done.json"):
        offline.main(["publish", str(run / "rl0" / "adapter"), str(out), "--base-name", "m.gguf"])
    _put(run / "rl0" / "done.json", "{}")
    offline.main(["publish", str(run / "rl0" / "adapter"), str(out), "--base-name", "m.gguf"])
    assert (out / "adapter_model.safetensors").read_bytes() == b"weights"
    assert json.loads((out / "adapter_config.json").read_text()) == {"base_model_name_or_path": "m.gguf", "r": 16}
