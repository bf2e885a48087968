"""Self-speculative greedy decoding against plain greedy decoding, its slow reference."""


import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from doubles import (FITTED, MARKOV_SYMBOLS, MARKOV_TARGET, SONGS, TEXT, MarkovModel, ScriptedBatchModel, ScriptedModel,
                     chi2_critical, fitted_model, seeded_sampling)

from bytemtp.decoding import decode
from bytemtp.decoding.drafting import Draft, PassCosts
from bytemtp.vocab import EOS


@pytest.mark.parametrize("name,right,per_forward", [
    ("never", lambda j: False, 1.0),
    ("always", lambda j: True, None),
    ("partial", lambda j: j <= 3, 3.0),
])
def test_scripted_acceptance(name, right, per_forward):
    plain = decode.generate(ScriptedModel(TEXT, right), b"", max_bytes=100)
    model = ScriptedModel(TEXT, right)
    spec = decode.generate_speculative(model, b"", max_bytes=100, draft=Draft(8))
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
    got = decode.generate_speculative(model, b"", max_bytes=50, draft=Draft(8))
    assert got.output == b"abc" and got.stats.stopped_by == "eos"
    # honest counts: the EOS draft ends the output and is not counted as a used draft
    assert got.stats.accepted[:3] == [1, 1, 0] and got.stats.bytes_out == 3


@pytest.mark.parametrize("max_bytes", [0, 1, 7, 8, 9])
def test_max_bytes_edges(max_bytes):
    model = ScriptedModel(TEXT, lambda j: True)
    got = decode.generate_speculative(model, b"", max_bytes=max_bytes, draft=Draft(8))
    assert got.output == TEXT[:max_bytes]
    assert got.stats.stopped_by == "max_bytes"


def test_stop_string_inside_accepted_drafts():
    model = ScriptedModel(TEXT, lambda j: True)
    got = decode.generate_speculative(model, b"", max_bytes=50, stop=(b"():",), draft=Draft(8))
    assert got.output == b"def main():" and got.stats.stopped_by == "stop"
    # drafts after the stop string were right but are not output, so they are not counted
    assert sum(got.stats.accepted) + got.stats.forward_passes == len(got.output) + 1


def test_streamed_pieces_equal_the_output():
    pieces = []
    model = ScriptedModel(TEXT, lambda j: j % 2 == 0)
    got = decode.generate_speculative(model, b"", max_bytes=50, on_bytes=pieces.append, draft=Draft(8))
    assert b"".join(pieces) == got.output == TEXT


def test_heads_must_exist():
    with pytest.raises(ValueError, match="heads=9"):
        decode.generate_speculative(ScriptedModel(TEXT, lambda j: True), b"", max_bytes=5, draft=Draft(9))


@pytest.mark.slow
@FITTED
def test_fitted_models_accept_some_drafts_but_not_all():
    rates = []
    for head_type in ("transformer", "causal", "linear"):
        got = decode.generate_speculative(fitted_model(0, head_type), b"one t", max_bytes=40, draft=Draft(8))
        rates += got.stats.acceptance
    assert 0.1 < sum(rates) / len(rates) < 1.0


@pytest.mark.slow
@FITTED
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 1), head_type=st.sampled_from(["transformer", "causal", "linear"]),
       prompt=st.one_of(st.just(b""), st.binary(min_size=1, max_size=1), st.binary(max_size=40),
                        st.sampled_from(SONGS), st.binary(min_size=55, max_size=60)),
       k=st.integers(1, 8), max_bytes=st.integers(0, 20))
def test_speculative_greedy_equals_plain_greedy(seed, head_type, prompt, k, max_bytes):
    model = fitted_model(seed, head_type)
    max_bytes = min(max_bytes, model.config.seq_len - len(prompt) - 1)  # near the context end too
    plain = decode.generate(model, prompt, max_bytes=max_bytes)
    spec = decode.generate_speculative(model, prompt, max_bytes=max_bytes, draft=Draft(k))
    assert spec.output == plain.output
    assert spec.stats.stopped_by == plain.stats.stopped_by
    assert spec.stats.forward_passes <= plain.stats.forward_passes


# --- batches: every row equals that row decoded alone ------------------------------------------

_HEAD_TYPES = ["transformer", "linear", "causal"]


def _batch_prompts(seq_len: int, max_bytes: int) -> list[bytes]:
    """Prompts of different lengths: empty, one byte, song fragments, random bytes, and two that
    end near the context end (the longest fills it exactly: 1 + len + max_bytes == seq_len)."""
    longest = seq_len - 1 - max_bytes
    filler = SONGS[0] * 3
    return [b"", b"o", b"one two t", b"la la la, la la", bytes(range(200, 212)),
            filler[:longest - 3], filler[5:5 + longest]]


@FITTED
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("head_type", _HEAD_TYPES)
def test_greedy_batch_equals_each_row_alone(head_type):
    model = fitted_model(0, head_type)
    max_bytes = 16
    prompts = _batch_prompts(model.config.seq_len, max_bytes)
    assert len(prompts[-1]) + 1 + max_bytes == model.config.seq_len
    alone = [decode.generate(model, p, max_bytes=max_bytes) for p in prompts]
    runs = {("plain batch", False): decode.generate_batch(model, prompts, max_bytes=max_bytes,
                                                          draft="plain")}
    for k in (2, model.config.n_future):
        for stacked in (True, False):
            runs[(k, stacked)] = decode.generate_batch(model, prompts, max_bytes=max_bytes, draft=Draft(k),
                                                       stacked=stacked)
    accepted = 0
    for key, batch in runs.items():
        assert len(batch) == len(prompts)
        for p, got, ref in zip(prompts, batch, alone):
            assert got.output == ref.output, (key, p)
            assert got.stats.stopped_by == ref.stats.stopped_by, (key, p)
            assert got.stats.bytes_out == len(got.output)
            assert 1 <= got.stats.forward_passes <= ref.stats.forward_passes, (key, p)
            accepted += sum(got.stats.accepted)
    # the plain (k = 1) batch does exactly what plain decoding does, pass for pass
    for got, ref in zip(runs[("plain batch", False)], alone):
        assert got.stats.forward_passes == ref.stats.forward_passes
        assert got.stats.drafted == got.stats.accepted == []
    assert accepted > 0  # the drafts did something: the speculative path was exercised


@pytest.mark.slow
@FITTED
@pytest.mark.usefixtures("one_thread")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(head_type=st.sampled_from(_HEAD_TYPES),
       prompts=st.lists(st.one_of(st.binary(max_size=30), st.sampled_from(SONGS),
                                  st.sampled_from(SONGS).map(lambda s: s[:7])), min_size=1, max_size=5),
       k=st.integers(1, 8), max_bytes=st.integers(0, 24), stacked=st.booleans())
def test_greedy_batch_equals_rows_alone_property(head_type, prompts, k, max_bytes, stacked):
    model = fitted_model(0, head_type)
    max_bytes = min(max_bytes, model.config.seq_len - 1 - max(map(len, prompts)))
    batch = decode.generate_batch(model, prompts, max_bytes=max_bytes, draft=Draft(k), stacked=stacked)
    for p, got in zip(prompts, batch):
        ref = decode.generate(model, p, max_bytes=max_bytes)
        assert (got.output, got.stats.stopped_by) == (ref.output, ref.stats.stopped_by)


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
    batch = decode.generate_batch(model, prompts, max_bytes=100, draft=Draft(k))
    for (prompt, text, right), got in zip(_DOCS, batch):
        assert got.output == text and got.stats.stopped_by == "eos"
        alone_model = ScriptedBatchModel(_DOCS)
        alone = decode.generate_speculative(alone_model, prompt, max_bytes=100, draft=Draft(k))
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
    batch = decode.generate_batch(model, [d[0] for d in docs], max_bytes=60, draft=Draft(8),
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
    batch = decode.generate_batch(model, prompts, max_bytes=max_bytes, draft=Draft(k))
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
    batch = decode.generate_batch(model, [d[0] for d in _DOCS], max_bytes=100, draft=Draft(6),
                                  stop=(b"():", b"ri", b"heads"))
    assert [g.output for g in batch] == [b"def main():", b"always ri", b"never ri",
                                         b"odd heads", b"ab"]
    assert [g.stats.stopped_by for g in batch] == ["stop"] * 4 + ["eos"]


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
    batch = decode.generate_batch(model, [d[0] for d in docs], max_bytes=max_bytes, draft=Draft(k), stop=stop)
    for (prompt, text, _), got in zip(docs, batch):
        alone = decode.generate_speculative(ScriptedBatchModel(docs), prompt, max_bytes=max_bytes,
                                            draft=Draft(k), stop=stop)
        plain = decode.generate(ScriptedBatchModel(docs), prompt, max_bytes=max_bytes, stop=stop)
        assert got.output == alone.output == plain.output and text.startswith(got.output)
        assert got.stats.stopped_by == alone.stats.stopped_by == plain.stats.stopped_by
        assert (got.stats.forward_passes, got.stats.drafted, got.stats.accepted) == \
            (alone.stats.forward_passes, alone.stats.drafted, alone.stats.accepted)
    assert model.calls == max(g.stats.forward_passes for g in batch)


# chi-square critical value at p = 0.001 for 3 ** 3 - 1 = 26 degrees of freedom (standard
# table; scipy.stats.chi2.ppf(0.999, 26) = 54.052), checked below against torch's gammaincc
_CHI2_26_P001 = 54.052


def _target_probs() -> dict[bytes, float]:
    """Exact probability of each 3-byte output: the product of head 1's conditionals (the first
    byte is predicted at position 0, after the leading EOS)."""
    probs = {}
    for a in range(3):
        for b in range(3):
            for c in range(3):
                x = [MARKOV_SYMBOLS[a], MARKOV_SYMBOLS[b], MARKOV_SYMBOLS[c]]
                probs[bytes(x)] = (MARKOV_TARGET[0][EOS][a] * MARKOV_TARGET[1][x[0]][b] * MARKOV_TARGET[0][x[1]][c])
    return probs


def _chi_square(outputs: list[bytes]) -> float:
    expected = _target_probs()
    assert set(outputs) <= set(expected), set(outputs) - set(expected)  # 3 bytes of a, b, c
    counts = {x: 0 for x in expected}
    for out in outputs:
        counts[out] += 1
    n = len(outputs)
    return sum((counts[x] - n * p) ** 2 / (n * p) for x, p in expected.items())


def _sample_outputs(n: int, heads: int, seed: int, speculative: bool = True):
    gen = torch.Generator().manual_seed(seed)
    sampling = decode.Sampling(temperature=1.0, generator=gen)
    model, outputs, stats = MarkovModel(), [], []
    for _ in range(n // 2000):  # batches of 2000 rows (one call per batch)
        batch = decode.generate_batch(model, [b""] * 2000, max_bytes=3,
                                      draft=Draft(heads) if speculative else "plain", sampling=sampling)
        outputs += [g.output for g in batch]
        stats += [g.stats for g in batch]
    return outputs, stats


def test_chi_square_critical_value():
    df = torch.tensor(26 / 2, dtype=torch.float64)
    assert float(torch.special.gammaincc(df, torch.tensor(_CHI2_26_P001 / 2, dtype=torch.float64))) == \
        pytest.approx(0.001, rel=1e-3)
    assert sum(_target_probs().values()) == pytest.approx(1.0)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("heads", [2, 3])
def test_speculative_sampling_has_the_target_distribution(heads):
    outputs, stats = _sample_outputs(8000, heads, seed=heads)
    assert _chi_square(outputs) < _CHI2_26_P001
    drafted = sum(sum(s.drafted) for s in stats)
    accepted = sum(sum(s.accepted) for s in stats)
    assert 0 < accepted < drafted  # drafts were both accepted and rejected
    for s in stats:
        assert len(s.drafted) == heads - 1 and all(0.0 <= r <= 1.0 for r in s.acceptance)
        assert all(0 <= a <= d for a, d in zip(s.accepted, s.drafted))
        assert s.stopped_by == "max_bytes" and s.bytes_out == 3
    # P(accept) of the first draft is sum_x min(p(x), q(x)) for the position after the first byte
    assert 0.3 < accepted / drafted < 0.8


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_plain_batch_sampling_has_the_target_distribution():
    outputs, stats = _sample_outputs(4000, 1, seed=7, speculative=False)
    assert _chi_square(outputs) < _CHI2_26_P001
    assert all(s.forward_passes == 3 and s.drafted == [] for s in stats)


def _accept_all_drafts(p_TV, q_DV, drafts, generator):
    """A wrong rule: every draft accepted, the bonus byte from p (emits the draft distribution)."""
    return len(drafts), decode._sample(p_TV[len(drafts)][None], generator)[0]


def _resample_target_on_reject(p_TV, q_DV, drafts, generator):
    """A subtly wrong rule: at a rejection the next byte comes from p, not from norm(max(0, p - q))."""
    for j, d in enumerate(drafts):
        if float(torch.rand((), generator=generator)) < min(1.0, float(p_TV[j, d]) / float(q_DV[j, d])):
            continue
        return j, decode._sample(p_TV[j][None], generator)[0]
    return len(drafts), decode._sample(p_TV[len(drafts)][None], generator)[0]


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("wrong_rule,n", [(_accept_all_drafts, 2000), (_resample_target_on_reject, 4000)])
def test_chi_square_catches_a_wrong_acceptance_rule(monkeypatch, wrong_rule, n):
    monkeypatch.setattr(decode, "verify_sampled", wrong_rule)
    outputs, _ = _sample_outputs(n, 2, seed=11)
    assert _chi_square(outputs) > _CHI2_26_P001


# --- sampling from a fitted model in a batch; streaming ------------------------------------------

_SAMPLE_PROMPTS = [b"", b"o", b"la la", b"one two three", bytes(range(240, 250))]


@FITTED
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("head_type", _HEAD_TYPES)
def test_batch_sampling_is_reproducible_from_the_seed(head_type):
    model = fitted_model(0, head_type)
    runs = {}
    for seed in (1, 1, 2):
        for stacked in (True, False):
            batch = decode.generate_batch(model, _SAMPLE_PROMPTS, max_bytes=24, draft=Draft(4), stacked=stacked,
                                          sampling=seeded_sampling(seed, temperature=1.3, top_k=40, top_p=0.97))
            runs.setdefault(seed, []).append([g.output for g in batch])
            assert all(len(g.output) <= 24 and 0.0 <= min(g.stats.acceptance, default=0.0)
                       and max(g.stats.acceptance, default=0.0) <= 1.0 for g in batch)
    assert all(run == runs[1][0] for run in runs[1])  # same seed: same outputs, stacked or not
    assert runs[2][0] == runs[2][1]
    assert runs[1][0] != runs[2][0]  # the seed matters (24 bytes at temperature 1.3 in 5 rows)


@FITTED
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("head_type", _HEAD_TYPES)
def test_plain_batch_sampling_runs_and_matches_plain_decoding(head_type):
    model = fitted_model(0, head_type)
    batch = decode.generate_batch(model, _SAMPLE_PROMPTS, max_bytes=20, draft="plain",
                                  sampling=seeded_sampling(3, temperature=0.9, top_p=0.9))
    again = decode.generate_batch(model, _SAMPLE_PROMPTS, max_bytes=20, draft="plain",
                                  sampling=seeded_sampling(3, temperature=0.9, top_p=0.9))
    assert [g.output for g in batch] == [g.output for g in again]
    for got in batch:
        stats = got.stats
        assert stats.drafted == [] and len(got.output) <= 20
        # one byte per pass: the last pass gave the final byte, or one more gave EOS
        assert stats.forward_passes == stats.bytes_out + (stats.stopped_by == "eos")
    # one row with k = 1 draws from the generator exactly as plain decoding does, byte for byte
    for prompt in _SAMPLE_PROMPTS[:3]:
        row = decode.generate_batch(model, [prompt], max_bytes=20, draft="plain",
                                    sampling=seeded_sampling(5, temperature=1.1))[0]
        plain = decode.generate(model, prompt, max_bytes=20, sampling=seeded_sampling(5, temperature=1.1))
        assert row.output == plain.output


@FITTED
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("sampling", [None, "sampled"])
@pytest.mark.parametrize("head_type", _HEAD_TYPES)
def test_streamed_pieces_per_row_equal_the_outputs(head_type, sampling):
    model = fitted_model(0, head_type)
    for k, speculative in ((4, True), (8, True), (1, False)):
        pieces = {}
        batch = decode.generate_batch(
            model, _SAMPLE_PROMPTS, max_bytes=20, draft=Draft(k) if speculative else "plain",
            sampling=seeded_sampling(4) if sampling else None, stop=(b"la l",),
            on_bytes=lambda r, piece: pieces.setdefault(r, []).append(piece))
        assert set(pieces) <= set(range(len(_SAMPLE_PROMPTS))) and any(g.output for g in batch)
        for r, got in enumerate(batch):
            assert all(isinstance(p, bytes) and p for p in pieces.get(r, []))
            assert b"".join(pieces.get(r, [])) == got.output


# --- longer outputs: draft positions >= 3, the bonus byte at k >= 3, temperature, top-k, top-p ----

_FLAT_COSTS = PassCosts({(1, 1): 1.0, (1, 16): 1.0, (5, 1): 1.0, (5, 16): 1.0})  # drafting is free


def _exact_output_probs(model: "MarkovModel", sampling: decode.Sampling, n_bytes: int) -> dict[bytes, float]:
    """Exact probability of every n-byte output under head 1 with the sampling transform."""
    probs = {b"": 1.0}
    for pos in range(n_bytes):
        nxt = {}
        for prefix, pr in probs.items():
            prev = prefix[-1] if prefix else EOS
            dist = decode.distribution(model.table[pos % 2, prev, 0], sampling)
            for x in MARKOV_SYMBOLS:
                if float(dist[x]) > 0:
                    nxt[prefix + bytes([x])] = pr * float(dist[x])
        probs = nxt
    return probs


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("heads,kw", [
    (4, {}),                                        # positions 2 and 3 drafted, bonus byte after 3 drafts
    (5, {"temperature": 0.7}),                      # four drafts: every byte after the first is a draft
    (4, {"temperature": 1.3, "top_k": 2}),
    (None, {"top_p": 0.8}),                         # automatic draft length
])
def test_longer_speculative_sampling_has_the_target_distribution(heads, kw):
    n_bytes, n = 4, 12000
    model = MarkovModel(n_future=5)
    sampling = seeded_sampling(17 + (heads or 0), **kw)
    expected = _exact_output_probs(model, sampling, n_bytes)
    assert sum(expected.values()) == pytest.approx(1.0)
    outputs, stats = [], []
    decoder = decode.Decoder(model, costs=_FLAT_COSTS)
    for _ in range(n // 2000):
        batch = decoder.generate([b""] * 2000, max_bytes=n_bytes, draft=Draft(heads), sampling=sampling)
        outputs += [g.output for g in batch]
        stats += [g.stats for g in batch]
    assert set(outputs) <= set(expected), set(outputs) - set(expected)
    # bins with an expected count of at least 5; the rest pooled into one bin
    big = {x for x, p in expected.items() if n * p >= 5}
    counts = {x: 0 for x in big}
    rest = 0
    for out in outputs:
        if out in big:
            counts[out] += 1
        else:
            rest += 1
    rest_p = 1.0 - sum(expected[x] for x in big)
    chi2 = sum((counts[x] - n * expected[x]) ** 2 / (n * expected[x]) for x in big)
    bins = len(big)
    if n * rest_p >= 5:
        chi2 += (rest - n * rest_p) ** 2 / (n * rest_p)
        bins += 1
    assert chi2 < chi2_critical(bins - 1), (chi2, bins)
    # deep drafts were offered and used, and some bytes came as the bonus after all drafts
    drafted = [sum(s.drafted[j] for s in stats) for j in range(3)]
    accepted = [sum(s.accepted[j] for s in stats) for j in range(3)]
    assert all(d > 0 for d in drafted) and accepted[2] > 0
    assert all(0 < a < d for a, d in zip(accepted[:2], drafted[:2]))


def test_the_chi_square_critical_values_match_the_table():
    assert chi2_critical(26) == pytest.approx(_CHI2_26_P001, abs=0.01)
    assert chi2_critical(80) == pytest.approx(124.839, abs=0.01)  # standard table value
