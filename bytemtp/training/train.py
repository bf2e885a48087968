"""The training loop: `run_plan(plan)` carries out a run that `bytemtp.training.runs` planned and checked
(`train(cfg, run_dir)` plans and runs in one call). It joins the ranks, takes the run's lock,
readies the run directory, builds a `_Run` (model, wrapper, optimizer, loader), restores it from
the checkpoint when resuming, and loops: stop condition, optimizer step, log, validate, save.
What a run resumes besides its weights and optimizer state is one `TrainState` (the loop's
counters, every rank's loader position and RNG state; `bytemtp.training.train_state`) with a state
dict, like the loader's; a checkpoint is restored in one place, `_Run.restore`.

AdamW or Muon (`bytemtp.training.optimizer`) on a warmup and decay schedule
(`bytemtp.training.schedule`; one limited by time is fitted to the time from the measured step
rate, and its length kept in the run's state), gradient clipping and accumulation, bf16
autocast after train.precision (on CUDA and a CPU with native bf16 by default), optional
torch.compile of each block, and the
memory-efficient multi-head step by default. It stops by
steps, by bytes or by wall time, and on SIGTERM or Ctrl-C at the next step boundary; every stop
saves a checkpoint.

Exact resume: a checkpoint holds the weights, the optimizer state, the loader's position, the
RNG states and the loop's counters; the schedule is a function of the step. On the CPU a resumed
run's losses equal an uninterrupted run's bit for bit (a test kills a run with SIGKILL to show
it). The global torch RNG (dropout draws from it) is seeded from train.seed inside
`torch.random.fork_rng`, so the caller's RNG is left as it was.

A new run may start from another run's weights (train.init, the same model settings) and train
only the draft heads (train.trainable=draft-heads: the embedding, trunk and head 1 frozen), which
is what `bytemtp tune-heads` sets; with loss.rollout_bytes each window's end is first replaced
by the model's own greedy continuation (`bytemtp.training.rollout`). The log then carries each head's
agreement with head 1 and, with the teacher term on, its KL to head 1.

Faults: a step whose loss or gradient norm is not finite is skipped (no parameter or optimizer
update, counted) and the run aborts after train.max_bad_steps in a row
(`bytemtp.training.faults`; on a GPU the verdicts are read at the steps that log). A checkpoint that fails
to save (a full disk) leaves the previous one intact and the run says so and goes on; only a
failure of the final save ends the run with an error. A step or validation that runs out of
memory ends the run with `OutOfMemory`, whose one line names the batch, the context, the
accumulation and what to lower; nothing of that step is saved, so the newest checkpoint is the
one before it.

Run directory (`bytemtp.training.runs`, which also resolves a run before any work): `run-config.json`,
`metrics.jsonl` (one JSON object per logged step or validation; the same records go to the trackers
that train.log_to names, `bytemtp.training.tracking`), `checkpoints/step-NNNNNNNN/`, and `.lock`,
which the training holds from before it writes anything until it ends, so that a second training
into the run stops at once (`runs.RunLocked`).

Many processes: launched by torchrun, the same loop trains one model on every rank
(`bytemtp.runtime.distributed`: DDP or FSDP2 after train.parallel). Each rank reads its own share of the
corpus; loss and metrics are averaged over the ranks, the stop conditions (signal, time,
non-finite loss) are agreed at every step boundary so that all ranks stop at the same step, and
rank 0 alone holds the run's lock, logs and writes checkpoints, which hold every rank's loader
position and RNG state. A run resumes only with the number of processes that saved it.
Restarted by torchrun (--max-restarts), a run resumes from its newest checkpoint by itself. A
rank that runs out of memory ends with its error while the others wait in a collective;
torchrun then stops the job.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
import signal
import time
from pathlib import Path

import torch
from tqdm import tqdm

from bytemtp.config import Config
from bytemtp.data.loader import ByteLoader, combine_stats
from bytemtp.data.splits import has_splits, has_val_split
from bytemtp.vocab import check_vocab_size, load_vocabulary
from bytemtp.evaluation.evaluate import evaluate
from bytemtp.model.flops import peak_flops, step_flops, utilisation
from bytemtp.model.loss import LN2
from bytemtp.model.model import ByteMTP
from bytemtp.runtime import distributed as dist_lib
from bytemtp.runtime.checkpoint import (CheckpointError, latest_checkpoint, load_optimizer_state, load_weights,
                                        read_train_state, save_checkpoint)
from bytemtp.model.transfer import batch_to_device
from bytemtp.runtime.devices import autocast, fast_fp32_matmuls, out_of_memory, resolve_device
from bytemtp.training import runs, tracking
from bytemtp.training.faults import StepGuard, TrainingError
from bytemtp.training.figures import LogClock, ReadFigures, accumulate_gradients, read_figures
from bytemtp.training.optimizer import build_optimizer, set_lr, set_trainable, start_from
from bytemtp.training.rollout import greedy_rollout
from bytemtp.training.runs import METRICS, RunPlan, RunResult
from bytemtp.training.schedule import TimeFit, head_weights, lr_scale, schedule_horizon
from bytemtp.training.step import (compile_blocks, compile_choice, draft_forward_backward, forward_backward,
                                   plain_forward_backward)
from bytemtp.training.train_state import TrainState


class OutOfMemory(TrainingError):
    """A step or validation ran out of device memory; the message says what to lower."""


@contextlib.contextmanager
def stop_on_signals():
    """SIGTERM and SIGINT set a flag that the loop reads at the next step boundary."""
    flag = {"signal": None}

    def handler(signum, frame):
        flag["signal"] = signal.Signals(signum).name

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def train(cfg: Config, run_dir: str | Path, *, resume: bool = False, show_progress: bool = True,
          say=tqdm.write) -> RunResult:
    """Train (or resume) the run of `cfg` in run_dir until a stop condition; return where it
    ended: `run_plan` of `runs.plan_config(cfg, run_dir, resume=resume)`."""
    return run_plan(runs.plan_config(cfg, run_dir, resume=resume), show_progress=show_progress, say=say)


def run_plan(plan: RunPlan, *, show_progress: bool = True, say=tqdm.write) -> RunResult:
    """Carry out a planned run until a stop condition; return where it ended (a run that was
    already done returns at once, having touched nothing).

    Rank 0 takes the run's lock (`runs.RunLocked` on every rank when another training holds it)
    and readies the run directory under it (`runs.start_run`); then every rank builds its `_Run`,
    restores it from the checkpoint when resuming, and trains."""
    if plan.done is not None:
        return plan.done
    cfg = plan.cfg
    tc = cfg.train
    with (dist_lib.process_group(resolve_device(tc.device), timeout_s=tc.dist_timeout) as d,
          contextlib.ExitStack() as held, fast_fp32_matmuls(d.device, tc.precision)):
        _on_main(d, lambda: held.enter_context(runs.run_lock(plan.run_dir)))
        ckpt = _on_main(d, lambda: runs.start_run(plan))
        with torch.random.fork_rng(devices=[d.device] if d.device.type == "cuda" else []):
            torch.manual_seed(tc.seed + d.rank)  # dropout differs between ranks
            session = _Run(cfg, plan.run_dir, d, checkpoint=ckpt, say=say if d.is_main else (lambda *_: None))
            return session.loop(show_progress=show_progress and d.is_main)


def _on_main(d: dist_lib.Dist, work):
    """work() on rank 0, and its result on every rank; a ValueError or OSError it raises is raised
    on every rank (which would otherwise wait for rank 0 in the next collective)."""
    result = error = None
    if d.is_main:
        try:
            result = work()
        except (ValueError, OSError) as e:
            error = e
    result, error = dist_lib.gather((result, error), d)[0]
    if error is not None:
        raise error
    return result


class _Run:
    """One session of a run on one rank: built (the model, its wrapper and optimizer, the loader),
    restored from a checkpoint, then `loop` takes optimizer steps until a stop condition,
    validating, logging and saving as it goes."""

    def __init__(self, cfg: Config, run_dir: Path, d: dist_lib.Dist, *, checkpoint: Path | None, say):
        tc, mc = cfg.train, cfg.model
        self.cfg, self.run_dir, self.d, self.device, self.say = cfg, run_dir, d, d.device, say
        self.model = ByteMTP.build(mc, self.device, generator=torch.Generator(device="cpu").manual_seed(tc.seed))
        self.model.vocab = load_vocabulary(cfg.data.tokenizer)  # bytes, or a BPE baseline's tokens
        check_vocab_size(self.model.vocab, mc.vocab_size)
        self.loader = ByteLoader(cfg.data, mc, rank=d.rank, world_size=d.world_size)
        self.has_val = has_val_split(cfg.data)
        if not self.has_val:
            empty = has_splits(cfg.data.path)  # prepared, with no document in val
            say(f"note: {cfg.data.path} " + ("has an empty val split" if empty else "has no val split (prepare it "
                "with `bytemtp prep`)") + "; no validation in this run")
        self.state = TrainState(self.loader, d)
        if checkpoint is None and tc.init:
            say(f"starting from the weights of {start_from(self.model, tc.init, d.device)}")
        set_trainable(self.model, tc.trainable)
        self.wrapped = dist_lib.wrap_model(self.model, d, tc.parallel)
        self.optimizer = build_optimizer(self.model, tc, self.device)
        self.guard = StepGuard(self.optimizer, state=self.state, max_bad_steps=tc.max_bad_steps, say=say,
                               checkpoints=run_dir / "checkpoints")
        self.autocast = autocast(self.device, tc.precision)
        self.bytes_per_step = cfg.data.batch_size * mc.seq_len * tc.grad_accum * d.world_size
        self.flops_per_step = step_flops(self.model, self.bytes_per_step, mc.seq_len)  # the model's, all ranks
        self.peak_flops = peak_flops(self.device, tc.peak_flops)
        self.compiled, _ = compile_choice(tc, self.device, flops_per_step=self.flops_per_step,
                                          bytes_per_step=self.bytes_per_step)
        if self.compiled:
            compile_blocks(self.model)
        self.step_fn = functools.partial(draft_forward_backward if self.model.drafter is not None else
                                         forward_backward if tc.memory_efficient else plain_forward_backward,
                                         compiled=self.compiled)
        self.last_saved = self.last_val = -1
        if checkpoint is not None:
            self.restore(checkpoint)
        limit = schedule_horizon(tc, self.bytes_per_step)
        # a time budget fits the schedule unless the settings fixed it or an earlier session fitted it
        fits = bool(tc.max_time) and not tc.schedule_steps and not self.state.schedule_steps
        self.fit = TimeFit(tc, limit=limit, validates=self.has_val) if fits else None
        self.limit = limit
        self.last_tick = 0.0  # when the time fit last observed a step
        self.metrics = open(run_dir / METRICS, "a") if d.is_main else None  # one writer: two would race
        logged = runs.metrics_records(run_dir / METRICS) if d.is_main and checkpoint is not None else []
        self.trackers = (tracking.open_trackers(cfg, run_dir, step=self.state.step, resumed=checkpoint is not None,
                                                say=say, logged=logged) if d.is_main else tracking.Trackers())
        self.metrics_ok = True

    def restore(self, ckpt: Path) -> None:
        """Everything a checkpoint saved, in one place: the train state first (the cheap check
        that the run has as many processes as the one that saved it), then the weights and the
        optimizer state through the wrapper. Nothing here draws random numbers, so the RNG state
        restored is the one the next step draws from."""
        try:
            self.state.load_state_dict(read_train_state(ckpt))
        except ValueError as e:
            raise ValueError(f"{ckpt}: {e}") from None
        load_weights(ckpt, self.model, load=dist_lib.load_weights(self.wrapped))
        load_optimizer_state(ckpt, self.optimizer, load=dist_lib.load_optimizer(self.wrapped))
        self.last_saved = self.last_val = self.state.step
        self.say(f"resumed {self.run_dir} from {ckpt.name}: step {self.state.step}, "
                 f"{self.state.bytes_seen:,} bytes seen")

    def loop(self, *, show_progress: bool) -> RunResult:
        """Optimizer steps until a stop condition; then a last validation and a final checkpoint."""
        tc, st = self.cfg.train, self.state
        bar = tqdm(total=tc.steps or None, initial=st.step, desc="train", unit="step",
                   disable=not show_progress, dynamic_ncols=True)
        self.loader.warm()  # the shuffle buffer's first read is not training time
        started, session_start = time.perf_counter() - st.elapsed_s, time.perf_counter()
        clock = LogClock(session_start, st.step, now=time.perf_counter)
        self.model.train()
        metrics = contextlib.closing(self.metrics) if self.metrics is not None else contextlib.nullcontext()
        with stop_on_signals() as flag, contextlib.closing(bar), metrics, contextlib.closing(self.trackers):
            while not (stopped_by := self._stop_condition(flag, session_start)):
                with self._out_of_memory_stops(step=st.step + 1):
                    figures, grad_norm, lr = self._optimizer_step()
                st.elapsed_s = time.perf_counter() - started
                if self.fit is not None:
                    self._fit_schedule(session_start)
                bar.update()
                logs = st.step % tc.log_every == 0 or st.step == tc.steps
                validates, saves = bool(tc.eval_every) and st.step % tc.eval_every == 0, st.step % tc.ckpt_every == 0
                if logs or validates or saves:  # nothing else in a step waits for the device
                    self.guard.settle()
                if logs:
                    self._log_step(read_figures(figures, grad_norm), *clock.lap(st.step), lr, bar)
                with clock.paused():
                    if validates:
                        self.validate()
                    if saves:
                        self.save(final=False)
            bar.close()
            self.guard.settle()
            if stopped_by == "signal":
                names = dist_lib.gather(flag["signal"], self.d)
                rank = next(r for r, name in enumerate(names) if name)
                where = f" (by rank {rank})" if self.d.active else ""
                self.say(f"{names[rank]} received{where}: saving step {st.step} and stopping")
            if self.last_val != st.step:
                self.validate()
            path = self.save(final=True) if self.last_saved != st.step else None
            dist_lib.barrier(self.d)
            path = path or latest_checkpoint(self.run_dir)
        return RunResult(step=st.step, bytes_seen=st.bytes_seen, stopped_by=stopped_by, checkpoint=path,
                         val_bpb=st.val_bpb)

    @contextlib.contextmanager
    def _out_of_memory_stops(self, *, step: int, what: str = "step"):
        """An allocation that fails in the block (the work of `step`) ends the run with
        `OutOfMemory`, before anything of that step is logged or saved, saying what to lower."""
        try:
            yield
        except RuntimeError as e:
            if not out_of_memory(e):
                raise
            raise OutOfMemory(self._memory_advice(e, step=step, what=what)) from e

    def _memory_advice(self, error: RuntimeError, *, step: int, what: str) -> str:
        cfg, tc = self.cfg, self.cfg.train
        asked = re.search(r"allocate (\d+) bytes|allocate ([\d.]+ ?[KMGT]i?B)", str(error))
        size = (asked[2] or f"{int(asked[1]) / 2**30:.2f} GiB") if asked else None
        failed = f" (an allocation of {size} failed)" if size else ""
        efficient = "" if tc.memory_efficient else (", or set train.memory_efficient=true (one head's "
                                                    "activations at a time)")
        ckpt = latest_checkpoint(self.run_dir)
        kept = f"the newest checkpoint {ckpt} is intact" if ckpt is not None else "no checkpoint was saved before"
        return (f"out of memory on {self.device} in {what} {step}{failed}: micro-batches of "
                f"data.batch_size={cfg.data.batch_size} windows of model.seq_len={cfg.model.seq_len} bytes "
                f"(train.grad_accum={tc.grad_accum} a step) do not fit; lower data.batch_size (raising "
                f"train.grad_accum as much keeps the bytes a step) or model.seq_len, in a new run{efficient}; "
                f"step {step} was not saved and {kept}")

    @property
    def horizon(self) -> int:
        """The schedule's length: the one fitted to the time, else the settings' (0: none yet)."""
        return self.state.schedule_steps or self.limit

    def head_weights(self) -> list[float]:
        """The heads' loss weights this step: loss.head_schedule at the share of the schedule done
        (of the length the time fit first estimated, in a run limited by time; 0 done until then)."""
        length = self.state.head_schedule_steps or self.horizon
        return head_weights(self.cfg.loss, self.cfg.model.n_future, self.state.step / length if length else 0.0)

    def _fit_schedule(self, session_start: float) -> None:
        """Tell the time fit the wall time since the last step (validation and saving included);
        rank 0's fit decides for every rank (their clocks differ, so their answers may too)."""
        st, now = self.state, time.perf_counter()
        wall_s, self.last_tick = now - max(self.last_tick, session_start), now
        horizon = self.fit.observe(wall_s, step=st.step, session_s=now - session_start)
        horizon, estimate = dist_lib.gather((horizon, self.fit.estimate), self.d)[0]
        st.head_schedule_steps = st.head_schedule_steps or estimate
        if horizon is None:
            return
        st.schedule_steps = horizon
        self.fit = None
        self.say(f"step {st.step}: the schedule is fitted to the time budget: {self.horizon} steps "
                 f"(train.{self.cfg.train.schedule} decay to step {self.horizon})")

    def _stop_condition(self, flag: dict, session_start: float) -> str | None:
        """steps, bytes, schedule (a schedule fitted to the time ended), time or signal when the run
        must stop before the next step, else None."""
        tc, st = self.cfg.train, self.state
        out_of_time = bool(tc.max_time) and time.perf_counter() - session_start >= tc.max_time
        if tc.steps and st.step >= tc.steps:
            return "steps"
        if tc.max_bytes and st.bytes_seen >= tc.max_bytes:
            return "bytes"
        if st.schedule_steps and st.step >= st.schedule_steps:
            return "schedule"
        # clocks and signals differ between ranks: every rank stops when one must
        if dist_lib.any_rank(out_of_time or bool(flag["signal"]), self.d, self.device):
            return "time" if out_of_time else "signal"
        return None

    def _optimizer_step(self):
        """One step: the learning rate of the schedule, grad_accum micro-batches forward and
        backward, clipping, and the update, or a skip when the loss or gradient is not finite."""
        tc, st = self.cfg.train, self.state
        scale = lr_scale(st.step, tc, self.horizon)
        set_lr(self.optimizer, scale, tc)
        self.step_weights = self.head_weights()
        lr = tc.lr * scale
        batches = (self._targets(batch_to_device(next(self.loader), self.device)) for _ in range(tc.grad_accum))
        figures = accumulate_gradients(
            self.model, self.wrapped, batches, step_fn=self.step_fn, loss_cfg=self.cfg.loss,
            accum=tc.grad_accum, d=self.d, autocast=self.autocast, weights=self.step_weights)
        grad_norm = dist_lib.local(torch.nn.utils.clip_grad_norm_(
            [p for p in self.model.parameters() if p.requires_grad], tc.grad_clip or float("inf")))
        self.guard.step(figures.total, grad_norm, step=st.step + 1)  # the update, or a skip
        self.optimizer.zero_grad(set_to_none=True)
        st.step += 1
        st.bytes_seen += self.bytes_per_step
        return figures, grad_norm, lr

    def _targets(self, batch: torch.Tensor) -> torch.Tensor:
        """The batch, or with loss.rollout_bytes its windows ending in the model's greedy continuation."""
        n = self.cfg.loss.rollout_bytes
        if not n:
            return batch
        with self.autocast:  # bf16 on CUDA, as the step itself runs
            return greedy_rollout(self.model, batch, n)

    def _progress_line(self, figures: ReadFigures, step_s: float) -> str:
        """The next-byte head's loss (the figure a byte model is judged by; the sum over heads is
        logged), or, where head 1 is frozen, how often head 2 agrees with it; at a logged step."""
        unit = "B" if self.model.vocab.is_bytes else "tokens"  # a BPE baseline counts its positions in tokens
        speed = f"{self.bytes_per_step / step_s:,.0f} {unit}/s"
        mfu = utilisation(self.flops_per_step, step_s, self.peak_flops, devices=self.d.world_size)
        speed += f" MFU {100 * mfu:.1f}%" if mfu is not None else ""
        if self.cfg.train.trainable == "draft-heads" and figures.head_agreement is not None:
            return f"head 2 agrees with head 1 {figures.head_agreement[1]:.3f} {speed}"
        nats = figures.head_loss[0]
        if not self.model.vocab.is_bytes:
            return f"next-token loss {nats:.3f} ({nats / LN2:.3f} bits/token) {speed}"
        return f"next-byte loss {nats:.3f} ({nats / LN2:.3f} bits/byte) {speed}"

    def _log_step(self, figures: ReadFigures, seconds: float, steps: int, lr: float, bar) -> None:
        """The metrics line of a logged step, and the progress bar's; the speed is the mean of the
        `steps` steps since the last logged one, which took `seconds`."""
        st, device = self.state, self.device
        step_s = seconds / max(steps, 1)
        bar.set_postfix_str(self._progress_line(figures, step_s), refresh=False)
        data_stats = combine_stats(dist_lib.gather(self.loader.stats(), self.d))
        gpu = {}
        if device.type == "cuda":  # this rank's memory
            gpu["peak_mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
        mfu = utilisation(self.flops_per_step, step_s, self.peak_flops, devices=self.d.world_size)  # all ranks'
        if mfu is not None:
            gpu["mfu"] = mfu
        heads = {"head_agree": figures.head_agreement} if figures.head_agreement is not None else {}
        if figures.head_kl is not None and self.cfg.loss.teacher_weight:
            heads["head_teacher_kl"] = figures.head_kl
        if self.cfg.loss.head_schedule != "constant":
            heads["head_weights"] = self.step_weights
        self.log({**gpu, "step": st.step, "bytes": st.bytes_seen, "loss": figures.total,
                  ("bpb" if self.model.vocab.is_bytes else "bits_per_token"): figures.head_loss[0] / LN2,
                  "head_loss": figures.head_loss, "head_acc": figures.head_accuracy, **heads,
                  "lr": lr, "grad_norm": figures.grad_norm, "bytes_per_s": self.bytes_per_step / step_s,
                  "skipped_steps": st.skipped_steps, "elapsed_s": st.elapsed_s, "data": data_stats})

    def log(self, record: dict) -> None:
        """One metrics line; non-finite numbers become null (strict JSON); a full disk warns. The
        trackers of train.log_to get the record too."""
        self.trackers.log(record)
        if self.metrics is None:
            return
        try:
            self.metrics.write(json.dumps(_finite(record)) + "\n")
            self.metrics.flush()
            self.metrics_ok = True
        except OSError as e:
            if self.metrics_ok:
                self.say(f"warning: cannot write {self.run_dir / METRICS} ({e.strerror}); training goes on")
            self.metrics_ok = False

    def validate(self) -> None:
        """Bits per byte of every head on the first train.eval_batches batches of the val split,
        shared out over the ranks (the library's evaluation), labelled with the bytes scored: not
        the bytes `bytemtp eval` scores by default (50 batches of 8 windows), so the figures differ."""
        st, tc = self.state, self.cfg.train
        if not self.has_val:
            return
        with self.autocast, self._out_of_memory_stops(step=st.step, what="the validation of step"):
            res = evaluate(self.model, self.cfg.data.path, split="val", batches=tc.eval_batches,
                           batch_size=self.cfg.data.batch_size, device=self.device, d=self.d,
                           mask_after_eos=self.cfg.loss.mask_after_eos)
        st.val_bpb = res.bpb
        self.last_val = st.step
        agreed = res.agreed_bytes_per_forward
        self.log({"step": st.step, "bytes": st.bytes_seen, "val_bpb": st.val_bpb, "val_bytes": res.bytes,
                  "val_agreed_bytes_per_forward": [1.0] + [agreed[k] for k in sorted(agreed)]})
        per_pass = f"; {agreed[max(agreed)]:.2f} bytes/pass agreed with h1" if agreed else ""
        self.say(f"step {st.step}: val bits/byte ({res.bytes:,} bytes) "
                 + " ".join(f"h{k + 1} {b:.3f}" for k, b in enumerate(st.val_bpb)) + per_pass)

    def save(self, *, final: bool) -> Path | None:
        """Every rank takes part (gathering); rank 0 writes, and all agree on whether it worked."""
        d, st = self.d, self.state
        state = st.state_dict()
        weights, optim = dist_lib.full_state(self.wrapped, self.optimizer)
        path, error = None, None
        if d.is_main:
            try:
                path = save_checkpoint(self.run_dir, step=st.step, model=self.model, config=self.cfg,
                                       train_state=state, keep=self.cfg.train.keep_checkpoints,
                                       model_state=weights, optimizer_state=optim)
            except CheckpointError as e:
                error = e
        if dist_lib.any_rank(error is not None, d, self.device):
            message = str(error) if error is not None else "rank 0 could not save a checkpoint"
            if final:
                raise TrainingError(message)
            self.say(f"warning: {message}; training goes on")
            return None
        self.last_saved = st.step
        return path


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


