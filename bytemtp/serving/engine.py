"""Continuous batching: one thread decodes every request a server has, self-speculatively.

Requests join the running batch between passes and leave it when they finish, so a request
never waits for a whole batch to end and the passes stay as full as the load allows. The thread
runs the decoder's own steps (`decode.Decoder`: `prefill`, `emit_next`, `step`, `plan`) over one
`batch.Batch` that it grows (`Batch.add`, a newcomer prefilled in its own cache row) and shrinks
(`Batch.remove_finished`, after every pass: a finished row costs every later pass its share).
Each row decodes by its own sampling; a row's greedy output equals that prompt decoded alone,
whatever runs beside it, because every row of a pass is computed from its own cache row only.

What a pass costs is measured once per batch bucket (1, 2, 4, ... up to `max_batch`) when the
engine starts, so that no request waits on a calibration; the chooser plans from the bucket at
or above the batch's size, every `PLAN_EVERY` passes and whenever the bucket changes.

Scoring jobs (the per-byte log-probabilities of `echo` and `logprobs`) run on the same thread
between passes: the model is used by one thread only. The trade-off: a long scoring job delays
the next pass of every stream by its length, which is one forward pass over the text.

Everything a request hears comes through its callbacks, called on the engine's thread:
`on_bytes(piece)` once per pass that emitted bytes for it (a group of accepted bytes), and
`on_done(generation)` or `on_error(message)` once. A job that is `cancel`led (its client has
gone) leaves the batch before the next pass.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Callable

import torch

from bytemtp.decoding.batch import Batch, Row
from bytemtp.decoding.decode import Decoder
from bytemtp.decoding.drafting import MAX_NODES, Choice
from bytemtp.decoding.generation import Generation, Output, SpeculativeStats
from bytemtp.decoding.sampling import Sampling
from bytemtp.decoding.strategy import Draft
from bytemtp.decoding.warmth import StaleHeads, emit_tracked, rewarm
from bytemtp.evaluation.likelihood import ByteLogprobs, byte_logprobs
from bytemtp.model.kvcache import KVCache

PLAN_EVERY = 16  # passes between re-plans of the draft at one batch bucket


class QueueFull(Exception):
    """The engine holds as many waiting requests as it may."""


@dataclasses.dataclass(eq=False)
class GenerateJob:
    """One prompt to decode, and whom to tell."""

    prompt: bytes
    max_bytes: int
    sampling: Sampling
    stop: tuple[bytes, ...] = ()
    on_bytes: Callable[[bytes], None] = lambda piece: None
    on_done: Callable[[Generation], None] = lambda generation: None
    on_error: Callable[[str], None] = lambda message: None
    cancelled: bool = False
    submitted: float = dataclasses.field(default_factory=time.perf_counter)

    def cancel(self) -> None:
        self.cancelled = True


@dataclasses.dataclass(eq=False)
class ScoreJob:
    """Texts whose per-byte log-probabilities (with the `top` likeliest ids) are wanted."""

    texts: list[bytes]
    top: int
    on_done: Callable[[list[ByteLogprobs]], None] = lambda result: None
    on_error: Callable[[str], None] = lambda message: None
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclasses.dataclass
class EngineStats:
    """What the engine has done since it started (read by /health and the load benchmark)."""

    requests: int = 0  # generation requests finished (cancelled ones included)
    cancelled: int = 0
    bytes_out: int = 0
    passes: int = 0
    rows_in_passes: int = 0  # sum over passes of the rows each ran
    scored: int = 0
    errors: int = 0

    @property
    def mean_batch(self) -> float:
        return self.rows_in_passes / max(1, self.passes)


def batch_buckets(max_batch: int) -> list[int]:
    """The batch sizes whose pass costs are measured: powers of two up to max_batch, and it."""
    return sorted({min(2 ** i, max_batch) for i in range(max_batch.bit_length() + 1)})


class _Live:
    """A generation in the batch: its job, its row and the bytes emitted since the last flush."""

    def __init__(self, job: GenerateJob, draft: Draft, depths: int):
        self.job, self.pending = job, bytearray()
        stats = SpeculativeStats(drafted=[0] * depths, accepted=[0] * depths)
        self.row = Row(job.prompt, Output(stats, max_bytes=job.max_bytes, stop=job.stop,
                                          on_bytes=self.pending.extend), job.sampling, lookup=draft.lookup)
        self.t0 = time.perf_counter()


class Engine:
    """The decoding thread of a server (see the module docstring). `submit` is safe from any
    thread; `start` measures the pass costs (unless `costs` were given) and starts the thread;
    `close` stops it, failing what is still queued or running."""

    def __init__(self, model, *, max_batch: int = 8, max_queue: int = 64, draft: Draft = Draft(lookup=True),
                 decoder: Decoder | None = None, score_batch: int = 8):
        if max_batch < 1 or max_queue < 0:
            raise ValueError(f"max_batch={max_batch}, max_queue={max_queue}: expected max_batch >= 1, max_queue >= 0")
        self.model, self.max_batch, self.max_queue = model, max_batch, max_queue
        self.draft = draft.for_model(model.config.n_future)
        self.decoder = decoder or Decoder(model, compile="off")
        self.score_batch = score_batch
        self.stats = EngineStats()
        self._waiting: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._live: list[_Live] = []  # in the order of the batch's rows
        self._state: Batch | None = None
        self._bucket, self._passes_at_bucket, self._choice, self._greedy = 0, 0, None, None
        # the heads every newcomer's prompt runs: all of them when the draft adapts (`Decoder.decode`'s rule)
        self._full = model.config.n_future if self.draft.adapts(True) else (self.draft.heads or 1)
        self._stale: StaleHeads | None = None

    # --- from other threads ---------------------------------------------------------------------

    def submit(self, job: GenerateJob | ScoreJob) -> None:
        """Queue a job; QueueFull when `max_queue` jobs already wait beyond the room in the batch."""
        with self._cond:
            if self._closing:
                raise QueueFull("the server is shutting down")
            if len(self._waiting) >= self.max_queue + self.max_batch - len(self._live):
                raise QueueFull(f"{len(self._waiting)} requests are waiting (the queue holds {self.max_queue} "
                                f"beyond the batch of {self.max_batch})")
            self._waiting.append(job)
            self._cond.notify()

    @property
    def queued(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._live)

    def start(self, *, progress: Callable[[str], None] | None = None) -> None:
        """Measure the pass costs of every batch bucket (when the draft adapts or drafts lookup
        bytes, which weigh a deeper chain by them), then start."""
        if self.draft.adapts(True) or self.draft.lookup:
            for size in batch_buckets(self.max_batch):
                if progress is not None:
                    progress(f"measuring pass costs at batch {size}")
                self.decoder.pass_costs(size)
        self._thread = threading.Thread(target=self._run, name="bytemtp-engine", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    # --- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._cond:
                while not self._closing and not self._waiting and not self._live:
                    self._cond.wait()
                if self._closing:
                    break
            try:
                with torch.inference_mode():
                    self._iteration()
            except Exception as e:  # a fault of one pass fails the requests it ran, not the server
                self._fail_all(f"decoding failed: {type(e).__name__}: {e}")
        self._fail_all("the server is shutting down", waiting=True)

    def _take(self) -> tuple[list[ScoreJob], list[GenerateJob]]:
        """The waiting scoring jobs, and as many waiting generations as the batch has room for
        (in the order they came)."""
        scores, gens = [], []
        with self._cond:
            room = self.max_batch - len(self._live)
            keep = collections.deque()
            while self._waiting:
                job = self._waiting.popleft()
                if job.cancelled:
                    continue
                if isinstance(job, ScoreJob):
                    scores.append(job)
                elif room > 0:
                    gens.append(job)
                    room -= 1
                else:
                    keep.append(job)
            self._waiting = keep
        return scores, gens

    def _iteration(self) -> None:
        """Score what waits, admit newcomers, emit every row's next byte, drop finished rows, then
        one pass over the batch."""
        scores, gens = self._take()
        for job in scores:
            self._score(job)
        if gens:
            self._admit(gens)
        if not self._live:
            return
        state, decoder = self._state, self.decoder
        for b, live in enumerate(self._live):
            if live.job.cancelled and b not in state.finished:
                live.row.out.stats.stopped_by = "cancelled"
                state.finished.add(b)
        emit_tracked(decoder, state, self._stale, heads=self._full)
        self._flush()
        self._finish()
        if not self._live:
            return
        choice = self._plan()
        if choice.heads > state.warm:  # more heads than have complete caches: complete them
            rewarm(decoder, state, self._stale, choice.heads)
        self.stats.passes += 1
        self.stats.rows_in_passes += len(self._live)
        starts = list(state.cache.lengths)
        decoder.step(state, choice)
        for r, start in enumerate(starts):
            self._stale.passed(r, heads=state.warm, start=start)
        self._flush()
        self._finish()

    def _admit(self, jobs: list[GenerateJob]) -> None:
        """Add the jobs to the batch, each prefilled into its own new cache row."""
        n = self.model.config.n_future
        depths = self.draft.max_depth(n)
        if self._state is None:
            cache = KVCache.for_model(self.model, batch_size=0, max_len=self.model.config.seq_len + MAX_NODES)
            self._state = Batch([], cache, warm=self._full, profiles=self.decoder.profiles, costs=None)
            self._stale = StaleHeads(0, n, warm=self._full)
            self._bucket, self._passes_at_bucket, self._choice, self._greedy = 0, 0, None, None
        state = self._state
        lives = [_Live(job, self.draft, depths) for job in jobs]
        for live in [live for live in lives if live.job.max_bytes == 0]:  # nothing to decode
            live.row.out.stats.stopped_by = "max_bytes"
            self.stats.requests += 1
            live.job.on_done(live.row.out.result(live.t0))
        lives = [live for live in lives if live.job.max_bytes > 0]
        self._stale.add(len(lives), warm=self._full)
        for b, live in zip(state.add([live.row for live in lives]), lives):
            view = state.cache.row(b)
            self.decoder.prefill([live.row], view, self._full)  # every head: a later re-warm runs less
            state.cache.lengths[b] = view.lengths[0]
            state.cache.doc_starts[b] = view.doc_starts[0]
            self._live.append(live)

    def _plan(self) -> Choice:
        """The draft of the next pass: re-planned every PLAN_EVERY passes and when the batch
        moves to another bucket of pass costs."""
        state = self._state
        bucket = next(b for b in batch_buckets(self.max_batch) if b >= len(self._live))
        greedy = state.greedy
        if (self._choice is None or bucket != self._bucket or greedy != self._greedy
                or self._passes_at_bucket % PLAN_EVERY == 0):
            self._choice = self.decoder.plan(self.draft, batch_size=bucket, static=False, greedy=greedy)
            state.costs = self.decoder.calibration.for_run(bucket, static=False)
            if bucket != self._bucket or greedy != self._greedy:
                self._passes_at_bucket = 0
            self._bucket, self._greedy = bucket, greedy
        self._passes_at_bucket += 1
        return self._choice

    def _flush(self) -> None:
        for live in self._live:
            if live.pending:
                piece = bytes(live.pending)
                live.pending.clear()
                self.stats.bytes_out += len(piece)
                live.job.on_bytes(piece)

    def _finish(self) -> None:
        """Tell every finished row's job, and drop the rows from the batch."""
        state = self._state
        if not state.finished:
            return
        done = [self._live[b] for b in sorted(state.finished)]
        self._stale.keep([b for b in range(len(self._live)) if b not in state.finished])
        self._live = [live for b, live in enumerate(self._live) if b not in state.finished]
        state.remove_finished()
        for live in done:
            self.stats.requests += 1
            self.stats.cancelled += live.row.out.stats.stopped_by == "cancelled"
            live.job.on_done(live.row.out.result(live.t0))

    def _score(self, job: ScoreJob) -> None:
        try:
            result = byte_logprobs(self.model, job.texts, top=job.top, batch_size=self.score_batch)
        except Exception as e:
            self.stats.errors += 1
            job.on_error(f"scoring failed: {type(e).__name__}: {e}")
            return
        self.stats.scored += len(job.texts)
        job.on_done(result)

    def _fail_all(self, message: str, *, waiting: bool = False) -> None:
        """Fail the requests in the batch (and, shutting down, those waiting); start a new batch."""
        jobs = [live.job for live in self._live]
        if waiting:
            with self._cond:
                jobs += list(self._waiting)
                self._waiting.clear()
        self._live, self._state = [], None
        for job in jobs:
            self.stats.errors += 1
            job.on_error(message)
