"""`bytemtp train` as a user runs it: exact resume after SIGKILL, SIGTERM, and the command's
errors, resume options and output.

Runs use the tiny preset on a small prepared corpus with a val split (conftest's `corpus_dir`). The
subprocess tests (the kill and the signal) cost a torch import each, so there are five
subprocesses in all; everything else runs the command in this process.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file
from train_runs import (BATCH, ckpt_step, cli, cli_cmd, loss_lines, read_metrics, signal_at_step, start_cli, tiny_cfg)

from bytemtp import config as config_lib
from bytemtp import config_io
from bytemtp.model.model import ByteMTP
from bytemtp.runtime.checkpoint import latest_checkpoint, list_checkpoints
from bytemtp.training import runs
from bytemtp_cli.main import main
from bytemtp_cli.options import parse_duration, parse_size

TIMING_KEYS = ("bytes_per_s", "elapsed_s")


# --- helpers ---------------------------------------------------------------------------------


def new_run_args(corpus_dir: Path, out: Path, steps: int, *sets: str) -> list[str]:
    args = ["--preset", "tiny", "--data", str(corpus_dir), "--out", str(out), "--steps", str(steps),
            "--set", "train.log_every=1", "--set", f"data.batch_size={BATCH}"]
    for s in sets:
        args += ["--set", s]
    return args


def run_cli(args: list[str], log: Path) -> str:
    """Run `bytemtp train ARGS` in a subprocess to completion; return its output."""
    with open(log, "w") as f:
        proc = subprocess.run(cli_cmd(*args), stdout=f, stderr=subprocess.STDOUT, timeout=300)
    out = log.read_text()
    assert proc.returncode == 0, out[-3000:]
    return out


def wait_for_checkpoint(proc: subprocess.Popen, run_dir: Path, log: Path, timeout: float = 120) -> int:
    """Poll the run's checkpoints until a complete one appears; return its step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ckpt = latest_checkpoint(run_dir)  # complete ones only: a checkpoint is renamed into place whole
        if ckpt is not None:
            return ckpt_step(ckpt)
        if proc.poll() is not None:
            pytest.fail(f"the run ended (status {proc.returncode}) before its first checkpoint:\n"
                        f"{log.read_text()[-3000:]}")
        time.sleep(0.005)
    proc.kill()
    pytest.fail(f"no checkpoint in {run_dir} after {timeout} s")


# --- 1. resume after SIGKILL equals the uninterrupted run ------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("compiled", ["off", "on"])
def test_resume_after_sigkill_equals_uninterrupted_run_bit_for_bit(tmp_path, corpus_dir, compiled):
    steps = 80
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    # dropout: the RNG state must resume too; compiled training (train.compile=on) resumes exactly as well
    sets = ("train.ckpt_every=10", "model.dropout=0.1", f"train.compile={compiled}")
    run_cli(new_run_args(corpus_dir, run_a, steps, *sets), tmp_path / "a.log")

    # killed once its first checkpoint is saved and a step after it is logged (a step that the
    # resumed run takes again): the kill waits for what it needs, whatever the machine's speed,
    # and lands some 70 steps before the end
    log = tmp_path / "b.log"
    proc = start_cli(new_run_args(corpus_dir, run_b, steps, *sets), log)
    saved = wait_for_checkpoint(proc, run_b, log)
    signal_at_step(proc, run_b, saved + 1, log, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL, log.read_text()[-3000:]
    killed_at = max(r["step"] for r in loss_lines(read_metrics(run_b)))
    ckpt = latest_checkpoint(run_b)
    assert ckpt is not None and saved <= ckpt_step(ckpt) <= killed_at < steps
    assert not (run_b / "checkpoints" / f"step-{steps:08d}").exists()

    out = run_cli(["--resume", str(run_b)], tmp_path / "b-resume.log")
    assert f"from {ckpt.name}" in out and f"stopped by steps at step {steps}" in out

    a, b = read_metrics(run_a), read_metrics(run_b)
    assert [r["step"] for r in loss_lines(b)] == list(range(1, steps + 1))
    assert [r["step"] for r in loss_lines(a)] == list(range(1, steps + 1))
    for ra, rb in zip(loss_lines(a), loss_lines(b)):
        assert ra["loss"] == rb["loss"], (ra["step"], ra["loss"], rb["loss"])
        strip = lambda r: {k: v for k, v in r.items() if k not in TIMING_KEYS}  # noqa: E731
        assert strip(ra) == strip(rb), ra["step"]
    assert [r for r in a if "val_bpb" in r] == [r for r in b if "val_bpb" in r] != []

    final_a, final_b = latest_checkpoint(run_a), latest_checkpoint(run_b)
    assert ckpt_step(final_a) == ckpt_step(final_b) == steps
    weights_a, weights_b = load_file(final_a / "model.safetensors"), load_file(final_b / "model.safetensors")
    assert weights_a.keys() == weights_b.keys()
    for key in weights_a:
        assert torch.equal(weights_a[key], weights_b[key]), key
    state_a = json.loads((final_a / "train_state.json").read_text())
    state_b = json.loads((final_b / "train_state.json").read_text())
    for key in ("loaders", "rngs", "world_size", "bytes_seen", "skipped_steps", "val_bpb"):
        assert state_a[key] == state_b[key], key


# --- 2. SIGTERM saves and exits 0 ---------------------------------------------------------------


@pytest.mark.slow
def test_sigterm_saves_the_step_and_exits_0_then_resumes(tmp_path, corpus_dir):
    run = tmp_path / "run"
    log = tmp_path / "run.log"
    # compile off: a run of 100,000 steps would compile (auto), minutes on busy cores before step 5
    proc = start_cli(new_run_args(corpus_dir, run, 100000, "train.ckpt_every=100000", "train.compile=off"), log)
    signal_at_step(proc, run, 5, log, signal.SIGTERM)
    out = log.read_text()
    assert proc.returncode == 0, out[-3000:]
    assert "SIGTERM" in out and "stopped by signal" in out
    last = loss_lines(read_metrics(run))[-1]["step"]
    ckpt = latest_checkpoint(run)
    assert ckpt is not None and ckpt_step(ckpt) == last >= 5
    assert [r["step"] for r in loss_lines(read_metrics(run))] == list(range(1, last + 1))

    out = run_cli(["--resume", str(run), "--steps", str(last + 3)], tmp_path / "resume.log")
    assert f"stopped by steps at step {last + 3}" in out
    assert ckpt_step(latest_checkpoint(run)) == last + 3
    assert [r["step"] for r in loss_lines(read_metrics(run))] == list(range(1, last + 4))


# --- 5. the train command's errors ----------------------------------------------------------------


@pytest.mark.parametrize("case,words", [
    ("unknown", "unknown setting train.lrr"),
    ("bad_value", "train.lr=-1.0 is not allowed"),
    ("missing_corpus", "/nonexistent/corpus does not exist"),
    ("existing_run", "already exists"),
    ("no_checkpoint", "no checkpoint to resume"),
    ("changed_model", "model.d_model cannot change"),
    ("no_stop", "no stop condition"),
    ("bad_time", "--time 'banana' is not a duration"),
    ("bad_bytes", "--bytes 'lots' is not a size"),
])
def test_train_errors_are_one_line(tmp_path, corpus_dir, short_run, case, words):
    new = tmp_path / "new"
    base = ["--preset", "tiny", "--data", corpus_dir, "--out", new]
    args = {
        "unknown": base + ["--steps", 1, "--set", "train.lrr=1"],
        "bad_value": base + ["--steps", 1, "--set", "train.lr=-1"],
        "missing_corpus": ["--preset", "tiny", "--data", "/nonexistent/corpus", "--out", new, "--steps", 1],
        "existing_run": ["--preset", "tiny", "--data", corpus_dir, "--out", short_run, "--steps", 1],
        "no_checkpoint": ["--resume", tmp_path],
        "changed_model": ["--resume", short_run, "--set", "model.d_model=64"],
        "no_stop": base,
        "bad_time": base + ["--time", "banana"],
        "bad_bytes": base + ["--bytes", "lots"],
    }[case]
    res = cli(*args)
    assert res.exit_code == 1, res.output
    assert isinstance(res.exception, SystemExit)
    assert "Traceback" not in res.output
    errors = res.stderr.strip().splitlines()
    assert len(errors) == 1 and words in errors[0], res.stderr
    if case != "existing_run":
        assert not new.exists() or not any(new.iterdir())
    assert ckpt_step(latest_checkpoint(short_run)) == 2  # nothing was trained


def test_resume_lets_set_and_steps_override_the_config_file(tmp_path, short_run):
    # the order of a new run: preset (here the checkpoint), then --config, then --set / --steps
    toml = tmp_path / "more.toml"
    toml.write_text("[train]\nsteps = 2\nlog_every = 1\n")
    res = cli("--resume", short_run, "--config", toml, "--steps", 4)
    assert res.exit_code == 0, res.output
    assert "stopped by steps at step 4" in res.output


def test_a_run_killed_before_its_first_checkpoint_can_be_restarted(tmp_path, corpus_dir, short_run):
    # what a run killed before its first save leaves: run-config.json and metrics.jsonl
    for ckpt in list_checkpoints(short_run):
        for f in ckpt.iterdir():
            f.unlink()
        ckpt.rmdir()
    resumed = cli("--resume", short_run)
    fresh = cli("--preset", "tiny", "--data", corpus_dir, "--out", short_run, "--steps", 1,
                "--set", f"data.batch_size={BATCH}")
    assert resumed.exit_code != 0
    # the two errors must not send the user to each other: one of them names a fix that works
    assert fresh.exit_code == 0 or any(w in resumed.stderr for w in ("remove", "delete", "another --out")), (
        resumed.stderr, fresh.stderr)


@pytest.mark.slow
def test_a_run_works_from_any_directory(tmp_path, corpus_dir, code_corpus, monkeypatch):
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    shutil.copytree(corpus_dir, start / "data" / "mine")  # a corpus named relative to where the run starts
    elsewhere.mkdir()
    monkeypatch.chdir(start)
    res = cli("--preset", "tiny", "--data", "data/mine", "--out", "runs/r", "--steps", 2,
              "--set", f"data.batch_size={BATCH}")
    assert res.exit_code == 0, res.output
    run = start / "runs" / "r"
    monkeypatch.chdir(elsewhere)
    res = cli("--resume", run, "--steps", 3)
    assert res.exit_code == 0, res.output
    assert "stopped by steps at step 3" in res.output
    # the same corpus named another way: absolute, through a link, a copy
    (elsewhere / "link").symlink_to(start / "data" / "mine")
    shutil.copytree(start / "data" / "mine", elsewhere / "copy")
    for step, data in ((4, start / "data" / "mine"), (5, "link"), (6, "copy")):
        res = cli("--resume", run, "--steps", step, "--data", data)
        assert res.exit_code == 0, res.output
        assert f"stopped by steps at step {step}" in res.output
    res = cli("--resume", run, "--steps", 7, "--data", code_corpus)  # another corpus
    assert res.exit_code == 1 and "data.path cannot change" in res.stderr
    # the other commands that read the run's corpus, from here too
    res = CliRunner().invoke(main, ["eval", "--ckpt", str(run), "--batches", "1", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["plot", str(run), "--eval-batches", "1", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (run / "plots").iterdir()) == ["acceptance.png", "loss.png", "val_bpb.png"]
    res = CliRunner().invoke(main, ["bench", "decode", "--ckpt", str(run), "--n-prompts", "1", "--prompt-bytes", "8",
                                    "--max-bytes", "8", "--batch-sizes", "1", "--draft", "auto", "--rounds", "1",
                                    "--device", "cpu"])
    assert res.exit_code == 0, res.output


def test_a_relative_corpus_of_an_older_run_asks_for_its_path(tmp_path, corpus_dir, short_run, monkeypatch):
    # runs saved before paths were stored absolute hold the corpus as typed
    ckpt = latest_checkpoint(short_run)
    meta = json.loads((ckpt / "config.json").read_text())
    meta["config"]["data"]["path"] = "data/mine"
    (ckpt / "config.json").write_text(json.dumps(meta))
    monkeypatch.chdir(tmp_path)
    res = cli("--resume", short_run, "--steps", 3)
    assert res.exit_code == 1 and "data/mine was named relative" in res.stderr
    res = cli("--resume", short_run, "--steps", 3, "--data", corpus_dir)
    assert res.exit_code == 0, res.output


def test_resume_by_checkpoint_path_and_when_already_done(tmp_path, short_run):
    ckpt = latest_checkpoint(short_run)
    before = {p: p.stat().st_mtime_ns for p in short_run.rglob("*")}
    res = cli("--resume", short_run, "--steps", 2)
    assert res.exit_code == 0, res.output
    assert "already done" in res.output and "nothing changed" in res.output
    assert {p: p.stat().st_mtime_ns for p in short_run.rglob("*")} == before
    keep = ("--set", "train.keep_checkpoints=5")
    res = cli("--resume", ckpt, "--steps", 3, *keep)  # the newest checkpoint itself: the run goes on from it
    assert res.exit_code == 0, res.output
    assert "stopped by steps at step 3" in res.output
    res = cli("--resume", short_run / "checkpoints", "--steps", 4, *keep)  # the folder of checkpoints
    assert res.exit_code == 0 and "at step 4" in res.output
    res = cli("--resume", ckpt, "--steps", 5)  # an older one: advice that works
    assert res.exit_code == 1 and "not the newest checkpoint" in res.stderr
    assert "step-00000004 is its newest" in res.stderr and "delete the newer checkpoints" in res.stderr
    res = cli("--resume", short_run, "--preset", "tiny", "--steps", 5)
    assert res.exit_code == 1 and res.stderr.strip() == (
        "Error: --preset tiny is for a new run; a resumed run keeps its checkpoint's settings "
        "(change train.* with --set or --config)")
    assert ckpt_step(latest_checkpoint(short_run)) == 4


def test_a_run_directory_is_refused_as_a_corpus(tmp_path, short_run):
    # `--data runs/t1` used to train on the run's checkpoint binaries with only a note
    new = tmp_path / "new"
    res = cli("--preset", "tiny", "--data", short_run, "--out", new, "--steps", 1)
    assert res.exit_code == 1 and "Traceback" not in res.output
    errors = res.stderr.strip().splitlines()
    assert len(errors) == 1 and f"the corpus {short_run} is a run directory" in errors[0], res.stderr
    assert not new.exists()
    (tmp_path / "t2").mkdir()  # a run that died before its first checkpoint has only run-config.json
    (tmp_path / "t2" / runs.RUN_CONFIG).write_text("{}")
    with pytest.raises(ValueError, match="is a run directory"):
        runs.plan_run(new, overrides=[f"data.path={tmp_path / 't2'}", "train.steps=1"])


def test_train_prints_a_header_and_the_next_byte_loss(tmp_path, corpus_dir):
    import re

    run = tmp_path / "run"
    res = cli("--preset", "tiny", "--data", corpus_dir, "--out", run, "--steps", 3,
              "--set", f"data.batch_size={BATCH}", "--set", "train.log_every=1", "--device", "cpu")
    assert res.exit_code == 0, res.output
    assert "{" not in res.stdout  # the config is in the run directory, not on the screen
    params = ByteMTP(config_io.tiny().model).num_params()
    for words in (f"run      {run} (new", "run-config.json", f"corpus   {corpus_dir}", f"{params:,} parameters",
                  "device   cpu"):
        assert words in res.stdout, words
    saved = config_io.from_dict(config_lib.Config, json.loads((run / "run-config.json").read_text()))
    assert saved == tiny_cfg(corpus_dir, "train.steps=3", "train.device=cpu")
    shown = re.findall(r"next-byte loss (\d+\.\d+)", res.stderr)
    last = loss_lines(read_metrics(run))[-1]
    assert shown and float(shown[-1]) == pytest.approx(last["head_loss"][0], abs=1e-3)
    assert last["loss"] > 2 * last["head_loss"][0]  # the sum over 8 heads is another figure


def test_parse_duration_and_size():
    assert parse_duration("90s") == 90
    assert parse_duration("10m") == 600
    assert parse_duration("1h30m") == 5400
    assert parse_duration("2") == 2
    assert parse_duration("1.5h") == 5400
    assert parse_size("50M") == 50_000_000
    assert parse_size("2G") == 2_000_000_000
    assert parse_size("123") == 123
    assert parse_size("10k") == 10_000
    for bad in ("banana", "", "10x", "h"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)
    for bad in ("lots", "", "5X", "1h"):
        with pytest.raises(ValueError, match="not a size"):
            parse_size(bad)


def test_parse_size_is_exact_for_decimal_fractions():
    # 1.001 * 10**6 is 1000999.9999999999 in floating point
    assert parse_size("1.001M") == 1_001_000
    assert parse_size("2.5k") == 2_500
