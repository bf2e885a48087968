"""Self-speculative decoding of small fitted models (`doubles.fitted_model`) against plain decoding,
its slow reference: greedy one row and batches, and batch sampling reproducible from its seed."""

import pytest
from doubles import FITTED, SONGS, fitted_model, generate_batch, generate_speculative, seeded_sampling
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bytemtp.decoding import decode
from bytemtp.decoding.strategy import Draft


@pytest.mark.slow
@FITTED
def test_fitted_models_accept_some_drafts_but_not_all():
    rates = []
    for head_type in ("transformer", "causal", "linear"):
        got = generate_speculative(fitted_model(0, head_type), b"one t", max_bytes=40, draft=Draft(8))
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
    spec = generate_speculative(model, prompt, max_bytes=max_bytes, draft=Draft(k))
    assert spec.output == plain.output
    assert spec.stats.stopped_by == plain.stats.stopped_by
    assert spec.stats.forward_passes <= plain.stats.forward_passes


# --- batches: every row equals that row decoded alone ------------------------------------------

_HEAD_TYPES = ["transformer", "linear", "causal"]
# the quick suite decodes a fitted model of the default head type; the other types' (each a model
# to fit) run in make test
_HEAD_TYPES_QUICK_DEFAULT = [t if t == "transformer" else pytest.param(t, marks=pytest.mark.slow) for t in _HEAD_TYPES]


def _batch_prompts(seq_len: int, max_bytes: int) -> list[bytes]:
    """Prompts of different lengths: empty, one byte, song fragments, random bytes, and two that
    end near the context end (the longest fills it exactly: 1 + len + max_bytes == seq_len)."""
    longest = seq_len - 1 - max_bytes
    filler = SONGS[0] * 3
    return [b"", b"o", b"one two t", b"la la la, la la", bytes(range(200, 212)),
            filler[:longest - 3], filler[5:5 + longest]]


@FITTED
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("head_type", _HEAD_TYPES_QUICK_DEFAULT)
def test_greedy_batch_equals_each_row_alone(head_type):
    model = fitted_model(0, head_type)
    max_bytes = 16
    prompts = _batch_prompts(model.config.seq_len, max_bytes)
    assert len(prompts[-1]) + 1 + max_bytes == model.config.seq_len
    alone = [decode.generate(model, p, max_bytes=max_bytes) for p in prompts]
    runs = {("plain batch", False): generate_batch(model, prompts, max_bytes=max_bytes,
                                                          draft="plain")}
    for k in (2, model.config.n_future):
        for stacked in (True, False):
            runs[(k, stacked)] = generate_batch(model, prompts, max_bytes=max_bytes, draft=Draft(k),
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
    batch = generate_batch(model, prompts, max_bytes=max_bytes, draft=Draft(k), stacked=stacked)
    for p, got in zip(prompts, batch):
        ref = decode.generate(model, p, max_bytes=max_bytes)
        assert (got.output, got.stats.stopped_by) == (ref.output, ref.stats.stopped_by)


# --- sampling from a fitted model in a batch; streaming ------------------------------------------

_SAMPLE_PROMPTS = [b"", b"o", b"la la", b"one two three", bytes(range(240, 250))]


@FITTED
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("head_type", _HEAD_TYPES_QUICK_DEFAULT)
def test_batch_sampling_is_reproducible_from_the_seed(head_type):
    model = fitted_model(0, head_type)
    runs = {}
    for seed in (1, 1, 2):
        for stacked in (True, False):
            batch = generate_batch(model, _SAMPLE_PROMPTS, max_bytes=24, draft=Draft(4), stacked=stacked,
                                          sampling=seeded_sampling(seed, temperature=1.3, top_k=40, top_p=0.97))
            runs.setdefault(seed, []).append([g.output for g in batch])
            assert all(len(g.output) <= 24 and 0.0 <= min(g.stats.acceptance, default=0.0)
                       and max(g.stats.acceptance, default=0.0) <= 1.0 for g in batch)
    assert all(run == runs[1][0] for run in runs[1])  # same seed: same outputs, stacked or not
    assert runs[2][0] == runs[2][1]
    assert runs[1][0] != runs[2][0]  # the seed matters (24 bytes at temperature 1.3 in 5 rows)


@FITTED
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("head_type", _HEAD_TYPES_QUICK_DEFAULT)
def test_plain_batch_sampling_runs_and_matches_plain_decoding(head_type):
    model = fitted_model(0, head_type)
    batch = generate_batch(model, _SAMPLE_PROMPTS, max_bytes=20, draft="plain",
                                  sampling=seeded_sampling(3, temperature=0.9, top_p=0.9))
    again = generate_batch(model, _SAMPLE_PROMPTS, max_bytes=20, draft="plain",
                                  sampling=seeded_sampling(3, temperature=0.9, top_p=0.9))
    assert [g.output for g in batch] == [g.output for g in again]
    for got in batch:
        stats = got.stats
        assert stats.drafted == [] and len(got.output) <= 20
        # one byte per pass: the last pass gave the final byte, or one more gave EOS
        assert stats.forward_passes == stats.bytes_out + (stats.stopped_by == "eos")
    # one row with k = 1 draws from the generator exactly as plain decoding does, byte for byte
    for prompt in _SAMPLE_PROMPTS[:3]:
        row = generate_batch(model, [prompt], max_bytes=20, draft="plain",
                                    sampling=seeded_sampling(5, temperature=1.1))[0]
        plain = decode.generate(model, prompt, max_bytes=20, sampling=seeded_sampling(5, temperature=1.1))
        assert row.output == plain.output


@FITTED
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("sampling", [None, "sampled"])
@pytest.mark.parametrize("head_type", _HEAD_TYPES_QUICK_DEFAULT)
def test_streamed_pieces_per_row_equal_the_outputs(head_type, sampling):
    model = fitted_model(0, head_type)
    for k, speculative in ((4, True), (8, True), (1, False)):
        pieces = {}
        batch = generate_batch(
            model, _SAMPLE_PROMPTS, max_bytes=20, draft=Draft(k) if speculative else "plain",
            sampling=seeded_sampling(4) if sampling else None, stop=(b"la l",),
            on_bytes=lambda r, piece: pieces.setdefault(r, []).append(piece))
        assert set(pieces) <= set(range(len(_SAMPLE_PROMPTS))) and any(g.output for g in batch)
        for r, got in enumerate(batch):
            assert all(isinstance(p, bytes) and p for p in pieces.get(r, []))
            assert b"".join(pieces.get(r, [])) == got.output
