"""Non-finite steps: skipped, counted, and the run stopped after train.max_bad_steps in a row.

A step whose loss or gradient norm is not finite changes nothing (no parameter, moment or step
count). Deciding that on the host means reading the step's last figures, which on a GPU waits
for every kernel queued so far, once a step. So where the optimizer can cancel a step on the
device (`optimizer.skips_on_device`: fused AdamW, as built on CUDA, and `BatchedMuon`), the
verdict stays a device flag that cancels the update there (`optimizer.step_unless`), and
`StepGuard.settle` reads the verdicts of the steps since the last read in one transfer, at the
next step that logs, validates or saves (and at the end): it counts the skipped steps, says
which they were, and raises `TrainingError` at max_bad_steps in a row. A run that reaches that
count latches on the device, so every step after it is cancelled too, and the run stops with
the state it had after the last bad step, as if it had stopped at once; only the steps that
ran between the latch and the read cost time (at most train.log_every of them). Elsewhere (the
CPU's foreach AdamW) the verdict is read at once, each step: the reference, the behaviour the
guard keeps.
"""

from __future__ import annotations

from pathlib import Path

import torch

from bytemtp.training.optimizer import skips_on_device, step_unless
from bytemtp.training.train_state import TrainState


class TrainingError(RuntimeError):
    """The run cannot go on (too many non-finite steps, a failed final save, out of memory)."""


class StepGuard:
    """The optimizer's update of each step, or a skip where the step's loss or gradient norm is
    not finite; the counts in `state` (skipped_steps, bad_run), exact after each `settle`."""

    def __init__(self, optimizer, *, state: TrainState, max_bad_steps: int, say, checkpoints: Path):
        self.optimizer, self.state, self.max_bad, self.say = optimizer, state, max_bad_steps, say
        self.checkpoints = checkpoints
        self.on_device = skips_on_device(optimizer)
        self.verdicts: list[tuple[int, torch.Tensor]] = []  # (step, finite) not read yet
        self._bad_run = self._latched = None  # device counterparts of state.bad_run, drawn from it

    def step(self, total: torch.Tensor, grad_norm: torch.Tensor, *, step: int) -> None:
        """Update (step number `step`) unless `total` or `grad_norm` is not finite."""
        finite = torch.isfinite(total) & torch.isfinite(grad_norm)
        if not self.on_device:
            good = bool(finite)  # the reference: one read a step
            if good:
                self.optimizer.step()
            self._count(step, good)
            return
        if self._bad_run is None:  # a fill, not a copy from the host
            self._bad_run = torch.full((), self.state.bad_run, device=finite.device)
            self._latched = self._bad_run >= self.max_bad
        step_unless(self.optimizer, ~finite | self._latched)
        self._bad_run = torch.where(finite, 0, self._bad_run + 1)
        self._latched = self._latched | (self._bad_run >= self.max_bad)
        self.verdicts.append((step, finite))

    def settle(self) -> None:
        """Read the verdicts not read yet (one transfer) into the state's counts."""
        if not self.verdicts:
            return
        steps = [s for s, _ in self.verdicts]
        verdicts = torch.stack([f for _, f in self.verdicts]).tolist()
        self.verdicts, self._bad_run = [], None
        for step, good in zip(steps, verdicts):
            self._count(step, good)

    def _count(self, step: int, good: bool) -> None:
        st = self.state
        if good:
            st.bad_run = 0
            return
        st.skipped_steps, st.bad_run = st.skipped_steps + 1, st.bad_run + 1
        self.say(f"step {step}: non-finite loss or gradient, step skipped ({st.bad_run} in a row)")
        if st.bad_run >= self.max_bad:
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainingError(
                f"{st.bad_run} consecutive steps had a non-finite loss or gradient "
                f"(train.max_bad_steps={self.max_bad}); lower train.lr or check the data; "
                f"the last good checkpoint is in {self.checkpoints}")
