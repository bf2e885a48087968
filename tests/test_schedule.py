"""The schedules of training (bytemtp.training.schedule): the learning rate's shapes, its length, and
the fit of its length to a time budget, alone and in a run (a clock that moves only with the steps),
resumed; and the heads' weights over training."""

from __future__ import annotations

import json
import math
import re
import shutil
import types

import pytest
from train_runs import BATCH, ckpt_step, cli, loss_lines, read_metrics

import bytemtp.training.train as train_lib
from bytemtp.config import LossConfig, TrainConfig
from bytemtp.runtime.checkpoint import latest_checkpoint, list_checkpoints
from bytemtp.training import schedule
from bytemtp.training.schedule import TimeFit, head_weights, lr_scale, schedule_horizon

# --- shapes ------------------------------------------------------------------------------------


def test_lr_warms_up_linearly_then_decays_by_cosine_to_the_floor():
    tc = TrainConfig(warmup_steps=10, min_lr_ratio=0.1)
    horizon, floor = 110, 0.1
    for step in range(10):
        assert lr_scale(step, tc, horizon) == pytest.approx((step + 1) / 10)
    assert lr_scale(9, tc, horizon) == pytest.approx(1.0)  # the peak ends the warmup
    assert lr_scale(10, tc, horizon) == pytest.approx(1.0)
    assert lr_scale(60, tc, horizon) == pytest.approx(floor + 0.5 * (1 - floor))  # half way
    assert lr_scale(35, tc, horizon) == pytest.approx(floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi / 4)))
    for step in (horizon, horizon + 1, 2 * horizon, 10**6):
        assert lr_scale(step, tc, horizon) == pytest.approx(floor)
    lrs = [lr_scale(s, tc, horizon) for s in range(10, horizon + 1)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:])) and lrs[0] > lrs[-1]


def test_linear_decays_in_equal_steps_from_the_peak_to_the_floor():
    tc = TrainConfig(warmup_steps=10, min_lr_ratio=0.1, schedule="linear")
    assert lr_scale(10, tc, 110) == pytest.approx(1.0)
    assert lr_scale(60, tc, 110) == pytest.approx(0.55)
    assert lr_scale(110, tc, 110) == lr_scale(500, tc, 110) == pytest.approx(0.1)
    drops = [lr_scale(s, tc, 110) - lr_scale(s + 1, tc, 110) for s in range(10, 110)]
    assert drops == pytest.approx([0.9 / 100] * 100)


def test_wsd_holds_the_peak_then_decays_linearly_over_its_last_fraction():
    tc = TrainConfig(warmup_steps=10, min_lr_ratio=0.0, schedule="wsd", decay_fraction=0.25)
    horizon = 200  # decays over steps 150..200
    assert [lr_scale(s, tc, horizon) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert all(lr_scale(s, tc, horizon) == 1.0 for s in range(10, 151))
    assert lr_scale(175, tc, horizon) == pytest.approx(0.5)
    assert lr_scale(200, tc, horizon) == lr_scale(10**6, tc, horizon) == 0.0
    assert lr_scale(50, tc, 0) == 1.0  # no horizon: the peak after warmup, whatever the shape


def test_lr_horizon_0_is_constant_after_warmup():
    tc = TrainConfig(warmup_steps=4)
    assert [lr_scale(s, tc, 0) for s in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert all(lr_scale(s, tc, 0) == 1.0 for s in (4, 5, 100, 10**6))


def test_schedule_horizon_follows_the_stop_condition():
    assert schedule_horizon(TrainConfig(steps=500), 256) == 500
    assert schedule_horizon(TrainConfig(steps=500, schedule_steps=800), 256) == 800
    assert schedule_horizon(TrainConfig(max_bytes=2000), 256) == 8
    assert schedule_horizon(TrainConfig(max_time=60.0), 256) == 0  # TimeFit's to fit


def test_a_forward_head_schedule_lets_the_heads_join_one_by_one_over_its_span():
    loss = LossConfig(head_schedule="forward", head_schedule_span=0.6)  # 3 heads move, 0.2 each
    assert head_weights(loss, 4, 0.0) == [1.0, 0.0, 0.0, 0.0]
    assert head_weights(loss, 4, 0.1) == pytest.approx([1.0, 0.5, 0.0, 0.0])
    assert head_weights(loss, 4, 0.3) == pytest.approx([1.0, 1.0, 0.5, 0.0])
    assert head_weights(loss, 4, 0.6) == head_weights(loss, 4, 1.0) == [1.0] * 4
    geometric = LossConfig(head_schedule="forward", head_schedule_span=0.6, head_weights="geometric",
                           geometric_decay=0.5)
    assert head_weights(geometric, 4, 0.3) == pytest.approx([1.0, 0.5, 0.125, 0.0])  # times the base weights


def test_a_reverse_head_schedule_fades_the_farthest_head_first_to_its_floor():
    loss = LossConfig(head_schedule="reverse", head_schedule_span=0.6, head_schedule_floor=0.25)
    assert head_weights(loss, 4, 0.0) == [1.0] * 4
    assert head_weights(loss, 4, 0.1) == pytest.approx([1.0, 1.0, 1.0, 1 - 0.75 * 0.5])
    assert head_weights(loss, 4, 0.5) == pytest.approx([1.0, 1 - 0.75 * 0.5, 0.25, 0.25])
    assert head_weights(loss, 4, 0.6) == head_weights(loss, 4, 1.0) == pytest.approx([1.0, 0.25, 0.25, 0.25])
    assert head_weights(LossConfig(head_schedule="reverse"), 4, 0.5) == [1.0, 0.0, 0.0, 0.0]  # floor 0
    assert head_weights(LossConfig(), 4, 0.5) == [1.0] * 4 and head_weights(loss, 1, 0.5) == [1.0]


# --- the time fit --------------------------------------------------------------------------------


def test_time_fit_measures_then_answers_the_steps_the_time_left_buys():
    fit = TimeFit(TrainConfig(max_time=100.0, eval_every=0), limit=0, validates=True)
    times = [5.0, 2.0, 3.0] + [0.5] * 9  # the first SKIP_STEPS (warming up) are not measured
    for step, t in enumerate(times, 1):
        assert fit.observe(t, step=step, session_s=sum(times[:step])) is None
    # the 10th measured step: 5 s measured, over 2% of the budget
    spent = sum(times) + 0.5
    horizon = fit.observe(0.5, step=13, session_s=spent)
    assert horizon == 13 + int((100 - spent) * (1 - schedule.MARGIN) / 0.5)


def test_time_fit_uses_the_median_counts_validation_and_keeps_under_a_step_limit():
    cfg = TrainConfig(max_time=1000.0, eval_every=10, eval_batches=6)  # validation: 6/30 = 20% more
    fit = TimeFit(cfg, limit=0, validates=True)
    times = [1.0] * 3 + [1.5] * 12 + [2.0]  # the first steps are skipped; the median is the rate
    answers = [fit.observe(t, step=i, session_s=100.0) for i, t in enumerate(times, 1)]
    assert answers[:-1] == [None] * 15  # 2% of the budget is 20 s of measured steps
    assert answers[-1] == 16 + int(900 * (1 - schedule.MARGIN) / (1.5 * (1 + 6 / 30)))
    # a slow step (a validation) does not move the median, but what it took is counted, spread
    # over the steps measured, where it is more than validation's share on paper
    slow = TimeFit(cfg, limit=0, validates=True)
    times = [1.0] * 3 + [1.5] * 12 + [40.0]
    answers = [slow.observe(t, step=i, session_s=100.0) for i, t in enumerate(times, 1)]
    assert answers[-1] == 16 + int(900 * (1 - schedule.MARGIN) / (1.5 + (40.0 - 1.5) / 13))
    limited = TimeFit(cfg, limit=50, validates=False)
    got = [limited.observe(t, step=i, session_s=100.0) for i, t in enumerate(times, 1)]
    assert got[-1] == 50


# --- a run limited by time -------------------------------------------------------------------------


def _clock(monkeypatch, tick: float = 0.125) -> list[float]:
    """A clock that moves only when a step does its work: by `tick` a step."""
    now = [0.0]
    real = train_lib.accumulate_gradients

    def step_work(*args, **kwargs):
        figures = real(*args, **kwargs)
        now[0] += tick
        return figures

    monkeypatch.setattr(train_lib, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(train_lib, "accumulate_gradients", step_work)
    return now


def _timed_run(run, corpus_dir, *more):
    """A run of the tiny preset on a 10 s budget; windows of 16 bytes (what is tested is the schedule,
    and its steps cost a third less than at the preset's 64)."""
    return cli("--preset", "tiny", "--data", corpus_dir, "--out", run, "--time", "10s", "--set", "model.seq_len=16",
               "--set", f"data.batch_size={BATCH}", "--set", "train.log_every=1", "--set", "train.eval_every=0",
               "--set", "train.ckpt_every=20", "--set", "train.warmup_steps=5", *more)


@pytest.mark.slow
def test_a_time_budget_fits_the_schedule_so_the_decay_ends_with_the_time(tmp_path, corpus_dir, monkeypatch):
    _clock(monkeypatch)
    run = tmp_path / "run"
    res = _timed_run(run, corpus_dir)
    assert res.exit_code == 0, res.output
    # 0.125 s a step, measured after 13 steps (1.625 s): 8.375 s left, less 5%, buy 63 steps more
    fitted = 13 + int((10 - 13 * 0.125) * (1 - schedule.MARGIN) / 0.125)
    assert f"schedule is fitted to the time budget: {fitted} steps" in res.output
    assert f"stopped by schedule at step {fitted}" in res.output
    lines = loss_lines(read_metrics(run))
    tc = TrainConfig(warmup_steps=5)
    # the peak (after warmup) until the fit, then the fitted cosine
    horizons = [0 if r["step"] <= 13 else fitted for r in lines]
    assert [r["lr"] for r in lines] == pytest.approx([tc.lr * lr_scale(r["step"] - 1, tc, h)
                                                      for r, h in zip(lines, horizons)])
    assert lines[-1]["lr"] < 0.11 * tc.lr  # annealed to the floor, not cut off
    state = json.loads((latest_checkpoint(run) / "train_state.json").read_text())
    assert state["schedule_steps"] == fitted and state["step"] == fitted
    # resuming a run whose fitted schedule has ended changes nothing
    again = cli("--resume", run, "--time", "10s")
    assert again.exit_code == 0 and "already done" in again.output and "end of its schedule" in again.output


def test_a_step_limit_below_the_time_keeps_the_step_limit(tmp_path, corpus_dir, monkeypatch):
    _clock(monkeypatch)
    res = _timed_run(tmp_path / "run", corpus_dir, "--steps", "30")
    assert res.exit_code == 0, res.output
    assert "fitted to the time budget: 30 steps" in res.output and "stopped by steps at step 30" in res.output


@pytest.mark.slow  # a run of about 76 steps; test_a_fitted_run_resumes...[wsd-reverse] fits wsd in the quick suite
def test_a_wsd_schedule_is_fitted_where_its_decay_starts(tmp_path, corpus_dir, monkeypatch):
    _clock(monkeypatch)
    res = _timed_run(tmp_path / "run", corpus_dir, "--set", "train.schedule=wsd")
    assert res.exit_code == 0, res.output
    found = re.search(r"step (\d+): the schedule is fitted to the time budget: (\d+) steps", res.output)
    at, fitted = int(found[1]), int(found[2])
    decay_start = fitted - round(0.2 * fitted)
    assert decay_start - 1 <= at < decay_start  # not at step 13, as cosine is: the peak until then
    assert f"stopped by schedule at step {fitted}" in res.output
    lines = loss_lines(read_metrics(tmp_path / "run"))
    assert all(r["lr"] == 1e-3 for r in lines if 5 < r["step"] <= decay_start)
    assert lines[-1]["lr"] < 0.2e-3  # one step of the decay before its floor


@pytest.mark.slow  # a run of about 76 steps
def test_a_head_schedule_of_a_timed_wsd_run_follows_the_first_estimate(tmp_path, corpus_dir, monkeypatch):
    _clock(monkeypatch)
    run = tmp_path / "run"
    res = _timed_run(run, corpus_dir, "--set", "train.schedule=wsd", "--set", "loss.head_schedule=forward")
    assert res.exit_code == 0, res.output
    estimate = 13 + int((10 - 13 * 0.125) * (1 - schedule.MARGIN) / 0.125)  # as cosine's fit
    state = json.loads((latest_checkpoint(run) / "train_state.json").read_text())
    assert state["head_schedule_steps"] == estimate != state["schedule_steps"]
    loss = LossConfig(head_schedule="forward")
    for r in loss_lines(read_metrics(run)):  # step r["step"] ran at r["step"] - 1 steps done
        length = estimate if r["step"] > 13 else 0
        assert r["head_weights"] == pytest.approx(head_weights(loss, 8, (r["step"] - 1) / length if length else 0))
    assert r["head_weights"] == [1.0] * 8


# two runs of about 76 steps each (test_train keeps a resumed run in the quick suite)
@pytest.mark.parametrize("schedule_name,heads", [pytest.param("cosine", "constant", marks=pytest.mark.slow),
                                                 pytest.param("wsd", "constant", marks=pytest.mark.slow),
                                                 pytest.param("wsd", "reverse", marks=pytest.mark.slow)])
def test_a_fitted_run_resumes_on_the_same_schedule_bit_for_bit(tmp_path, corpus_dir, monkeypatch, schedule_name,
                                                               heads):
    _clock(monkeypatch)
    whole = tmp_path / "whole"
    pick = ("--set", f"train.schedule={schedule_name}", "--set", "model.dropout=0.1",
            "--set", "train.keep_checkpoints=20", "--set", "train.ckpt_every=10", "--set", f"loss.head_schedule={heads}",
            "--set", "loss.head_schedule_span=1.0")  # the heads' weights move until the end
    res = _timed_run(whole, corpus_dir, *pick)
    assert res.exit_code == 0, res.output
    fitted_at = int(re.search(r"step (\d+): the schedule is fitted", res.output)[1])
    fitted = ckpt_step(latest_checkpoint(whole))
    # the same run as if it had been stopped at its first checkpoint after the fit
    parts = tmp_path / "parts"
    shutil.copytree(whole, parts)
    resume_at = min(ckpt_step(c) for c in list_checkpoints(parts) if ckpt_step(c) > fitted_at)
    for ckpt in list_checkpoints(parts):
        if ckpt_step(ckpt) > resume_at:
            shutil.rmtree(ckpt)
    assert resume_at < fitted
    res = cli("--resume", parts, "--time", "10s")  # a new session: the fit is not measured again
    assert res.exit_code == 0, res.output
    assert "schedule is fitted" not in res.output and f"stopped by schedule at step {fitted}" in res.output
    a, b = loss_lines(read_metrics(whole)), loss_lines(read_metrics(parts))
    assert [r["step"] for r in b] == list(range(1, fitted + 1))
    assert [(r["loss"], r["lr"], r.get("head_weights")) for r in a] == [(r["loss"], r["lr"], r.get("head_weights"))
                                                                       for r in b]
    if heads == "reverse":
        assert a[-1]["head_weights"][-1] == 0.0 and any(0 < w < 1 for r in a for w in r["head_weights"])
        assert a[-1]["head_loss"][-1] is None  # skipped: NaN
