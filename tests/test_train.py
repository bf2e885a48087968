"""The training loop: exact resume after SIGKILL, SIGTERM, non-finite steps, failed saves, stops,
the learning-rate schedule and the `train` command's errors.

Runs use the tiny preset on a small prepared corpus with a val split. The subprocess tests (the
kill and the signal) cost a torch import each, so there are five subprocesses in all; everything
else trains in this process.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file
from train_runs import BATCH, BYTES_PER_STEP, SEQ_LEN, ckpt_step, cli, loss_lines, read_metrics, tiny_cfg

import bytemtp.training.train as train_lib
from bytemtp import config as config_lib
from bytemtp.config import TrainConfig
from bytemtp.model.model import ByteMTP
from bytemtp.runtime.checkpoint import CheckpointError, latest_checkpoint, list_checkpoints, load_train_state
from bytemtp.training import runs
from bytemtp_cli.main import main
from bytemtp_cli.options import parse_duration, parse_size

TIMING_KEYS = ("bytes_per_s", "elapsed_s")


# --- helpers ---------------------------------------------------------------------------------


def cli_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "bytemtp_cli", "train", *args]


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


def start_cli(args: list[str], log: Path) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(cli_cmd(*args), stdout=f, stderr=subprocess.STDOUT)


def signal_at_step(proc: subprocess.Popen, run_dir: Path, step: int, log: Path, sig: int) -> None:
    """Send `sig` once the run has logged `step`, and wait for it to end (killed if it hangs)."""
    try:
        wait_for_step(proc, run_dir, step, log)
        assert proc.poll() is None, "the run finished before the signal could be sent"
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def wait_for_step(proc: subprocess.Popen, run_dir: Path, step: int, log: Path, timeout: float = 120) -> int:
    """Poll metrics.jsonl until a complete line with a step >= `step` appears; return that step."""
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the run ended (status {proc.returncode}) before step {step}:\n"
                        f"{log.read_text()[-3000:]}")
        if metrics.exists():
            for line in reversed(metrics.read_text().splitlines()):
                try:
                    reached = json.loads(line)["step"]
                except ValueError:  # the line being written
                    continue
                if reached >= step:
                    return reached
                break
        time.sleep(0.005)
    proc.kill()
    pytest.fail(f"no step {step} in {metrics} after {timeout} s")


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
def test_resume_after_sigkill_equals_uninterrupted_run_bit_for_bit(tmp_path, corpus_dir):
    steps = 80
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    sets = ("train.ckpt_every=10", "model.dropout=0.1")  # dropout: the RNG state must resume too
    run_cli(new_run_args(corpus_dir, run_a, steps, *sets), tmp_path / "a.log")

    # killed once its first checkpoint is saved and a step after it is logged (a step that the
    # resumed run takes again): the kill waits for what it needs, whatever the machine's speed,
    # and lands some 70 steps before the end
    log = tmp_path / "b.log"
    proc = start_cli(new_run_args(corpus_dir, run_b, steps, *sets), log)
    try:
        saved = wait_for_checkpoint(proc, run_b, log)
        wait_for_step(proc, run_b, saved + 1, log)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
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
    proc = start_cli(new_run_args(corpus_dir, run, 100000, "train.ckpt_every=100000"), log)
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


# --- 3. non-finite steps are skipped, then abort -------------------------------------------------


def _snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
             for i, s in optimizer.state_dict()["state"].items()}
    return {"params": params, "optim": state}


def _same(a: dict, b: dict) -> bool:
    if a["params"].keys() != b["params"].keys() or a["optim"].keys() != b["optim"].keys():
        return False
    if not all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"]):
        return False
    return all(a["optim"][i].keys() == b["optim"][i].keys()
               and all(torch.equal(a["optim"][i][k], b["optim"][i][k]) for k in a["optim"][i])
               for i in a["optim"])


def poison(monkeypatch, calls: set[int] | None, *, kind: str = "both",
           from_call: int | None = None) -> list[dict]:
    """Make chosen forward_backward calls (0-based) non-finite; return the model and optimizer
    state captured at the start of every call."""
    real_fb, real_opt = train_lib.forward_backward, train_lib.build_optimizer
    optimizers, snapshots = [], []

    def build_optimizer(model, cfg, device):
        optimizers.append(real_opt(model, cfg, device))
        return optimizers[-1]

    def forward_backward(model, batch, **kw):
        i = len(snapshots)
        snapshots.append(_snapshot(model, optimizers[-1]))
        out = real_fb(model, batch, **kw)
        if (calls is not None and i in calls) or (from_call is not None and i >= from_call):
            if kind in ("grad", "both"):
                for p in model.parameters():
                    p.grad.fill_(float("nan"))
            if kind in ("loss", "both"):
                out = dataclasses.replace(out, total=torch.tensor(float("nan")))
        return out

    monkeypatch.setattr(train_lib, "build_optimizer", build_optimizer)
    monkeypatch.setattr(train_lib, "forward_backward", forward_backward)
    return snapshots


@pytest.mark.parametrize("kind", ["loss", "grad", "both"])
def test_a_non_finite_step_is_skipped_without_any_update(tmp_path, corpus_dir, monkeypatch, kind):
    snapshots = poison(monkeypatch, {4}, kind=kind)  # the 5th step
    messages = []
    cfg = tiny_cfg(corpus_dir, "train.steps=8", "train.ckpt_every=1000")
    rng_before, sigterm_before = torch.get_rng_state(), signal.getsignal(signal.SIGTERM)
    result = train_lib.train(cfg, tmp_path / "run", show_progress=False, say=messages.append)
    assert result.step == 8 and result.stopped_by == "steps"
    assert len(snapshots) == 8
    assert not _same(snapshots[3], snapshots[4]), "a good step changes the parameters"
    assert _same(snapshots[4], snapshots[5]), "the skipped step changed the parameters or optimizer state"
    assert not _same(snapshots[5], snapshots[6]), "training goes on after the skipped step"
    assert all(torch.isfinite(p).all() for p in snapshots[-1]["params"].values())
    assert sum("non-finite" in m for m in messages) == 1
    assert json.loads((result.checkpoint / "train_state.json").read_text())["skipped_steps"] == 1
    lines = loss_lines(read_metrics(tmp_path / "run"))
    assert [r["skipped_steps"] for r in lines] == [0, 0, 0, 0, 1, 1, 1, 1]
    # the caller's RNG and signal handlers are as they were
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert signal.getsignal(signal.SIGTERM) is sigterm_before


def test_non_finite_steps_in_a_row_abort_after_max_bad_steps(tmp_path, corpus_dir, monkeypatch):
    snapshots = poison(monkeypatch, None, from_call=4)  # every step from the 5th on
    messages = []
    cfg = tiny_cfg(corpus_dir, "train.steps=20", "train.ckpt_every=2", "train.max_bad_steps=3")
    with pytest.raises(train_lib.TrainingError, match=r"max_bad_steps=3"):
        train_lib.train(cfg, tmp_path / "run", show_progress=False, say=messages.append)
    assert len(snapshots) == 7  # steps 5, 6 and 7 were bad; no 8th step was tried
    assert sum("non-finite" in m for m in messages) == 3
    assert latest_checkpoint(tmp_path / "run") is not None


def test_bad_steps_not_in_a_row_do_not_abort(tmp_path, corpus_dir, monkeypatch):
    poison(monkeypatch, {2, 4, 6})
    cfg = tiny_cfg(corpus_dir, "train.steps=8", "train.ckpt_every=1000", "train.max_bad_steps=2")
    result = train_lib.train(cfg, tmp_path / "run", show_progress=False, say=lambda m: None)
    assert result.step == 8
    assert json.loads((result.checkpoint / "train_state.json").read_text())["skipped_steps"] == 3


def test_skip_message_names_the_step_that_metrics_show_as_non_finite(tmp_path, corpus_dir, monkeypatch):
    poison(monkeypatch, {4}, kind="loss")
    messages = []
    cfg = tiny_cfg(corpus_dir, "train.steps=6", "train.ckpt_every=1000")
    train_lib.train(cfg, tmp_path / "run", show_progress=False, say=messages.append)
    # non-finite numbers are written as null
    bad = [r["step"] for r in loss_lines(read_metrics(tmp_path / "run")) if r["loss"] is None]
    assert bad == [5]
    # metrics, checkpoints and validation messages count a step as done after it; so should this
    assert [m.split(":")[0] for m in messages if "non-finite" in m] == ["step 5"]


# --- 4. a failing save ---------------------------------------------------------------------------


def flaky_save(monkeypatch, fails) -> list[int]:
    """save_checkpoint that raises CheckpointError on the calls for which fails(call, step) is true."""
    real = train_lib.save_checkpoint
    calls = []

    def save_checkpoint(run_dir, *, step, **kw):
        calls.append(step)
        if fails(len(calls), step):
            previous = latest_checkpoint(run_dir)
            raise CheckpointError(f"saving checkpoint step-{step:08d} failed ([Errno 28] No space left "
                                  f"on device); the previous checkpoint {previous} is intact")
        return real(run_dir, step=step, **kw)

    monkeypatch.setattr(train_lib, "save_checkpoint", save_checkpoint)
    return calls


def test_a_failed_periodic_save_warns_and_the_run_goes_on(tmp_path, corpus_dir, monkeypatch):
    calls = flaky_save(monkeypatch, lambda call, step: call == 2)
    messages = []
    run = tmp_path / "run"
    cfg = tiny_cfg(corpus_dir, "train.steps=30", "train.ckpt_every=10")
    result = train_lib.train(cfg, run, show_progress=False, say=messages.append)
    assert result.step == 30 and calls == [10, 20, 30]
    warnings = [m for m in messages if m.startswith("warning")]
    assert len(warnings) == 1 and "is intact" in warnings[0] and "goes on" in warnings[0]
    assert [ckpt_step(p) for p in list_checkpoints(run)] == [10, 30]
    assert result.checkpoint == list_checkpoints(run)[-1]
    model = ByteMTP(cfg.model)
    assert load_train_state(list_checkpoints(run)[0], model=model)["step"] == 10


def test_a_failed_final_save_is_an_error(tmp_path, corpus_dir, monkeypatch):
    calls = flaky_save(monkeypatch, lambda call, step: step == 30)
    run = tmp_path / "run"
    cfg = tiny_cfg(corpus_dir, "train.steps=30", "train.ckpt_every=10")
    with pytest.raises(train_lib.TrainingError, match="is intact"):
        train_lib.train(cfg, run, show_progress=False, say=lambda m: None)
    assert calls == [10, 20, 30, 30]  # the periodic save at the last step, then the final one
    assert [ckpt_step(p) for p in list_checkpoints(run)] == [10, 20]


def test_a_full_disk_at_the_final_save_is_one_line(tmp_path, corpus_dir, short_run, monkeypatch):
    import errno

    import bytemtp.runtime.checkpoint

    def full(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\x10\x00")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(bytemtp.runtime.checkpoint, "save_file", full)
    res = cli("--resume", short_run, "--steps", 3)
    assert res.exit_code == 1 and "Traceback" not in res.output
    errors = [line for line in res.stderr.splitlines() if "Error" in line]  # the progress bar goes there too
    assert len(errors) == 1 and "the disk is full" in errors[0] and "step-00000002 is intact" in errors[0]
    assert [p.name for p in (short_run / "checkpoints").iterdir()] == ["step-00000002"]


# --- 4b. out of memory ---------------------------------------------------------------------------


NO_MEMORY = {  # what the CPU allocator and CUDA raise
    "cpu": lambda: RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate "
                                "memory: you tried to allocate 2147483648 bytes. Error code 12 (Cannot allocate "
                                "memory)"),
    "cuda": lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                                           "capacity of 79.19 GiB of which 1.12 GiB is free."),
    "other": lambda: RuntimeError("mat1 and mat2 shapes cannot be multiplied"),
}


def fail_at_call(monkeypatch, call: int, kind: str, *, name: str = "forward_backward") -> None:
    """Make the `call`-th call (1-based) of train's `name` raise NO_MEMORY[kind]."""
    real, calls = getattr(train_lib, name), []

    def failing(*args, **kw):
        calls.append(1)
        if len(calls) == call:
            raise NO_MEMORY[kind]()
        return real(*args, **kw)

    monkeypatch.setattr(train_lib, name, failing)


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_a_step_out_of_memory_stops_saying_what_to_lower_and_saves_nothing(tmp_path, corpus_dir, monkeypatch,
                                                                           kind):
    fail_at_call(monkeypatch, 6, kind)  # the 6th step
    run = tmp_path / "run"
    with pytest.raises(train_lib.OutOfMemory) as info:
        train_lib.train(tiny_cfg(corpus_dir, "train.steps=10", "train.ckpt_every=4"), run, show_progress=False,
                        say=lambda m: None)
    message = str(info.value)
    for words in ("out of memory on cpu in step 6 (an allocation of 2.00 GiB failed): ",
                  f"data.batch_size={BATCH} windows of model.seq_len={SEQ_LEN}", "train.grad_accum=1",
                  "lower data.batch_size", "or model.seq_len", "step 6 was not saved and the newest checkpoint",
                  "step-00000004 is intact"):
        assert words in message, (words, message)
    assert "memory_efficient" not in message  # it is on already
    assert "\n" not in message
    assert [ckpt_step(p) for p in list_checkpoints(run)] == [4]
    assert [r["step"] for r in loss_lines(read_metrics(run))] == [1, 2, 3, 4, 5]
    runs.check_unlocked(run)  # released


def test_out_of_memory_in_a_plain_accumulated_step_also_names_the_memory_efficient_step(tmp_path, corpus_dir,
                                                                                          monkeypatch):
    fail_at_call(monkeypatch, 3, "cpu", name="plain_forward_backward")  # step 2, its first micro-batch
    run = tmp_path / "run"
    cfg = tiny_cfg(corpus_dir, "train.steps=4", "train.grad_accum=2", "train.memory_efficient=false")
    with pytest.raises(train_lib.OutOfMemory) as info:
        train_lib.train(cfg, run, show_progress=False, say=lambda m: None)
    message = str(info.value)
    for words in ("in step 2 (an allocation of 2.00 GiB failed)", "train.grad_accum=2 a step",
                  "set train.memory_efficient=true", "no checkpoint was saved before"):
        assert words in message, (words, message)
    assert list_checkpoints(run) == [] and [r["step"] for r in loss_lines(read_metrics(run))] == [1]


def test_out_of_memory_in_a_validation_names_it(tmp_path, corpus_dir, monkeypatch):
    fail_at_call(monkeypatch, 1, "cuda", name="evaluate")
    run = tmp_path / "run"
    cfg = tiny_cfg(corpus_dir, "train.steps=6", "train.ckpt_every=2", "train.eval_every=3")
    with pytest.raises(train_lib.OutOfMemory, match="in the validation of step 3 .*step 3 was not saved"):
        train_lib.train(cfg, run, show_progress=False, say=lambda m: None)
    assert [ckpt_step(p) for p in list_checkpoints(run)] == [2]


def test_other_errors_of_a_step_are_not_taken_for_out_of_memory(tmp_path, corpus_dir, monkeypatch):
    fail_at_call(monkeypatch, 2, "other")
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as info:
        train_lib.train(tiny_cfg(corpus_dir, "train.steps=4"), tmp_path / "run", show_progress=False,
                        say=lambda m: None)
    assert not isinstance(info.value, train_lib.TrainingError)


def test_the_train_command_shows_out_of_memory_as_one_line(tmp_path, corpus_dir, short_run, monkeypatch):
    fail_at_call(monkeypatch, 2, "cpu")
    res = cli("--resume", short_run, "--steps", 5)
    assert res.exit_code == 1 and "Traceback" not in res.output
    errors = [line for line in res.stderr.splitlines() if "Error" in line]  # the progress bar goes there too
    assert len(errors) == 1, errors
    assert errors[0].startswith("Error: out of memory on cpu in step 4 (an allocation of 2.00 GiB failed): ")
    assert "step-00000002 is intact" in errors[0]
    assert [ckpt_step(p) for p in list_checkpoints(short_run)] == [2]


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
                                    "--max-bytes", "8", "--batch-sizes", "1", "--modes", "auto", "--rounds", "1",
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


def test_train_prints_a_header_and_the_next_byte_loss(tmp_path, corpus_dir):
    import re

    run = tmp_path / "run"
    res = cli("--preset", "tiny", "--data", corpus_dir, "--out", run, "--steps", 3,
              "--set", f"data.batch_size={BATCH}", "--set", "train.log_every=1", "--device", "cpu")
    assert res.exit_code == 0, res.output
    assert "{" not in res.stdout  # the config is in the run directory, not on the screen
    params = ByteMTP(config_lib.tiny().model).num_params()
    for words in (f"run      {run} (new", "run-config.json", f"corpus   {corpus_dir}", f"{params:,} parameters",
                  "device   cpu"):
        assert words in res.stdout, words
    saved = config_lib.from_dict(config_lib.Config, json.loads((run / "run-config.json").read_text()))
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


# --- 6. stops, checkpoints kept, metrics ---------------------------------------------------------


@pytest.mark.parametrize("size,budget", [("2k", 2000), ("2048", 2048)])  # between steps, on a step
def test_bytes_budget_keeps_two_checkpoints_and_logs_every_metric(tmp_path, corpus_dir, size, budget):
    run = tmp_path / "run"
    res = cli("--preset", "tiny", "--data", corpus_dir, "--out", run, "--bytes", size,
              "--set", f"data.batch_size={BATCH}", "--set", "train.log_every=1",
              "--set", "train.ckpt_every=3", "--set", "train.eval_every=4")
    assert res.exit_code == 0, res.output
    final = math.ceil(budget / BYTES_PER_STEP)
    assert final == 8  # the checkpoint and validation steps below assume it
    assert f"stopped by bytes at step {final} ({final * BYTES_PER_STEP:,} bytes)" in res.output
    assert [ckpt_step(p) for p in list_checkpoints(run)] == [final - 2, final]  # 6 and 8 of 3, 6, 8

    records = read_metrics(run)
    lines = loss_lines(records)
    assert [r["step"] for r in lines] == list(range(1, final + 1))
    cfg = config_lib.from_dict(config_lib.Config, json.loads((run / "run-config.json").read_text()))
    assert cfg.train.max_bytes == budget
    for r in lines:
        for key in ("step", "bytes", "loss", "bpb", "head_loss", "head_acc", "lr", "grad_norm",
                    "bytes_per_s", "skipped_steps", "elapsed_s", "data"):
            assert key in r, key
        assert r["bytes"] == r["step"] * BYTES_PER_STEP
        assert len(r["head_loss"]) == len(r["head_acc"]) == 8
        assert all(math.isfinite(x) and x > 0 for x in r["head_loss"])
        assert all(0 <= x <= 1 for x in r["head_acc"])
        assert r["bpb"] == pytest.approx(r["head_loss"][0] / math.log(2))
        assert r["lr"] == train_lib.lr_at(r["step"] - 1, cfg.train, final)
        assert r["grad_norm"] > 0 and r["bytes_per_s"] > 0 and r["skipped_steps"] == 0
        assert r["data"]["documents"] > 0 and r["data"]["bytes"] > 0 and r["data"]["skipped"] == {}
    assert lines[-2]["bytes"] < budget <= lines[-1]["bytes"]
    vals = [r for r in records if "val_bpb" in r]
    assert [r["step"] for r in vals] == [4, 8]
    for r in vals:
        assert len(r["val_bpb"]) == 8 and all(math.isfinite(b) and 0 < b < 16 for b in r["val_bpb"])
    state = json.loads((list_checkpoints(run)[-1] / "train_state.json").read_text())
    assert state["bytes_seen"] == final * BYTES_PER_STEP and state["val_bpb"] == vals[-1]["val_bpb"]


def test_time_limit_stops_and_saves(tmp_path, corpus_dir, monkeypatch):
    # a clock that moves only when a step does its work, by 0.125 s (exact in binary): the 1 s
    # limit then stops the run after exactly 8 steps, whatever the machine's speed
    now = [0.0]
    real = train_lib.accumulate_gradients

    def step_work(*args, **kwargs):
        figures = real(*args, **kwargs)
        now[0] += 0.125
        return figures

    monkeypatch.setattr(train_lib, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(train_lib, "accumulate_gradients", step_work)
    run = tmp_path / "run"
    res = cli("--preset", "tiny", "--data", corpus_dir, "--out", run, "--time", "1s",
              "--set", f"data.batch_size={BATCH}", "--set", "train.log_every=1",
              "--set", "train.ckpt_every=100000")
    assert res.exit_code == 0, res.output
    assert "stopped by time at step 8" in res.output
    lines = loss_lines(read_metrics(run))
    assert [r["elapsed_s"] for r in lines] == [0.125 * step for step in range(1, 9)]
    assert all(r["bytes_per_s"] == BYTES_PER_STEP / 0.125 for r in lines)
    assert ckpt_step(latest_checkpoint(run)) == 8


def test_resume_survives_a_torn_last_metrics_line(tmp_path, corpus_dir):
    # a run that died mid-write (a full disk, a crash) leaves a partial last line
    run = tmp_path / "run"
    cfg = tiny_cfg(corpus_dir, "train.steps=10", "train.ckpt_every=5")
    train_lib.train(cfg, run, show_progress=False, say=lambda m: None)
    for f in (run / "checkpoints" / "step-00000010").iterdir():
        f.unlink()
    (run / "checkpoints" / "step-00000010").rmdir()
    metrics = run / "metrics.jsonl"
    kept = metrics.read_text().splitlines()[:7]
    metrics.write_text("".join(line + "\n" for line in kept) + '{"step": 8, "bytes": 20')
    result = train_lib.train(cfg, run, resume=True, show_progress=False, say=lambda m: None)
    assert result.step == 10
    assert [r["step"] for r in loss_lines(read_metrics(run))] == list(range(1, 11))


# --- 7. the learning-rate schedule ----------------------------------------------------------------


def test_lr_warms_up_linearly_then_decays_by_cosine_to_the_floor():
    tc = TrainConfig(lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    horizon = 110
    floor = 1e-4
    for step in range(10):
        assert train_lib.lr_at(step, tc, horizon) == pytest.approx(1e-3 * (step + 1) / 10)
    assert train_lib.lr_at(9, tc, horizon) == pytest.approx(1e-3)  # the peak ends the warmup
    assert train_lib.lr_at(10, tc, horizon) == pytest.approx(1e-3)
    assert train_lib.lr_at(60, tc, horizon) == pytest.approx(floor + 0.5 * (1e-3 - floor))  # half way
    quarter = floor + (1e-3 - floor) * 0.5 * (1 + math.cos(math.pi / 4))
    assert train_lib.lr_at(35, tc, horizon) == pytest.approx(quarter)
    assert train_lib.lr_at(horizon, tc, horizon) == pytest.approx(floor)
    for step in (horizon + 1, 2 * horizon, 10**6):
        assert train_lib.lr_at(step, tc, horizon) == pytest.approx(floor)
    lrs = [train_lib.lr_at(s, tc, horizon) for s in range(10, horizon + 1)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:])) and lrs[0] > lrs[-1]
    ups = [train_lib.lr_at(s, tc, horizon) for s in range(10)]
    assert all(a < b for a, b in zip(ups, ups[1:]))


def test_lr_horizon_0_is_constant_after_warmup():
    tc = TrainConfig(lr=2e-3, warmup_steps=4, min_lr_ratio=0.1)
    assert [train_lib.lr_at(s, tc, 0) for s in range(4)] == pytest.approx([5e-4, 1e-3, 1.5e-3, 2e-3])
    assert all(train_lib.lr_at(s, tc, 0) == 2e-3 for s in (4, 5, 100, 10**6))


def test_schedule_horizon_follows_the_stop_condition():
    assert train_lib.schedule_horizon(TrainConfig(steps=500), 256) == 500
    assert train_lib.schedule_horizon(TrainConfig(steps=500, schedule_steps=800), 256) == 800
    assert train_lib.schedule_horizon(TrainConfig(max_bytes=2000), 256) == 8
    assert train_lib.schedule_horizon(TrainConfig(max_time=60.0), 256) == 0
