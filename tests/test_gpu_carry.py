"""What the GPU parts' carry (scripts/gpu/prepare.py, part.py) does with odd input, quickly: each
fault is one line before any work, and leaves the user's files as they were. The parts themselves
run on a bare machine in tests/test_gpu_parts.py (slow)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "scripts" / "gpu"


def _prepare(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GPU / "prepare.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("n,words", [("0", "0 prompts: cut 1 or more"), ("-2", "-2 prompts: cut 1 or more"),
                                     ("two", "'two' is not a number of prompts")])
def test_prepare_refuses_a_count_of_prompts_below_one_before_any_work(tmp_path, n, words):
    """--prompts 0 divided by zero after the model was trained; -2 wrote no prompt and exited 0."""
    done = _prepare("--dry-run", "--out", str(tmp_path / "carry"), "--prompts", n)
    assert done.returncode == 2 and "Traceback" not in done.stderr and words in done.stderr, done.stderr
    assert not (tmp_path / "carry").exists()


def test_prepare_refuses_a_damaged_run_before_it_touches_the_carry(tmp_path):
    """A --run whose newest checkpoint's config.json was cut: one line naming it, before the
    carry's model (an earlier gpu-prep's) is removed (it was removed, then a traceback)."""
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step-00000010"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text('{"config": {"model": {"d_mod')
    carry = tmp_path / "carry"
    kept = carry / "model" / "checkpoints" / "step-00000005" / "config.json"
    kept.parent.mkdir(parents=True)
    kept.write_text("{}")
    done = _prepare("--dry-run", "--out", str(carry), "--run", str(run))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip()
    assert line.startswith(f"prepare: {ckpt / 'config.json'} cannot be read (JSONDecodeError: ") and "\n" not in line
    assert line.endswith("); give a run whose newest checkpoint is whole with --run, or none to train one")
    assert sorted(p.relative_to(carry).as_posix() for p in carry.rglob("*") if p.is_file()) == [
        "model/checkpoints/step-00000005/config.json"]


def test_a_carry_whose_config_is_cut_is_one_line_and_left_as_it_was(tmp_path):
    """decode.py points the carried run at the carried corpus: a cut config.json there was a
    traceback; now the reason, naming the file, with every file as it was."""
    sys.path.insert(0, str(GPU))
    try:
        from part import point_run_at_corpus
    finally:
        sys.path.remove(str(GPU))
    run = tmp_path / "model"
    whole, cut = (run / "checkpoints" / name / "config.json" for name in ("step-00000001", "step-00000002"))
    for path, text in ((whole, json.dumps({"config": {"data": {"path": "/elsewhere"}}})), (cut, '{"config": {')):
        path.parent.mkdir(parents=True)
        path.write_text(text)
    before = {p: p.read_text() for p in (whole, cut)}
    why = point_run_at_corpus(run, tmp_path / "corpus")
    assert why.startswith(f"{cut} cannot be read (JSONDecodeError") and why.endswith("make the carry again (make gpu-prep)")
    assert {p: p.read_text() for p in (whole, cut)} == before
    cut.write_text(json.dumps({"config": {"data": {"path": "/elsewhere"}}}))
    assert point_run_at_corpus(run, tmp_path / "corpus") is None
    assert json.loads(whole.read_text())["config"]["data"]["path"] == str((tmp_path / "corpus").resolve())
