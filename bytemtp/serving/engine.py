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
above the batch's size, after each window of passes (`loop.Window`) and whenever the bucket changes. Passes run
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

A fault fails the row that raises it, not its batch (`_recover`): after a pass (or an admission)
raises, each of its rows decodes one pass alone, in a batch of its own; the rows that raise there
fail, and the others go on in a new batch, each prefilled anew from its prompt and the output so
far, as a window's slide goes on (a greedy row's output is still that prompt decoded alone). A
fault that no row raises alone fails every row of the batch when it comes again before a pass
succeeds (a fault of the model, not of a row). Jobs taken from the queue and not yet in the
batch go back to the queue's front.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Callable

import torch

from bytemtp.decoding.batch import Row
from bytemtp.decoding.calibration import compile_shapes
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
        self._taken: list[GenerateJob] = []  # taken from the queue, not yet in the batch
        self._unexplained = False  # a fault that no row raised alone came since the last good pass
        self.static = False  # whether passes run the compiled step (settled by `start`)

    # --- from other threads ---------------------------------------------------------------------

    def submit(self, *jobs: GenerateJob | ScoreJob, follow_up: bool = False) -> None:
        """Queue jobs (a request's choices), all or none; QueueFull when they would make more than
        `max_queue` jobs wait beyond the room in the batch. Jobs past that room are queued whole
        when nothing waits and the batch or queue has room for one: a request of more choices
        than the queue holds then waits only for the rows ahead of it, as its rows join the batch
        as room frees (the requests after it get QueueFull until the queue is short again).
        `follow_up`: the jobs continue a request already queued (its scoring), never refused for room."""
        with self._cond:
            if self._closing:
                raise QueueFull("the server is shutting down")
            room = self.max_queue + self.max_batch - len(self._live) - len(self._waiting)
            if not follow_up and len(jobs) > room and (self._waiting or room < 1):
                raise QueueFull(f"{len(self._waiting)} requests are waiting (the queue holds {self.max_queue} "
                                f"beyond the batch of {self.max_batch})")
            self._waiting.extend(jobs)
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
                compile_shapes(self.decoder, size)
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
                self._unexplained = False
            except Exception as e:  # a fault fails the row that raises it, not the server nor its batch
                self._recover(f"decoding failed: {type(e).__name__}: {e}")
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
        if self._loop is None and self._live:  # rows going on after a fault: a new batch, each prefilled anew
            self._loop = Loop(self.decoder, self.draft, [], static=self.static, buckets=batch_buckets(self.max_batch))
            self._loop.admit([live.row for live in self._live.values()])
        scores, self._taken = self._take()
        for job in scores:
            self._score(job)
        if self._taken:
            self._admit(self._taken)
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
        lives = []
        for job in jobs:
            try:
                lives.append(_Live(job, self.draft, depths))
            except Exception as e:  # a row that cannot be made fails alone
                self.stats.errors += 1
                job.on_error(f"decoding failed: {type(e).__name__}: {e}")
        self._taken = []
        for live in [live for live in lives if live.job.max_bytes == 0]:  # nothing to decode
            live.row.out.stats.stopped_by = "max_bytes"
            self._answer(live)
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
            self._answer(self._live.pop(id(row)))

    def _answer(self, live: _Live) -> None:
        self.stats.requests += 1
        self.stats.cancelled += live.row.out.stats.stopped_by == "cancelled"
        live.job.on_done(live.row.out.result(live.t0))

    def _recover(self, message: str) -> None:
        """After a fault (`message`): fail the rows that raise it alone, and keep the others for a
        new batch, which the next iteration prefills (see the module docstring). Jobs taken from
        the queue but not yet in the batch go back to its front; when the fault comes again before
        a good iteration and no row raised it alone, they fail with every row."""
        taken, self._taken = self._taken, []
        try:
            self._flush()  # the bytes emitted before the fault go out
        except Exception:
            pass
        lives, self._live, self._loop = list(self._live.values()), {}, None
        going = [live for live in lives if not self._ended(live)]
        if self._unexplained:  # again, and no row to blame: a fault of the model
            self._unexplained = False
            for live in going:
                self._fail(live, message)
            for job in taken:
                self.stats.errors += 1
                job.on_error(message)
            return
        with self._cond:
            self._waiting.extendleft(reversed(taken))
        culprits = 0
        for live in going:
            fault = self._alone(live)
            if fault is not None:
                culprits += 1
                self._fail(live, fault)
            elif not self._ended(live):
                self._live[id(live.row)] = live
        self._unexplained = culprits == 0

    def _ended(self, live: _Live) -> bool:
        """Whether a row's output has ended (or its client has gone): then its job is answered."""
        if live.job.cancelled and not live.row.out.stats.stopped_by:
            live.row.out.stats.stopped_by = "cancelled"
        if not live.row.out.stats.stopped_by:
            return False
        self._answer(live)
        return True

    def _alone(self, live: _Live) -> str | None:
        """Decode one pass of a row in a batch of its own: the fault it raises, or None (its bytes
        are flushed; whether it has ended, its stats say)."""
        try:
            with torch.inference_mode():
                loop = Loop(self.decoder, self.draft, [], static=self.static, buckets=batch_buckets(self.max_batch))
                loop.admit([live.row])
                if loop.emit():
                    loop.advance()
        except Exception as e:
            return f"decoding failed: {type(e).__name__}: {e}"
        finally:
            if live.pending:
                piece = bytes(live.pending)
                live.pending.clear()
                self.stats.bytes_out += len(piece)
                live.job.on_bytes(piece)
        return None

    def _fail(self, live: _Live, message: str) -> None:
        self.stats.errors += 1
        live.job.on_error(message)

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
