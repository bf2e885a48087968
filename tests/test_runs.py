"""Run directories: one writer at a time (the lock), the checks a run's plan makes once, and the
state a run resumes (`train_state.TrainState`) restored from one state dict.

The lock is tested in this process (a second open of the lock file conflicts like another
process's) and, in one slow test, with two real trainings: the second stops at once naming the
first and changes nothing in its run; after the first is killed, training into the run works.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import bytemtp.training.train as train_lib
from bytemtp import config as config_lib
from bytemtp import config_io
from bytemtp.data.loader import ByteLoader
from bytemtp.runtime import distributed as dist_lib
from bytemtp.runtime.checkpoint import latest_checkpoint
from bytemtp.training import runs
from bytemtp.training.train_state import TrainState
from bytemtp_cli.main import main


def tiny_cfg(corpus: Path, *sets: str) -> config_lib.Config:
    return config_io.resolve("tiny", overrides=[f"data.path={corpus}", "data.batch_size=2", "train.eval_batches=1",
                                                 *sets])


@pytest.fixture(scope="module")
def trained(code_corpus, tmp_path_factory) -> Path:
    """A run of two steps, with its checkpoint (tests copy it before they train into it)."""
    run = tmp_path_factory.mktemp("runs") / "run"
    train_lib.train(tiny_cfg(code_corpus, "train.steps=2"), run, show_progress=False, say=lambda m: None)
    return run


@pytest.fixture
def run(trained, tmp_path) -> Path:
    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run"


def snapshot(run_dir: Path) -> dict:
    """Every file's size, modification time and bytes."""
    return {str(p.relative_to(run_dir)): (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def train_cli(*args) -> CliRunner:
    return CliRunner().invoke(main, ["train", *map(str, args)])


# --- the lock ------------------------------------------------------------------------------------


def test_a_locked_run_refuses_a_second_training_naming_the_holder(run, code_corpus):
    me = f"pid {os.getpid()} on "
    with runs.run_lock(run):
        assert (run / runs.LOCK).read_text().startswith(me)
        before = snapshot(run)
        for args in (["--resume", run, "--steps", 3],  # the CLI, resumed and new
                     ["--preset", "tiny", "--data", code_corpus, "--out", run, "--steps", 3]):
            res = train_cli(*args)
            assert res.exit_code == 1 and "Traceback" not in res.output, res.output
            errors = res.stderr.strip().splitlines()
            assert len(errors) == 1 and f"{run} is in use by a training that is running ({me}" in errors[0], errors
        with pytest.raises(runs.RunLocked, match=me):  # the library, resumed and new
            train_lib.train(tiny_cfg(code_corpus, "train.steps=3"), run, resume=True, show_progress=False)
        with pytest.raises(runs.RunLocked, match=me):
            runs.plan_run(run, preset="tiny", overrides=[f"data.path={code_corpus}", "train.steps=3"])
        assert snapshot(run) == before
    res = train_cli("--resume", run, "--steps", 3)  # released
    assert res.exit_code == 0, res.output
    assert "stopped by steps at step 3" in res.output


def test_a_run_locked_after_its_plan_stops_before_it_writes(run, code_corpus, tmp_path):
    # two trainings planned at once: the one that does not get the lock writes nothing
    resumed = runs.plan_run(run, resume=True, overrides=["train.steps=3"])
    new = runs.plan_run(tmp_path / "new", preset="tiny", overrides=[f"data.path={code_corpus}", "train.steps=1"])
    with runs.run_lock(run), runs.run_lock(tmp_path / "new"):
        before = snapshot(run)
        for plan in (resumed, new):
            with pytest.raises(runs.RunLocked, match=f"pid {os.getpid()}"):
                train_lib.run_plan(plan, show_progress=False, say=lambda m: None)
        assert snapshot(run) == before
        assert [p.name for p in (tmp_path / "new").iterdir()] == [runs.LOCK]
    assert train_lib.run_plan(new, show_progress=False, say=lambda m: None).step == 1  # a lock file alone is no run


def test_a_new_run_rechecks_its_directory_under_the_lock(run, code_corpus, tmp_path):
    later = tmp_path / "later"
    plan = runs.plan_run(later, preset="tiny", overrides=[f"data.path={code_corpus}", "train.steps=1"])
    shutil.copytree(run, later)  # another training wrote there after the plan was made
    before = snapshot(later)
    with pytest.raises(ValueError, match="already exists"):
        train_lib.run_plan(plan, show_progress=False)
    after = snapshot(later)
    assert after.pop(runs.LOCK)[2].startswith(f"pid {os.getpid()} ".encode())  # it held the lock, then looked
    before.pop(runs.LOCK)
    assert after == before


@pytest.mark.slow
def test_reading_commands_never_take_the_lock(run):
    with runs.run_lock(run):
        for args in (["inspect", run],
                     ["eval", "--ckpt", run, "--batches", "1", "--batch-size", "2", "--device", "cpu"],
                     ["generate", "--ckpt", run, "--prompt", "def ", "--max-bytes", "4", "--no-speculative",
                      "--device", "cpu"],
                     ["plot", run, "--eval-batches", "0"]):
            res = CliRunner().invoke(main, [*map(str, args)])
            assert res.exit_code == 0, (args, res.output)


def _sleep(started) -> None:
    started.set()
    time.sleep(60)


def test_a_forked_child_does_not_keep_the_lock(tmp_path):
    # a DataLoader worker is forked from the trainer; the run must be free when the trainer is gone
    child, fork = None, multiprocessing.get_context("fork")
    try:
        with runs.run_lock(tmp_path / "run"):
            started = fork.Event()
            child = fork.Process(target=_sleep, args=(started,), daemon=True)
            child.start()
            assert started.wait(60)
        assert child.is_alive()
        runs.check_unlocked(tmp_path / "run")  # no RunLocked: only the trainer held it
        with runs.run_lock(tmp_path / "run"):
            pass
    finally:
        if child is not None:
            child.kill()
            child.join()


def test_checking_a_lock_writes_nothing(tmp_path):
    runs.check_unlocked(tmp_path / "absent")
    assert not (tmp_path / "absent").exists()


def _wait_for_text(proc: subprocess.Popen, log: Path, pattern: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not re.search(pattern, log.read_text()):
        if proc.poll() is not None:
            pytest.fail(f"the first training ended (status {proc.returncode}):\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {pattern!r} after {timeout} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)


@pytest.mark.slow
def test_two_trainings_into_one_run_the_second_stops_and_changes_nothing(run, code_corpus, tmp_path):
    cmd = [sys.executable, "-m", "bytemtp_cli", "train"]
    log = tmp_path / "first.log"
    # a first training that runs a while without writing into the run after it starts
    with open(log, "w") as f:
        first = subprocess.Popen([*cmd, "--resume", str(run), "--steps", "1000000", "--time", "10m",
                                  "--set", "train.log_every=1000000", "--set", "train.ckpt_every=1000000",
                                  "--set", "train.compile=off"],  # 10 minutes would compile (auto) first
                                 stdout=f, stderr=subprocess.STDOUT)
    try:
        _wait_for_text(first, log, r"\d(step/s|s/step)\]")  # its loop is running: the bar shows a step's rate
        assert (run / runs.LOCK).read_text().strip() == f"pid {first.pid} on {os.uname().nodename}"
        before = snapshot(run)
        for args in (["--resume", str(run), "--steps", "5"],
                     ["--preset", "tiny", "--data", str(code_corpus), "--out", str(run), "--steps", "5"]):
            second = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=300)
            assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr[-3000:]
            errors = second.stderr.strip().splitlines()
            assert len(errors) == 1 and f"(pid {first.pid} on " in errors[0], second.stderr
        assert snapshot(run) == before
        assert first.poll() is None
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    again = subprocess.run([*cmd, "--resume", str(run), "--steps", "4"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "stopped by steps at step 4" in again.stdout
    assert latest_checkpoint(run).name == "step-00000004"


# --- the plan's checks, made once ------------------------------------------------------------------


def test_the_plan_refuses_a_run_without_a_stop_condition(tmp_path, code_corpus):
    with pytest.raises(ValueError, match="no stop condition: set train.steps"):
        runs.plan_run(tmp_path / "new", preset="tiny", overrides=[f"data.path={code_corpus}"])
    with pytest.raises(ValueError, match="no stop condition"):
        train_lib.train(tiny_cfg(code_corpus), tmp_path / "new", show_progress=False)
    assert not (tmp_path / "new").exists()


def test_a_resumed_config_may_change_only_train_settings(run, code_corpus):
    other = tiny_cfg(code_corpus, "train.steps=4", "model.d_model=64")
    with pytest.raises(ValueError, match="model.d_model cannot change when resuming"):
        train_lib.train(other, run, resume=True, show_progress=False)
    plan = runs.plan_config(tiny_cfg(code_corpus, "train.steps=4", "train.lr=1e-4"), run, resume=True)
    assert plan.resume and plan.checkpoint == latest_checkpoint(run) and plan.cfg.train.lr == 1e-4
    assert train_lib.run_plan(plan, show_progress=False, say=lambda m: None).step == 4


def test_a_run_that_is_done_returns_without_touching_its_directory(run, code_corpus):
    before = snapshot(run)
    plan = runs.plan_config(tiny_cfg(code_corpus, "train.steps=2"), run, resume=True)
    result = train_lib.run_plan(plan, show_progress=False)
    assert result.stopped_by == "done" and result.step == 2
    assert snapshot(run) == before


def test_plan_run_resolves_and_checks_before_any_work(tmp_path, corpus_dir, short_run):
    plan = runs.plan_run(tmp_path / "new", preset="tiny", overrides=[f"data.path={corpus_dir}", "train.steps=3"])
    assert (plan.resume, plan.checkpoint, plan.done) == (False, None, None)
    assert plan.cfg.train.steps == 3 and os.path.isabs(plan.cfg.data.path)
    assert not (tmp_path / "new").exists()  # planning writes nothing
    plan = runs.plan_run(short_run / "checkpoints", resume=True, overrides=["train.steps=2"])
    assert plan.run_dir == short_run and plan.checkpoint == latest_checkpoint(short_run)
    assert plan.done is not None and plan.done.step == 2  # already at its limit: nothing to do
    assert runs.plan_run(short_run, resume=True, overrides=["train.steps=5"]).done is None
    with pytest.raises(ValueError, match="--preset tiny is for a new run"):
        runs.plan_run(short_run, resume=True, preset="tiny")
    with pytest.raises(ValueError, match="already exists"):
        runs.plan_run(short_run, preset="tiny", overrides=[f"data.path={corpus_dir}", "train.steps=3"])


# --- the train state ----------------------------------------------------------------------------


def test_the_train_state_resumes_counters_loader_and_rng_from_its_state_dict(code_corpus):
    cfg = tiny_cfg(code_corpus)
    with torch.random.fork_rng():
        state = TrainState(ByteLoader(cfg.data, cfg.model), dist_lib.Dist(), step=7, bytes_seen=896,
                           elapsed_s=1.5, skipped_steps=1, bad_run=1, val_bpb=[2.0, 3.0])
        for _ in range(3):
            next(state.loader)
        torch.manual_seed(5)
        torch.rand(3)
        saved = json.loads(json.dumps(state.state_dict()))  # as train_state.json holds it
        want = [next(state.loader) for _ in range(3)], torch.rand(4)

        other = TrainState(ByteLoader(cfg.data, cfg.model), dist_lib.Dist())
        torch.manual_seed(6)
        other.load_state_dict(saved)
        got = [next(other.loader) for _ in range(3)], torch.rand(4)
    assert all(torch.equal(a, b) for a, b in zip(want[0], got[0])) and torch.equal(want[1], got[1])
    counters = ("step", "bytes_seen", "elapsed_s", "skipped_steps", "bad_run", "val_bpb")
    assert [getattr(other, k) for k in counters] == [7, 896, 1.5, 1, 1, [2.0, 3.0]]
    assert saved["world_size"] == 1 and len(saved["loaders"]) == len(saved["rngs"]) == 1
    two = {**saved, "loaders": saved["loaders"] * 2, "rngs": saved["rngs"] * 2}
    with pytest.raises(ValueError, match=r"saved by 2 process\(es\) and this run has 1"):
        other.load_state_dict(two)


def test_a_checkpoint_of_another_number_of_processes_is_refused_before_training(run, code_corpus):
    ckpt = latest_checkpoint(run)
    state = json.loads((ckpt / "train_state.json").read_text())
    state.update(world_size=2, loaders=state["loaders"] * 2, rngs=state["rngs"] * 2)
    (ckpt / "train_state.json").write_text(json.dumps(state))
    res = train_cli("--resume", run, "--steps", 3)
    assert res.exit_code == 1 and "Traceback" not in res.output
    errors = res.stderr.strip().splitlines()
    assert len(errors) == 1 and f"{ckpt}: it was saved by 2 process(es) and this run has 1" in errors[0], errors
    assert latest_checkpoint(run) == ckpt
