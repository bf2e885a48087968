"""Host transfers in the training loop (bytemtp.training.train, .faults, .figures): a step that neither
logs, validates nor saves makes the host wait for nothing (no read, no data-dependent shape, no
synchronous copy of its batch), counted with `HostTransfers` over the real loop on the stand-in
accelerator (`runtime.standin`); a logged step reads twice (the skip verdicts and the figures, one transfer each). The
optimizer is built as on CUDA (fused AdamW, or Muon beside it), the one that skips a non-finite
step on the device; the skip on the device equals the skip read at once, step for step, and so
does the stop after train.max_bad_steps in a row.
"""

from __future__ import annotations

import pytest
import torch
from train_runs import loss_lines, read_metrics, tiny_cfg

import bytemtp.training.train as train_lib
from bytemtp.runtime.host import HostTransfers
from bytemtp.runtime.standin import StandIn
from bytemtp.training import faults, optimizer
from bytemtp.training.figures import StepFigures, read_figures

QUIET = {"show_progress": False, "say": lambda m: None}


def _as_on_cuda(monkeypatch) -> list:
    """build_optimizer as on CUDA (fused AdamW); returns the optimizers built."""
    built = []

    def build(model, cfg, device):
        built.append(optimizer.build_optimizer(model, cfg, device, fused=True))
        return built[-1]

    monkeypatch.setattr(train_lib, "build_optimizer", build)
    return built


@pytest.mark.parametrize("opt", ["adamw", "muon"])
def test_steps_that_neither_log_validate_nor_save_read_nothing_from_the_device(tmp_path, corpus_dir, monkeypatch,
                                                                                opt):
    _as_on_cuda(monkeypatch)
    reads = HostTransfers()
    marks = []  # (reads, syncs and copies, sites) as each step's work begins
    real = train_lib.accumulate_gradients

    def step_work(*args, **kwargs):
        marks.append((reads.reads, reads.syncs + reads.copies, reads.sites.copy()))
        return real(*args, **kwargs)

    monkeypatch.setattr(train_lib, "accumulate_gradients", step_work)
    cfg = tiny_cfg(corpus_dir, "train.steps=7", "train.log_every=4", "train.eval_every=0", "train.ckpt_every=1000",
                   f"train.optimizer={opt}", "model.seq_len=16", "train.device=standin")
    with StandIn(), reads:
        train_lib.train(cfg, tmp_path / "run", **QUIET)
    # between the starts of steps k and k + 1: step k's work and the loop's bookkeeping after it
    per_step = [(b[0] - a[0], b[1] - a[1], dict(b[2] - a[2])) for a, b in zip(marks, marks[1:])]
    logged = {4}
    for k, (n_reads, n_waits, sites) in enumerate(per_step, start=1):
        expected = 2 if k in logged else 0
        assert (n_reads, n_waits) == (expected, 0), f"step {k}: {sites}"
    assert set(per_step[3][2]) == {next(s for s in per_step[3][2] if "settle" in s),
                                   next(s for s in per_step[3][2] if "read_figures" in s)}


def _poisoned(monkeypatch, *, calls=(), from_call=None) -> None:
    """Make chosen forward_backward calls (0-based) give NaN gradients and a NaN loss."""
    real, seen = train_lib.forward_backward, []

    def forward_backward(model, batch, **kw):
        i = len(seen)
        seen.append(i)
        out = real(model, batch, **kw)
        if i in calls or (from_call is not None and i >= from_call):
            for p in model.parameters():
                p.grad.fill_(float("nan"))
            out.total = torch.full((), float("nan"))
        return out

    monkeypatch.setattr(train_lib, "forward_backward", forward_backward)


def _run(tmp_path, corpus_dir, monkeypatch, name, *sets, on_device: bool):
    """A run with the optimizer of CUDA, its skips decided on the device or read at once."""
    built = _as_on_cuda(monkeypatch)
    if not on_device:
        monkeypatch.setattr(faults, "skips_on_device", lambda o: False)
    messages = []
    cfg = tiny_cfg(corpus_dir, "train.eval_every=0", "model.seq_len=16", *sets)
    error = None
    try:
        train_lib.train(cfg, tmp_path / name, show_progress=False, say=messages.append)
    except faults.TrainingError as e:
        error = str(e)
    monkeypatch.undo()
    return [p.detach().clone() for g in built[-1].param_groups for p in g["params"]], messages, error


@pytest.mark.parametrize("opt", ["adamw", "muon"])
def test_a_step_skipped_on_the_device_equals_one_skipped_at_once(tmp_path, corpus_dir, monkeypatch, opt):
    sets = ("train.steps=8", "train.log_every=3", "train.ckpt_every=1000", f"train.optimizer={opt}")
    runs = {}
    for on_device in (True, False):
        _poisoned(monkeypatch, calls={1, 4})
        runs[on_device] = _run(tmp_path, corpus_dir, monkeypatch, f"run-{on_device}", *sets, on_device=on_device)
    (device_params, device_said, device_error), (host_params, host_said, host_error) = runs[True], runs[False]
    assert device_error is None and host_error is None
    assert all(torch.equal(a, b) for a, b in zip(device_params, host_params))
    assert [m for m in device_said if "non-finite" in m] == [m for m in host_said if "non-finite" in m] == [
        "step 2: non-finite loss or gradient, step skipped (1 in a row)",
        "step 5: non-finite loss or gradient, step skipped (1 in a row)"]
    lines = {k: loss_lines(read_metrics(tmp_path / f"run-{k}")) for k in (True, False)}
    figures = ("step", "loss", "head_loss", "head_acc", "grad_norm", "skipped_steps")
    assert [[r[f] for f in figures] for r in lines[True]] == [[r[f] for f in figures] for r in lines[False]]
    assert [r["skipped_steps"] for r in lines[True]] == [1, 2, 2]  # steps 3, 6 and 8 log


def test_a_run_that_goes_bad_stops_with_the_state_of_its_last_bad_step(tmp_path, corpus_dir, monkeypatch):
    # steps 4, 5 and 6 bad, 3 in a row at most; the device's verdicts are read at step 10 (it logs),
    # the host's at once: both stop with the weights that the 3rd step left
    sets = ("train.steps=20", "train.log_every=10", "train.ckpt_every=1000", "train.max_bad_steps=3")
    runs = {}
    for on_device in (True, False):
        _poisoned(monkeypatch, calls={3, 4, 5})  # then good again: the device latch holds the run
        runs[on_device] = _run(tmp_path, corpus_dir, monkeypatch, f"run-{on_device}", *sets, on_device=on_device)
    (device_params, device_said, device_error), (host_params, host_said, host_error) = runs[True], runs[False]
    assert device_error.replace("run-True", "run-False") == host_error and "max_bad_steps=3" in host_error
    assert [m for m in device_said if "non-finite" in m] == [m for m in host_said if "non-finite" in m]
    assert len([m for m in device_said if "non-finite" in m]) == 3
    assert all(torch.equal(a, b) for a, b in zip(device_params, host_params))


def test_figures_read_in_one_transfer_are_the_values_of_each_tensor():
    g = torch.Generator().manual_seed(0)
    figures = StepFigures(total=torch.rand((), generator=g) * 7, head_loss=torch.rand(4, generator=g),
                          head_accuracy=torch.rand(4, generator=g), head_agreement=torch.rand(4, generator=g),
                          head_kl=None)
    norm = torch.rand((), generator=g)
    with StandIn() as device:
        on_device = StepFigures(**{k: v if v is None else v.to(device) for k, v in vars(figures).items()})
        norm_on_device = norm.to(device)
        with HostTransfers() as reads:
            got = read_figures(on_device, norm_on_device)
    assert (reads.reads, reads.syncs, reads.copies) == (1, 0, 0), reads.sites
    assert got.total == figures.total.item() and got.grad_norm == norm.item()
    assert got.head_loss == figures.head_loss.tolist() and got.head_accuracy == figures.head_accuracy.tolist()
    assert got.head_agreement == figures.head_agreement.tolist() and got.head_kl is None


def test_the_device_skip_needs_an_optimizer_that_can_cancel_a_step():
    params = [torch.nn.Parameter(torch.ones(4, 4))]
    assert not optimizer.skips_on_device(torch.optim.AdamW(params))  # the CPU's foreach AdamW: read at once
    assert optimizer.skips_on_device(torch.optim.AdamW(params, fused=True))
    assert not optimizer.skips_on_device(torch.optim.Muon(params))
    mixed = optimizer.Mixed(adamw=torch.optim.AdamW(params, fused=True), muon=optimizer.BatchedMuon(params))
    assert optimizer.skips_on_device(mixed)
    assert optimizer.adamw_fused(torch.device("cuda")) and not optimizer.adamw_fused(torch.device("cpu"))
