"""Self-speculative greedy decoding on scripted models that know their texts (`ScriptedModel`, and
`ScriptedBatchModel` for batches whose rows follow their own texts and acceptance patterns): the
never / always / sometimes-accept cases, EOS, stop strings and max_bytes inside accepted drafts."""

import pytest
from doubles import CPU_LIKE, FLAT, TEXT, ScriptedBatchModel, ScriptedModel, generate_batch, generate_speculative
from hypothesis import given, settings
from hypothesis import strategies as st

from bytemtp.decoding import decode, loop
from bytemtp.decoding.drafting import Choice, DraftTree, PassCosts
from bytemtp.decoding.strategy import Draft


@pytest.mark.parametrize("name,right,per_forward", [
    ("never", lambda j: False, 1.0),
    ("always", lambda j: True, None),
    ("partial", lambda j: j <= 3, 3.0),
])
def test_scripted_acceptance(name, right, per_forward):
    plain = decode.generate(ScriptedModel(TEXT, right), b"", max_bytes=100)
    model = ScriptedModel(TEXT, right)
    spec = generate_speculative(model, b"", max_bytes=100, draft=Draft(8))
    assert plain.output == spec.output == TEXT
    stats = spec.stats
    if name == "never":
        assert stats.acceptance == [0.0] * 7 and stats.bytes_per_forward <= 1.0
    elif name == "always":
        # every draft is used but those of the last pass that lie past the end (EOS)
        assert all(a >= d - 1 for a, d in zip(stats.accepted, stats.drafted))
        assert stats.forward_passes <= -(-len(TEXT) // 8) + 2
    else:
        assert all(a >= d - 1 for a, d in zip(stats.accepted[:2], stats.drafted[:2]))
        assert stats.accepted[2] == 0
        assert stats.bytes_per_forward == pytest.approx(per_forward, abs=0.5)
    assert stats.forward_passes == model.calls


def test_eos_inside_an_accepted_draft_stops_there():
    model = ScriptedModel(b"abc", lambda j: True)
    got = generate_speculative(model, b"", max_bytes=50, draft=Draft(8))
    assert got.output == b"abc" and got.stats.stopped_by == "eos"
    # honest counts: the EOS draft ends the output and is not counted as a used draft
    assert got.stats.accepted[:3] == [1, 1, 0] and got.stats.bytes_out == 3


@pytest.mark.parametrize("max_bytes", [0, 1, 7, 8, 9])
def test_max_bytes_edges(max_bytes):
    model = ScriptedModel(TEXT, lambda j: True)
    got = generate_speculative(model, b"", max_bytes=max_bytes, draft=Draft(8))
    assert got.output == TEXT[:max_bytes]
    assert got.stats.stopped_by == "max_bytes"


def test_stop_string_inside_accepted_drafts():
    model = ScriptedModel(TEXT, lambda j: True)
    got = generate_speculative(model, b"", max_bytes=50, stop=(b"():",), draft=Draft(8))
    assert got.output == b"def main():" and got.stats.stopped_by == "stop"
    # drafts after the stop string were right but are not output, so they are not counted
    assert sum(got.stats.accepted) + got.stats.forward_passes == len(got.output) + 1


def test_streamed_pieces_equal_the_output():
    pieces = []
    model = ScriptedModel(TEXT, lambda j: j % 2 == 0)
    got = generate_speculative(model, b"", max_bytes=50, on_bytes=pieces.append, draft=Draft(8))
    assert b"".join(pieces) == got.output == TEXT


def test_heads_must_exist():
    with pytest.raises(ValueError, match="heads=9"):
        generate_speculative(ScriptedModel(TEXT, lambda j: True), b"", max_bytes=5, draft=Draft(9))


_DOCS = [  # prompt, text, which draft heads are right
    (b"", TEXT, lambda j: j <= 3),
    (b"A", b"always right: every draft is accepted until the end\n", lambda j: True),
    (b"Nv", b"never right", lambda j: False),
    (b"Odd", b"odd heads are right, even heads are wrong.", lambda j: j % 2 == 1),
    (b"S", b"ab", lambda j: True),  # EOS arrives inside an accepted draft
]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("k", [1, 2, 5, 8])
def test_scripted_batch_rows_follow_their_own_texts(k):
    model = ScriptedBatchModel(_DOCS)
    prompts = [prompt for prompt, _, _ in _DOCS]
    batch = generate_batch(model, prompts, max_bytes=100, draft=Draft(k))
    for (prompt, text, right), got in zip(_DOCS, batch):
        assert got.output == text and got.stats.stopped_by == "eos"
        alone_model = ScriptedBatchModel(_DOCS)
        alone = generate_speculative(alone_model, prompt, max_bytes=100, draft=Draft(k))
        assert alone.output == text and alone_model.calls == alone.stats.forward_passes
        # per-row stats are that row's own: as many passes and drafts as decoding it alone
        assert got.stats.forward_passes == alone.stats.forward_passes
        assert got.stats.drafted == alone.stats.drafted and got.stats.accepted == alone.stats.accepted
        assert got.stats.bytes_out == len(text)
        assert all(a <= d for a, d in zip(got.stats.accepted, got.stats.drafted))
    passes = [got.stats.forward_passes for got in batch]
    assert max(passes) == model.calls  # the last row to finish took part in every pass
    never, always, short = batch[2].stats, batch[1].stats, batch[4].stats
    assert never.forward_passes == len(_DOCS[2][1]) + 1  # prefill + one pass per byte (last: EOS)
    assert never.accepted == [0] * (k - 1)
    if k > 1:
        assert all(a >= d - 1 for a, d in zip(always.accepted, always.drafted))  # all but past the end
        # the prefill gives one byte, then each pass k (its next byte and k - 1 accepted drafts)
        assert always.forward_passes == 1 + -(-len(_DOCS[1][1]) // k)
        assert short.forward_passes == 2  # "a" from the prefill, then "b" and EOS as drafts
        assert all(a >= d - 1 for a, d in zip(batch[0].stats.accepted[:2], batch[0].stats.drafted[:2]))
        if k > 3:
            assert batch[0].stats.acceptance[2] == 0.0
        assert batch[3].stats.accepted == [0] * (k - 1)  # head 2 is wrong: nothing after it counts
    # the rows finished at different passes, so the cache dropped rows while others continued
    assert len(set(passes)) > 2


@pytest.mark.usefixtures("one_thread")
def test_scripted_batch_eos_inside_accepted_drafts_while_other_rows_continue():
    docs = [(b"S", b"ab", lambda j: True), (b"T", b"xy", lambda j: True),
            (b"L", b"a longer text that keeps going", lambda j: j <= 4)]
    model = ScriptedBatchModel(docs)
    pieces = {}
    batch = generate_batch(model, [d[0] for d in docs], max_bytes=60, draft=Draft(8),
                                  on_bytes=lambda r, piece: pieces.setdefault(r, []).append(piece))
    assert [g.output for g in batch] == [d[1] for d in docs]
    assert [g.stats.stopped_by for g in batch] == ["eos"] * 3
    assert batch[0].stats.forward_passes == batch[1].stats.forward_passes == 2
    assert batch[2].stats.forward_passes > 2
    assert {r: b"".join(p) for r, p in pieces.items()} == {r: g.output for r, g in enumerate(batch)}


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("k", [2, 4, 8])
@pytest.mark.parametrize("extra", [0, 1, 2, "k", "k+1"])
def test_scripted_batch_max_bytes_edges(k, extra):
    max_bytes = {"k": k, "k+1": k + 1}.get(extra, extra)
    model = ScriptedBatchModel(_DOCS[:4])
    prompts = [d[0] for d in _DOCS[:4]]
    batch = generate_batch(model, prompts, max_bytes=max_bytes, draft=Draft(k))
    for (_, text, _), got in zip(_DOCS, batch):
        assert got.output == text[:max_bytes]
        assert got.stats.stopped_by == "max_bytes" and got.stats.bytes_out == max_bytes
        # no draft is offered past max_bytes, and no pass runs after the last byte is known
        assert sum(got.stats.accepted) <= max(0, max_bytes - 1)
        assert got.stats.forward_passes <= max(1, max_bytes)
    if max_bytes == 0:
        assert model.calls == 0
    else:
        # all drafts accepted: the prefill gives the first byte, then each pass up to k more
        assert batch[1].stats.forward_passes == 1 + -(-(max_bytes - 1) // k)
        # ... and a draft is only offered (counted) where it may still become output
        n, drafted = 1, [0] * (k - 1)
        while n < max_bytes:
            offered = min(k - 1, max_bytes - n)
            drafted[:offered] = [d + 1 for d in drafted[:offered]]
            n += offered + 1  # the offered drafts, then the next byte
        assert batch[1].stats.drafted == batch[1].stats.accepted == drafted
        assert model.calls == max(got.stats.forward_passes for got in batch)


@pytest.mark.usefixtures("one_thread")
def test_scripted_batch_stop_strings_per_row():
    model = ScriptedBatchModel(_DOCS)
    batch = generate_batch(model, [d[0] for d in _DOCS], max_bytes=100, draft=Draft(6),
                                  stop=(b"():", b"ri", b"heads"))
    assert [g.output for g in batch] == [b"def main():", b"always ri", b"never ri",
                                         b"odd heads", b"ab"]
    assert [g.stats.stopped_by for g in batch] == ["stop"] * 4 + ["eos"]


@pytest.mark.slow  # 100 examples; the fixed batches above stay in the quick suite
@pytest.mark.usefixtures("one_thread")
@settings(max_examples=100, deadline=None)
@given(docs=st.lists(st.tuples(st.binary(max_size=3), st.binary(max_size=30),
                               st.frozensets(st.integers(2, 8))), min_size=1, max_size=5),
       k=st.integers(1, 8), max_bytes=st.integers(0, 40), data=st.data())
def test_scripted_batch_rows_equal_rows_alone_property(docs, k, max_bytes, data):
    # distinct first prompt bytes, so that each row's prefix selects its own document
    docs = [(bytes([65 + i]) + prompt, text, right.__contains__)
            for i, (prompt, text, right) in enumerate(docs)]
    stop = data.draw(st.lists(st.binary(min_size=1, max_size=2), max_size=2).map(tuple))
    model = ScriptedBatchModel(docs)
    batch = generate_batch(model, [d[0] for d in docs], max_bytes=max_bytes, draft=Draft(k), stop=stop)
    for (prompt, text, _), got in zip(docs, batch):
        alone = generate_speculative(ScriptedBatchModel(docs), prompt, max_bytes=max_bytes,
                                            draft=Draft(k), stop=stop)
        plain = decode.generate(ScriptedBatchModel(docs), prompt, max_bytes=max_bytes, stop=stop)
        assert got.output == alone.output == plain.output and text.startswith(got.output)
        assert got.stats.stopped_by == alone.stats.stopped_by == plain.stats.stopped_by
        assert (got.stats.forward_passes, got.stats.drafted, got.stats.accepted) == \
            (alone.stats.forward_passes, alone.stats.drafted, alone.stats.accepted)
    assert model.calls == max(g.stats.forward_passes for g in batch)


# --- switching from plain passes to speculative ones within a call ------------------------------

class _Switching(decode.Decoder):
    """Plans plain and speculative chains by turns, whatever they cost: every re-plan after a
    plain stretch wants more heads than have complete caches."""

    HEADS = (1, 8, 1, 3, 2, 5)

    def __init__(self, model):
        super().__init__(model, costs=FLAT, compile="off")
        self.plans = 0

    def plan(self, draft, **kw):
        k = self.HEADS[self.plans % len(self.HEADS)]
        self.plans += 1
        return Choice(k, DraftTree.chain(k - 1), 0.0, 0.0)


@pytest.mark.usefixtures("one_thread")
def test_plain_to_speculative_switches_within_a_call_keep_greedy_output():
    docs = [(b"", TEXT * 12, lambda j: True), (b"P", TEXT * 9, lambda j: j <= 3),
            (b"Q", b"short: done early", lambda j: True), (b"R", TEXT * 7, lambda j: j % 2 == 0),
            (b"S", TEXT[:20] * 2, lambda j: j <= 2)]  # ends in the first plain stretch: drafts nothing
    model = ScriptedBatchModel(docs)
    dec = _Switching(model)
    batch = dec.generate([p for p, _, _ in docs], max_bytes=300, draft=Draft())
    for (prompt, text, _), got in zip(docs, batch):
        assert got.output == decode.generate(ScriptedBatchModel(docs), prompt, max_bytes=300).output
    used = batch[0].stats.heads_used
    assert dec.plans > 6 and {8, 3, 5} <= set(used)  # more heads ran after plain passes
    assert batch[0].stats.slides > 0  # and after windows slid


class _Clock:
    """A fake `time`: the model advances it by what its passes cost."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class _TimedModel(ScriptedModel):
    def __init__(self, text, right, clock, costs):
        super().__init__(text, right)
        self.clock, self.costs = clock, costs

    def logits(self, ids, cache, heads=None, **kw):
        self.clock.now += self.costs.predicted(heads or self.config.n_future, ids.shape[1])
        return super().logits(ids, cache, heads, **kw)


@pytest.mark.usefixtures("one_thread")
def test_auto_that_starts_stuck_on_plain_ends_at_the_best_fixed_shape(monkeypatch):
    clock, costs = _Clock(), PassCosts(dict(CPU_LIKE.table))
    monkeypatch.setattr(decode, "time", clock)
    monkeypatch.setattr(loop, "time", clock)  # the windows of passes the chooser weighs, timed alike
    model = _TimedModel(TEXT * 30, lambda j: True, clock, costs)
    dec = decode.Decoder(model, compile="off")
    dec.calibration.known[1, False] = costs  # calibrated by the fake clock's passes
    dec.generate([b""], max_bytes=100, draft=Draft(8))  # the profile learns every depth
    # but speculation delivered less than plain decoding when it last ran (the machine was busy then)
    costs.arbiter().record(speculative=False, rate=1.0, seconds=16.0)
    costs.arbiter().record(speculative=True, rate=0.8, seconds=4.0, rewarm_s=0.5)
    assert not costs.arbiter().arm()[0]  # so plain decoding runs until the budget allows a try
    got = dec.generate([b""], max_bytes=600, draft="chain")[0]
    assert got.output == decode.generate(ScriptedModel(TEXT * 30, lambda j: True), b"", max_bytes=600).output
    assert dec.last_choice.heads == 8  # the best fixed draft here: a chain of all heads
    assert costs.arbiter().winning and sum(got.stats.accepted) > 0.5 * len(got.output)  # most bytes drafted
