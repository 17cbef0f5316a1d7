"""bench/gpu/small3_pieces.py: results/ hidden but for a call's pieces, refused while an edit there would be lost,
put back by restore."""
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "gpu"))
import small3_pieces  # noqa: E402


def _repo(tmp_path):
    root = tmp_path / "repo"
    files = {"README.md": "kit", "results/bench.md": "a record", "results/small3/state/rl2/log.jsonl": "{}\n",
             "results/small3/state/rl2/best/val.json": "{}", "results/small3/state/rl2/best/adapter/w.bin": "w",
             "results/small3/state/sft0/result.json": "{}", "results/small3/adapters/sft0/cfg.json": "{}",
             "results/small3/adapters/sft1/cfg.json": "{}", "results/small3/adapters/sft2/cfg.json": "{}"}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    for cmd in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", *cmd], cwd=root, check=True)
    return root


def _files(root):
    return sorted(str(p.relative_to(root)) for p in (root / "results").rglob("*") if p.is_file())


def test_a_call_keeps_its_pieces_without_best_adapters_and_restore_puts_results_back(tmp_path, capsys):
    root = _repo(tmp_path)
    assert small3_pieces.main(["hide", "--call", "3", "--root", str(root)]) == 0
    assert _files(root) == ["results/small3/adapters/sft0/cfg.json", "results/small3/adapters/sft1/cfg.json",
                            "results/small3/adapters/sft2/cfg.json", "results/small3/state/rl2/best/val.json",
                            "results/small3/state/rl2/log.jsonl"]
    assert not (root / "results/small3/state/sft0").exists()          # empty folders go too
    assert "carry: .carry/c2 runs/dev_tasks.jsonl" in capsys.readouterr().out
    assert small3_pieces.main(["hide", "results/bench.md", "--root", str(root)]) == 0    # from a hidden state
    assert _files(root) == ["results/bench.md"]
    assert small3_pieces.main(["restore", "--root", str(root)]) == 0
    assert len(_files(root)) == 8 and (root / "README.md").read_text() == "kit"
    assert small3_pieces.main(["hide", "--call", "4", "--root", str(root)]) == 0    # a further job: nothing
    assert _files(root) == [] and "carry: runs/dev_tasks.jsonl" in capsys.readouterr().out
    assert small3_pieces.main(["restore", "--root", str(root)]) == 0 and len(_files(root)) == 8


def test_an_uncommitted_change_in_results_is_refused_and_nothing_moves(tmp_path, capsys):
    root = _repo(tmp_path)
    (root / "results/bench.md").write_text("an edit")
    (root / "results/new.md").write_text("a new record")
    assert small3_pieces.main(["hide", "--call", "1", "--root", str(root)]) == 2
    assert "commit them first" in capsys.readouterr().err
    assert (root / "results/bench.md").read_text() == "an edit" and len(_files(root)) == 9
    assert small3_pieces.main(["restore", "--root", str(root)]) == 2
    assert (root / "results/bench.md").read_text() == "an edit"


def test_a_path_not_in_head_is_named(tmp_path):
    root = _repo(tmp_path)
    try:
        small3_pieces.main(["hide", "results/nothing", "--root", str(root)])
    except SystemExit as e:
        assert "results/nothing" in str(e)
    else:
        raise AssertionError("hide accepted a path HEAD does not track")
    assert len(_files(root)) == 8                                      # checked before anything is hidden
