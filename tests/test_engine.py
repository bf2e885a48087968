"""Continuous batching (bytemtp.serving.engine) against decoding each prompt alone: requests that
join and leave the running batch between passes, greedy beside sampled rows, cancelled rows,
a full queue, and scoring jobs between passes."""

import threading
import time

import pytest
import torch
from doubles import FITTED, SONGS, fitted_model, rare_eos_model, tiny_model

from bytemtp.decoding import decode
from bytemtp.decoding.drafting import PassCosts
from bytemtp.decoding.sampling import Sampling
from bytemtp.decoding.strategy import Draft
from bytemtp.evaluation.likelihood import byte_logprobs
from bytemtp.decoding.loop import batch_buckets
from bytemtp.serving.engine import Engine, GenerateJob, QueueFull, ScoreJob

_FLAT = PassCosts({(1, 1): 1.0, (1, 16): 1.0, (8, 1): 1.0, (8, 16): 1.0})  # drafting is free: speculate


class _Collect:
    """A job's events, and a way to wait for its end."""

    def __init__(self):
        self.pieces, self.result, self.error, self.event = [], None, None, threading.Event()

    def job(self, prompt, max_bytes, sampling=None, **kw):
        return GenerateJob(prompt, max_bytes, sampling or Sampling(), on_bytes=self.pieces.append,
                           on_done=self._done, on_error=self._error, **kw)

    def _done(self, result):
        self.result = result
        self.event.set()

    def _error(self, message):
        self.error = message
        self.event.set()

    def wait(self, timeout=60):
        assert self.event.wait(timeout), "the job never finished"
        return self.result


def _engine(model, **kw):
    engine = Engine(model, decoder=decode.Decoder(model, costs=_FLAT), **kw)
    engine.start()
    return engine


def _serves_on(engine: Engine, model, prompt: bytes) -> None:
    """After a fault, the engine still decodes a request as solo decoding does."""
    fine = _Collect()
    engine.submit(fine.job(prompt, 10))
    assert fine.wait().output == decode.generate(model, prompt, max_bytes=10).output


def test_batch_buckets():
    assert batch_buckets(1) == [1] and batch_buckets(8) == [1, 2, 4, 8] and batch_buckets(6) == [1, 2, 4, 6]


@pytest.mark.slow
@FITTED
@pytest.mark.parametrize("draft", [Draft(), Draft(8), Draft.plain(), Draft(lookup=True)])
def test_requests_joining_a_running_batch_equal_each_prompt_decoded_alone(draft):
    model = fitted_model(0, "transformer")
    prompts = [SONGS[0][:5], b"", SONGS[1][:3], b"la la", SONGS[2], b"one two", b"\x00\xff", SONGS[0]]
    lengths = [40, 7, 90, 1, 30, 55, 12, 70]  # some slide past the 64-byte context
    engine = _engine(model, max_batch=3, draft=draft)
    try:
        got = []
        for i, (prompt, n) in enumerate(zip(prompts, lengths)):
            got.append(_Collect())
            engine.submit(got[-1].job(prompt, n))
            if i % 3 == 1:
                time.sleep(0.05)  # later ones join a batch already decoding
        for c, prompt, n in zip(got, prompts, lengths):
            result = c.wait()
            plain = decode.generate(model, prompt, max_bytes=n)
            assert result.output == plain.output and b"".join(c.pieces) == plain.output
            assert result.stats.stopped_by == plain.stats.stopped_by
        assert engine.stats.requests == len(prompts) and engine.running == 0
        assert 1 < engine.stats.mean_batch <= 3  # rows ran together, never more than max_batch
        if draft != Draft.plain():
            assert engine.stats.bytes_out > engine.stats.passes  # drafts were accepted
    finally:
        engine.close()


@pytest.mark.slow
@FITTED
def test_greedy_rows_beside_sampled_rows_are_unchanged_and_sampling_repeats_from_its_seed():
    model = fitted_model(1, "transformer")
    engine = _engine(model, max_batch=4, draft=Draft(4))
    try:
        def sampled(seed):
            return Sampling(temperature=0.8, generator=torch.Generator().manual_seed(seed))

        runs = [(_Collect(), SONGS[i % 3][:4], sampled(i) if i % 2 else None) for i in range(4)]
        for c, prompt, s in runs:
            engine.submit(c.job(prompt, 30, s))
        for c, prompt, s in runs[0::2]:
            assert c.wait().output == decode.generate(model, prompt, max_bytes=30).output
        alone = _Collect()
        engine.submit(alone.job(runs[1][1], 30, sampled(1)))  # the same seed, decoded alone
        assert alone.wait().output == runs[1][0].wait().output
    finally:
        engine.close()


@pytest.mark.usefixtures("one_thread")
def test_a_cancelled_job_leaves_the_batch_and_the_others_go_on():
    model = tiny_model().eval()
    engine = _engine(model, max_batch=2, draft=Draft.plain())
    try:
        long, short = _Collect(), _Collect()
        long_job = long.job(b"a", 100000)
        engine.submit(long_job)
        engine.submit(short.job(b"b", 20))
        assert short.wait().output == decode.generate(model, b"b", max_bytes=20).output
        while not long.pieces:
            time.sleep(0.01)
        long_job.cancel()
        result = long.wait()
        assert result.stats.stopped_by == "cancelled" and 0 < len(result.output) < 100000
        assert engine.running == 0 and engine.stats.cancelled == 1
    finally:
        engine.close()


@pytest.mark.usefixtures("one_thread")
def test_a_full_queue_refuses_and_a_closed_engine_fails_what_waits():
    model = tiny_model().eval()
    engine = Engine(model, max_batch=1, max_queue=2, decoder=decode.Decoder(model, costs=_FLAT))  # not started
    waiting = [_Collect(), _Collect(), _Collect()]  # room in the batch for one, and two in the queue
    for c in waiting:
        engine.submit(c.job(b"x", 5))
    with pytest.raises(QueueFull, match="3 requests are waiting"):
        engine.submit(_Collect().job(b"x", 5))
    engine.start()
    for c in waiting:
        assert c.wait().output == decode.generate(model, b"x", max_bytes=5).output
    engine.close()
    with pytest.raises(QueueFull, match="shutting down"):
        engine.submit(_Collect().job(b"x", 5))


@pytest.mark.usefixtures("one_thread")
def test_scoring_jobs_run_between_passes_and_equal_byte_logprobs():
    model = tiny_model(seq_len=16).eval()
    engine = _engine(model, max_batch=2)
    try:
        gen, done = _Collect(), threading.Event()
        engine.submit(gen.job(b"z", 50))
        got = {}
        texts = [b"hello", b"a longer text than the context holds"]
        engine.submit(ScoreJob(texts, top=2, on_done=lambda r: (got.setdefault("r", r), done.set())))
        assert done.wait(60)
        for a, b in zip(got["r"], byte_logprobs(model, texts, top=2)):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-6) and [t[0][0] for t in a.top] == [t[0][0] for t in b.top]
        assert gen.wait().output == decode.generate(model, b"z", max_bytes=50).output
    finally:
        engine.close()


@pytest.mark.usefixtures("one_thread")
def test_a_fault_in_a_pass_fails_its_requests_not_the_engine(monkeypatch):
    model = tiny_model().eval()
    engine = _engine(model, max_batch=2, draft=Draft.plain())
    try:
        broken = _Collect()
        real = engine.decoder.step
        monkeypatch.setattr(engine.decoder, "step", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
        engine.submit(broken.job(b"a", 50))
        broken.wait()
        assert "RuntimeError: boom" in broken.error
        monkeypatch.setattr(engine.decoder, "step", real)
        _serves_on(engine, model, b"a")
    finally:
        engine.close()


@pytest.mark.slow
@FITTED
@pytest.mark.parametrize("draft", [Draft(), Draft(lookup=True)])
def test_the_engine_on_the_static_step_equals_each_prompt_decoded_alone(draft):
    """`serve --compile on`: every pass runs the static step (here uncompiled, the same code) at a
    batch bucket's size, placeholder rows filling the batch, and each greedy output equals that
    prompt decoded alone."""
    from bytemtp.decoding.compiled import StaticStep

    model = fitted_model(0, "transformer")
    decoder = decode.Decoder(model, costs=_FLAT, compile="on")
    sizes = []

    class Spy(StaticStep):
        def __call__(self, ids_BT, cache, **kw):
            sizes.append(ids_BT.shape[0])
            return super().__call__(ids_BT, cache, **kw)

    decoder.policy.static = Spy(model, decoder.pass_heads, compiled=False)
    engine = Engine(model, decoder=decoder, max_batch=3, draft=draft)
    engine.start()
    warm_up = len(sizes)
    try:
        assert engine.static and warm_up > 0  # every bucket's shapes ran before the first request
        prompts = [SONGS[0][:5], b"", SONGS[1][:3], b"la la", SONGS[2]]
        lengths = [40, 7, 90, 1, 30]
        got = []
        for i, (prompt, n) in enumerate(zip(prompts, lengths)):
            got.append(_Collect())
            engine.submit(got[-1].job(prompt, n))
            if i % 2:
                time.sleep(0.05)
        for c, prompt, n in zip(got, prompts, lengths):
            assert c.wait().output == decode.generate(model, prompt, max_bytes=n).output
        assert len(sizes) - warm_up >= engine.stats.passes > 0  # the passes ran the static step
        assert set(sizes[warm_up:]) <= set(batch_buckets(3))
    finally:
        engine.close()


def test_an_eager_engine_does_not_compile():
    engine = Engine(tiny_model().eval(), max_batch=2, draft=Draft.plain())
    engine.start()
    try:
        assert not engine.static and engine.decoder.policy.static is None
    finally:
        engine.close()


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("after", [0, 3])  # the fault at the row's prefill, or in a pass after 3 bytes
def test_a_row_whose_decoding_fails_fails_alone(monkeypatch, after):
    """One row raises (here: its proposals, from its prefill on or after 3 bytes); it alone gets an
    error, the rows beside it decode on exactly as each prompt alone, and the jobs waiting behind
    the batch (taken from the queue or not) are all answered."""
    model = tiny_model().eval()
    engine = _engine(model, max_batch=3, draft=Draft(4))
    real = engine.decoder.propose

    def propose(row, *args, **kw):
        if row.prompt == b"poison" and len(row.out.data) >= after:
            raise RuntimeError("a poisoned row")
        return real(row, *args, **kw)

    monkeypatch.setattr(engine.decoder, "propose", propose)
    try:
        prompts = [b"ab", b"poison", b"cd", b"e", b"fgh", b""]
        got = [_Collect() for _ in prompts]
        for c, prompt in zip(got, prompts):
            engine.submit(c.job(prompt, 30))
        for c, prompt in zip(got, prompts):
            c.wait()
            if prompt == b"poison":
                assert c.result is None and "RuntimeError: a poisoned row" in c.error
                assert len(b"".join(c.pieces)) >= after
            else:
                want = decode.generate(model, prompt, max_bytes=30).output
                assert c.error is None and c.result.output == want and b"".join(c.pieces) == want
        assert engine.running == 0 and engine.queued == 0 and engine.stats.errors == 1
        monkeypatch.setattr(engine.decoder, "propose", real)
        _serves_on(engine, model, b"poison")
    finally:
        engine.close()


@pytest.mark.usefixtures("one_thread")
def test_a_fault_that_no_row_raises_alone_fails_its_batch_once_it_repeats(monkeypatch):
    """A pass that fails at any batch of two or more rows (a fault of the model, not of a row):
    every row decodes a pass alone without it, goes on, meets it again, and then every row fails;
    the engine serves on."""
    model = rare_eos_model()  # no row ends before the fault comes again
    engine = _engine(model, max_batch=2, draft=Draft.plain())
    real = engine.decoder.step

    def step(state, choice):
        if sum(r not in state.finished for r in state.active) > 1:
            raise RuntimeError("a batch fault")
        return real(state, choice)

    monkeypatch.setattr(engine.decoder, "step", step)
    try:
        got = [_Collect(), _Collect()]
        for c, prompt in zip(got, [b"a", b"b"]):
            engine.submit(c.job(prompt, 50))
        for c in got:
            c.wait()
            assert "RuntimeError: a batch fault" in c.error and 0 < len(b"".join(c.pieces)) < 50
        _serves_on(engine, model, b"a")
    finally:
        engine.close()


@pytest.mark.usefixtures("one_thread")
def test_a_request_larger_than_the_queue_is_queued_whole_when_nothing_waits():
    model = tiny_model().eval()
    engine = Engine(model, max_batch=2, max_queue=3, decoder=decode.Decoder(model, costs=_FLAT))  # not started
    big = [_Collect() for _ in range(12)]  # more than the batch and the queue hold
    engine.submit(*[c.job(bytes([97 + i]), 3) for i, c in enumerate(big)])
    with pytest.raises(QueueFull, match="12 requests are waiting"):
        engine.submit(_Collect().job(b"x", 3))  # behind it, the queue is full
    engine.submit(ScoreJob([b"ab"], top=0), follow_up=True)  # a queued request's scoring: never refused
    engine.start()
    try:
        for i, c in enumerate(big):
            assert c.wait().output == decode.generate(model, bytes([97 + i]), max_bytes=3).output
        later = _Collect()
        engine.submit(later.job(b"x", 3))
        assert later.wait().output == decode.generate(model, b"x", max_bytes=3).output
    finally:
        engine.close()
