"""The schedules of training: the learning rate's length (`schedule_horizon`, or `TimeFit` for a
run limited by time) and shape (`lr_scale`), and the heads' weights (`head_weights`), functions of
the step alone so that a resumed run follows the same schedules.

Linear warmup to the peak, then cosine, linear or warmup-stable-decay (the peak held, then a linear
decay over the last train.decay_fraction of the schedule) down to train.min_lr_ratio of the peak at
the horizon. The horizon is train.schedule_steps, else train.steps, else the bytes budget. A run
limited by time alone (or by time before its step or bytes limit) has no horizon to start with, so
`TimeFit` measures the step rate over the run's first steps and fixes one from it (a wsd schedule
where its decay starts): the steps that the time left will buy, a little short of them so that
the decay ends before the clock does. The
run's state records the fitted length; a resumed run follows it, and the run stops when it is
reached. Until it is fixed the rate is the warmup's (or the peak once warmup is over), which does
not depend on the horizon, so a fitted run still resumes exactly.

The heads' weights (loss.head_schedule) follow the share of the schedule done: constant (the
paper's), forward (heads 2..n join one by one, each ramping up from 0; a curriculum that trains
the next byte first) or reverse (they fade one by one, the farthest first, to a floor: the model
ends as a next-byte model with heads beside it, as in modded-nanogpt's extra future-token terms).
A run limited by time needs their length before a wsd schedule has fixed its own, so it takes
`TimeFit.estimate`, the length the first measurement gives, and keeps it in its state.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from bytemtp.config import LossConfig, ModelConfig, TrainConfig

# Steps a session takes before TimeFit measures (allocations, caches and compilation warm up in
# them), and what it measures over: at least this many steps and this share of the time budget.
SKIP_STEPS = 3
MEASURE_STEPS = 10
MEASURE_SHARE = 0.02
RECENT_STEPS = 200  # the rate is the median of the latest steps measured (the machine's speed drifts)
# The fitted schedule aims to end this much before the time does: step times wander (a shared
# machine, a slower validation), and a schedule cut off before its end is what the fit is for.
MARGIN = 0.05
OUTLIER = 3.0  # a step this many times the typical one also validated, saved or compiled


def schedule_horizon(cfg: TrainConfig, bytes_per_step: int) -> int:
    """Steps over which warmup plus decay run when the settings fix them (0: not fixed: no decay
    after warmup, unless `TimeFit` fits one to the time budget)."""
    if cfg.schedule_steps:
        return cfg.schedule_steps
    if cfg.steps:
        return cfg.steps
    if cfg.max_bytes:
        return -(-cfg.max_bytes // bytes_per_step)
    return 0


def lr_scale(step: int, cfg: TrainConfig, horizon: int) -> float:
    """The fraction of each peak learning rate at `step`: linear warmup, then train.schedule's
    decay to train.min_lr_ratio at `horizon` (the peak throughout when horizon <= warmup)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if horizon <= cfg.warmup_steps:
        return 1.0
    floor = cfg.min_lr_ratio
    if cfg.schedule == "wsd":
        decay_steps = max(1, round(cfg.decay_fraction * horizon))
        progress = min(1.0, max(0.0, (step - (horizon - decay_steps)) / decay_steps))
        return 1.0 - (1.0 - floor) * progress
    progress = min(1.0, (step - cfg.warmup_steps) / (horizon - cfg.warmup_steps))
    if cfg.schedule == "linear":
        return 1.0 - (1.0 - floor) * progress
    return floor + (1.0 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


class TimeFit:
    """Fits a schedule's length to a session's time budget: told the wall time of each step of
    the session (`observe`), it answers the horizon once it has measured enough, else None.
    Cosine and linear decay from the end of warmup, so their length is fixed as soon as the rate
    is measured; wsd holds the peak until its decay, whatever its length, so it is fixed only when
    the decay must start, from the rate measured until then (a machine whose speed drifts in the
    first minutes misleads it less).

    The rate is the median of the latest RECENT_STEPS step times (a step that validated, saved
    or compiled is an outlier), raised by what those outliers added, spread over every step
    measured, or, where more, by the share that validation takes on paper (train.eval_batches
    forward passes every train.eval_every steps, a forward pass counted as a third of a step)
    when the run validates. The measured share matters where steps get cheaper as a run goes (the
    reverse head schedule's faded heads skip their work; validation still runs every head). The horizon is the steps taken plus those the time left buys at that
    rate, less MARGIN, and no more than a step or bytes limit allows."""

    def __init__(self, cfg: TrainConfig, *, limit: int, validates: bool):
        self.cfg, self.limit = cfg, limit
        self.overhead = cfg.eval_batches / (3 * cfg.eval_every) if validates and cfg.eval_every else 0.0
        self.times: list[float] = []
        self.estimate = 0  # the length the first measurement gave (0: not measured yet)

    def observe(self, step_s: float, *, step: int, session_s: float) -> int | None:
        """The fitted horizon after the session's latest step (its wall time step_s; `step`
        steps done in all, session_s seconds spent in this session), or None while measuring."""
        self.times.append(step_s)
        measured = self.times[SKIP_STEPS:]
        if len(measured) < MEASURE_STEPS or sum(measured) < MEASURE_SHARE * self.cfg.max_time:
            return None
        typical = statistics.median(measured[-RECENT_STEPS:])
        # what validations, saves and recompiles really added, spread over every step measured (a
        # step over OUTLIER times the typical one held one): more than the model of validation
        # where the heads' fade made a step cheaper than the validation's passes over every head
        extra = sum(t - typical for t in measured if t > OUTLIER * typical) / len(measured)
        per_step = max(typical * (1 + self.overhead), typical + extra)
        left = max(0.0, self.cfg.max_time - session_s) * (1 - MARGIN)
        horizon = step + max(1, int(left / per_step))
        horizon = min(horizon, self.limit) if self.limit else horizon
        self.estimate = self.estimate or horizon
        if self.cfg.schedule == "wsd" and step + 1 < horizon - max(1, round(self.cfg.decay_fraction * horizon)):
            return None  # the stable phase is the peak whatever the length: fix it where the decay starts
        return horizon


def head_weights(loss: LossConfig, n_future: int, progress: float) -> list[float]:
    """Each head's loss weight at `progress`, the share of the schedule's steps done (0 to 1):
    loss.head_weights's, times loss.head_schedule's share. Over the first head_schedule_span of
    the schedule the n - 1 heads after the first move one after another, each for an equal part
    of it: forward raises head 2, then head 3, ... from 0 to its weight; reverse lowers head n,
    then head n - 1, ... to head_schedule_floor of its weight. Head 1 keeps its weight."""
    base = loss.weights(n_future)
    if loss.head_schedule == "constant" or n_future == 1:
        return base
    moved = min(1.0, max(0.0, progress) / loss.head_schedule_span) * (n_future - 1)  # heads moved so far
    shares = [1.0]
    for k in range(1, n_future):
        order = k - 1 if loss.head_schedule == "forward" else n_future - 1 - k  # when head k + 1 moves
        done = min(1.0, max(0.0, moved - order))
        shares.append(done if loss.head_schedule == "forward" else 1.0 - (1.0 - loss.head_schedule_floor) * done)
    return [w * s for w, s in zip(base, shares)]


@dataclasses.dataclass(frozen=True)
class HeadPhase:
    """A stretch of the head schedule over which the same heads run: `weights` at its start (what
    a step there costs depends only on which heads run), its `share` of the schedule's steps."""
    weights: tuple[float, ...]
    share: float
    skipped: frozenset[int]

    @property
    def heads_run(self) -> int:
        return len(self.weights) - len(self.skipped)


def head_phases(loss: LossConfig, model: ModelConfig, *, length: int = 0, steps: int = 0,
                points: int = 4096) -> list[HeadPhase]:
    """The head schedule cut where the heads a training step runs change (`HeadType.skipped`: a
    faded head of weight 0 is skipped), in order, each with its share of the steps: what a run's
    training step costs in its proportions, where one step (the first, say) would not say (a
    reverse schedule's steps run head 1 alone once the others have faded). With a run's `steps`
    and its head schedule's `length` (`TrainState.head_schedule_steps`: a run limited by time
    fixes it from its first, dearest steps, so it ends short of the steps the run takes, and more
    of them run head 1 alone), the shares are of those steps; else of the schedule. Read off
    `points` evenly spaced points; one phase for a constant schedule."""
    span = steps / length if length and steps else 1.0  # the run's steps in units of the schedule
    phases: list[HeadPhase] = []
    for i in range(points):
        weights = tuple(head_weights(loss, model.n_future, span * (i + 0.5) / points))
        skipped = model.head.skipped(list(weights))
        if phases and phases[-1].skipped == skipped:
            phases[-1] = dataclasses.replace(phases[-1], share=phases[-1].share + 1 / points)
        else:
            phases.append(HeadPhase(weights=weights, share=1 / points, skipped=skipped))
    return phases
