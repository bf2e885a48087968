"""The training loop (bytemtp.training.train): non-finite steps, failed saves, out of memory and
stops (the schedule and the time fit are in test_schedule.py). The `train` command's resume and errors are in test_train_cli.py.

Runs use the tiny preset on a small prepared corpus with a val split (conftest's `corpus_dir`);
they train in this process.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import types

import pytest
import torch
from train_runs import BATCH, BYTES_PER_STEP, SEQ_LEN, ckpt_step, cli, loss_lines, read_metrics, tiny_cfg

import bytemtp.training.train as train_lib
from bytemtp import config as config_lib
from bytemtp import config_io
from bytemtp.config import TrainConfig
from bytemtp.data.loader import ByteLoader
from bytemtp.model.model import ByteMTP
from bytemtp.runtime.checkpoint import CheckpointError, latest_checkpoint, list_checkpoints, load_train_state
from bytemtp.training import runs
from bytemtp.training.schedule import lr_scale
from bytemtp.training.rollout import greedy_rollout

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
    cfg = tiny_cfg(corpus_dir, "train.steps=30", "train.ckpt_every=10", "model.seq_len=16")  # short windows: faster
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
    cfg = tiny_cfg(corpus_dir, "train.steps=30", "train.ckpt_every=10", "model.seq_len=16")  # short windows: faster
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
    cfg = config_io.from_dict(config_lib.Config, json.loads((run / "run-config.json").read_text()))
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
        assert r["lr"] == cfg.train.lr * lr_scale(r["step"] - 1, cfg.train, final)
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


# --- 6b. self-generated targets reach the step ----------------------------------------------------


def test_the_step_trains_on_each_batch_with_its_rollout(tmp_path, corpus_dir, monkeypatch):
    """With loss.rollout_bytes, the batch that the step function gets is the loader's batch with
    its end written by the model (`greedy_rollout` of it), and the model that then trains with
    dropout is back in training mode."""
    seen = []
    real = train_lib.forward_backward

    def forward_backward(model, batch, **kw):
        seen.append((model, batch.clone(), model.training))
        return real(model, batch, **kw)

    monkeypatch.setattr(train_lib, "forward_backward", forward_backward)
    cfg = tiny_cfg(corpus_dir, "train.steps=2", "model.n_future=4", "model.dropout=0.1",
                   "train.trainable=draft-heads", "loss.rollout_bytes=16")
    train_lib.train(cfg, tmp_path / "run", show_progress=False, say=lambda m: None)
    loader = ByteLoader(cfg.data, cfg.model)
    assert len(seen) == 2
    for step, (model, batch, training) in enumerate(seen, 1):
        raw = next(loader)
        assert training, step
        assert not torch.equal(batch, raw), f"step {step} trained on the corpus's bytes"
        # the trunk and head 1 are frozen: a rollout after the run is the one the step saw
        assert torch.equal(batch, greedy_rollout(model, raw, 16)), step
