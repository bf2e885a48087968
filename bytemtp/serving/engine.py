"""Continuous batching: one thread decodes every request a server has, self-speculatively.

Requests join the running batch between passes and leave it when they finish, so a request
never waits for a whole batch to end and the passes stay as full as the load allows. The thread
runs the decoding loop that `generate` runs (`loop.Loop`: plan, re-warm, draft, forward, verify,
accept, emit) over one batch that it grows (`Loop.admit`, a newcomer prefilled in its own cache
row) and shrinks (`Loop.remove_finished`, after every pass: a finished row costs every later pass
its share); the engine itself only admits and removes requests, runs scoring jobs and calls back.
Each row decodes by its own sampling; a row's greedy output equals that prompt decoded alone,
whatever runs beside it, because every row of a pass is computed from its own cache row only.

What a pass costs is measured once per batch bucket (1, 2, 4, ... up to `max_batch`) when the
engine starts, so that no request waits on a calibration; the loop plans from the bucket at or
above the batch's size, every `loop.PLAN_EVERY` passes and whenever the bucket changes. Passes run
eagerly or on the compiled static step, as the decoder's compile policy says (`serve --compile`):
on the compiled step every bucket's shapes are compiled when the engine starts, and the batch is
kept at a bucket's size with placeholder rows.

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

from bytemtp.decoding.batch import Row
from bytemtp.decoding.decode import Decoder
from bytemtp.decoding.generation import Generation, Output, SpeculativeStats
from bytemtp.decoding.loop import Loop, batch_buckets
from bytemtp.decoding.sampling import Sampling
from bytemtp.decoding.strategy import Draft
from bytemtp.evaluation.likelihood import ByteLogprobs, byte_logprobs


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
    thread; `start` settles the compile policy, compiles and measures the pass costs (unless
    `costs` were given) and starts the thread; `close` stops it, failing what is still queued or
    running. Without a `decoder`, passes run eagerly."""

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
        self._live: dict[int, _Live] = {}  # by id of the row in the batch
        self._loop: Loop | None = None
        self.static = False  # whether passes run the compiled step (settled by `start`)

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
        """Settle the compile policy (under auto: compiled when the compile cache holds the step
        at every batch bucket already), compile every batch bucket's shapes (on the compiled
        step), measure the pass costs of every bucket (when the draft adapts or drafts lookup
        bytes, which weigh a deeper chain by them), then start."""
        say = progress or (lambda line: None)
        policy, buckets = self.decoder.policy, batch_buckets(self.max_batch)
        self.static = policy.settle_ready(buckets)
        for size in buckets:
            if self.static and policy.use(size, 0):
                say(f"compiling the decode step at batch {size} (cached on disk for later starts)")
                self.decoder.compile_shapes(size)
            if self.draft.adapts(True) or self.draft.lookup:
                say(f"measuring pass costs at batch {size}")
                self.decoder.pass_costs(size, static=self.static)
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
        loop = self._loop
        state = loop.state
        for r in state.active:
            live = self._live.get(id(state.rows[r]))
            if live is not None and live.job.cancelled and r not in state.finished:
                live.row.out.stats.stopped_by = "cancelled"
                state.finished.add(r)
        loop.emit()
        self._flush()
        self._finish()
        if not self._live:
            return
        self.stats.passes += 1
        self.stats.rows_in_passes += len(self._live)
        loop.advance()
        self._flush()
        self._finish()

    def _admit(self, jobs: list[GenerateJob]) -> None:
        """Add the jobs to the batch, each prefilled into its own new cache row."""
        depths = self.draft.max_depth(self.model.config.n_future)
        if self._loop is None:
            self._loop = Loop(self.decoder, self.draft, [], static=self.static,
                              buckets=batch_buckets(self.max_batch))
        lives = [_Live(job, self.draft, depths) for job in jobs]
        for live in [live for live in lives if live.job.max_bytes == 0]:  # nothing to decode
            live.row.out.stats.stopped_by = "max_bytes"
            self.stats.requests += 1
            live.job.on_done(live.row.out.result(live.t0))
        lives = [live for live in lives if live.job.max_bytes > 0]
        self._live.update((id(live.row), live) for live in lives)
        self._loop.admit([live.row for live in lives])

    def _flush(self) -> None:
        for live in self._live.values():
            if live.pending:
                piece = bytes(live.pending)
                live.pending.clear()
                self.stats.bytes_out += len(piece)
                live.job.on_bytes(piece)

    def _finish(self) -> None:
        """Tell every finished row's job, and drop the rows from the batch."""
        for row in self._loop.remove_finished():
            live = self._live.pop(id(row))
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
        jobs = [live.job for live in self._live.values()]
        if waiting:
            with self._cond:
                jobs += list(self._waiting)
                self._waiting.clear()
        self._live, self._loop = {}, None
        for job in jobs:
            self.stats.errors += 1
            job.on_error(message)
