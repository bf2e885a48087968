"""What a training step measured (its loss, each head's loss, accuracy, agreement with head 1
and teacher divergence, the gradient norm), kept on the device and read to the host once per
logged step.

Each read of a device tensor (`item`, `tolist`, `float(t)`) makes the host wait until the GPU
has run everything queued before it; one a step keeps the GPU idle while the host queues the
next step's first kernels. So the loop keeps the figures of its latest step as tensors, and
`read_figures` turns them into Python numbers in one transfer at the steps that log
(train.log_every): the values that reading each tensor on its own would give (float32 figures
read through float64, exactly). `LogClock` times the steps between two logged steps, each of
which waits for the device, so the rate logged is the device's, not the host's queueing rate.

`accumulate_gradients` is the step's forward and backward over its micro-batches, with the
figures averaged over them and the ranks.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from bytemtp.model.model import ByteMTP
from bytemtp.runtime import distributed as dist_lib


@dataclass
class StepFigures:
    """One optimizer step's loss and per-head figures, averaged over micro-batches and ranks;
    agreement with head 1 and the teacher KL where the step counted them."""

    total: torch.Tensor
    head_loss: torch.Tensor
    head_accuracy: torch.Tensor
    head_agreement: torch.Tensor | None
    head_kl: torch.Tensor | None


def accumulate_gradients(model: ByteMTP, wrapped, batches, *, step_fn, loss_cfg, accum: int,
                         d: dist_lib.Dist, autocast=contextlib.nullcontext(),
                         weights: list[float] | None = None) -> StepFigures:
    """Forward and backward of one optimizer step's `accum` micro-batches (the heads' loss weights
    `weights`, default loss.head_weights's), with the gradients reduced once over the ranks; the
    figures averaged over the micro-batches and the ranks."""
    outs = []
    for micro, batch in enumerate(batches):
        with autocast, dist_lib.gradient_sync(wrapped, last=micro == accum - 1):
            outs.append(step_fn(model, batch, loss_cfg=loss_cfg, scale=1 / accum, weights=weights))

    def averaged(name):
        values = [getattr(o, name) for o in outs]
        return None if values[0] is None else dist_lib.mean(sum(values) / len(values), d)

    dist_lib.reduce_gradients(wrapped, d)
    return StepFigures(*(averaged(name) for name in ("total", "head_loss", "head_accuracy", "head_agreement",
                                                     "head_kl")))


@dataclass(frozen=True)
class ReadFigures:
    """A step's figures as Python numbers (`read_figures`)."""

    total: float
    head_loss: list[float]
    head_accuracy: list[float]
    head_agreement: list[float] | None
    head_kl: list[float] | None
    grad_norm: float


def read_figures(figures: StepFigures, grad_norm: torch.Tensor) -> ReadFigures:
    """The figures and the gradient norm on the host, in one device-to-host transfer."""
    parts = [figures.total, figures.head_loss, figures.head_accuracy, figures.head_agreement, figures.head_kl,
             grad_norm]
    held = [p for p in parts if p is not None]
    flat = torch.cat([p.detach().reshape(-1).to(device=held[0].device, dtype=torch.float64) for p in held]).tolist()
    values, at = [], 0
    for p in parts:
        n = 0 if p is None else p.numel()
        values.append(None if p is None else flat[at:at + n])
        at += n
    total, head_loss, head_accuracy, head_agreement, head_kl, norm = values
    return ReadFigures(total=total[0], head_loss=head_loss, head_accuracy=head_accuracy,
                       head_agreement=head_agreement, head_kl=head_kl, grad_norm=norm[0])


class LogClock:
    """Seconds of training between logged steps: from the last logged step (or the session's
    start) to this one, less the time spent validating and saving in between (`paused`), on the
    clock `now`."""

    def __init__(self, start: float, step: int, *, now=time.perf_counter):
        self.mark, self.step, self.paused_s, self.now = start, step, 0.0, now

    @contextlib.contextmanager
    def paused(self):
        t0 = self.now()
        try:
            yield
        finally:
            self.paused_s += self.now() - t0

    def lap(self, step: int) -> tuple[float, int]:
        """Seconds and steps since the last lap; starts the next."""
        now = self.now()
        seconds, steps = now - self.mark - self.paused_s, step - self.step
        self.mark, self.step, self.paused_s = now, step, 0.0
        return seconds, steps
