"""Self-speculative decoding with prompt-lookup drafts (`Draft(lookup=True)`) against plain greedy
decoding, its reference: scripted models whose answers copy their prompts (lookup raises the bytes
a pass), tiny and fitted models on prompts that repeat (the output never changes), the heads'
profile kept apart from lookup's, and sampled rows, which keep their heads' drafts."""

import pytest
import torch
from doubles import FITTED, FLAT, SONGS, TEXT, MarkovModel, ScriptedBatchModel, fitted_model, generate_batch, tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bytemtp.decoding import decode
from bytemtp.decoding.drafting import AcceptanceProfile
from bytemtp.decoding.generation import SpeculativeStats
from bytemtp.decoding.sampling import Sampling
from bytemtp.decoding.strategy import Draft

PROMPT = b"x = compute(alpha, beta)\n" + TEXT  # the answer copies the function
ANSWER = b"y = 1\n" + TEXT + b"z\n"


def _scripted(right=lambda j: j <= 2) -> ScriptedBatchModel:
    return ScriptedBatchModel([(PROMPT, ANSWER, right), (b"other: ", b"no copy in this one", right)])


@pytest.mark.parametrize("draft", ["chain-8", "chain-4", "plain", "chain"])
def test_lookup_raises_the_bytes_a_pass_where_the_answer_copies_the_prompt(draft):
    heads = generate_batch(_scripted(), [PROMPT], max_bytes=100, draft=draft, costs=FLAT)[0]
    both = generate_batch(_scripted(), [PROMPT], max_bytes=100, draft=draft + "+lookup", costs=FLAT)[0]
    assert heads.output == both.output == ANSWER == decode.generate(_scripted(), PROMPT, max_bytes=100).output
    assert both.stats.bytes_per_forward >= 1.5 * heads.stats.bytes_per_forward
    assert both.stats.lookup_passes > 0 and both.stats.lookup_accepted >= len(TEXT) - 8
    assert any(shape.startswith("chain of 1") and shape != "chain of 1" for shape in both.stats.shapes)  # >= 10


def test_rows_with_and_without_matches_decode_together():
    model = _scripted()
    prompts = [PROMPT, b"other: ", PROMPT]
    got = generate_batch(model, prompts, max_bytes=60, draft="chain-4+lookup", costs=FLAT)
    assert [g.output for g in got] == [decode.generate(_scripted(), p, max_bytes=60).output for p in prompts]
    assert got[0].stats.lookup_accepted > 0 and got[1].stats.bytes_per_forward < got[0].stats.bytes_per_forward


@pytest.mark.parametrize("max_bytes,stop", [(9, ()), (17, ()), (100, (b"return",)), (100, (b"42\n",))])
def test_limits_and_stops_inside_lookup_drafts(max_bytes, stop):
    plain = decode.generate(_scripted(), PROMPT, max_bytes=max_bytes, stop=stop)
    got = generate_batch(_scripted(), [PROMPT], max_bytes=max_bytes, stop=stop, draft="plain+lookup",
                                costs=FLAT)[0]
    assert got.output == plain.output and got.stats.stopped_by == plain.stats.stopped_by
    assert got.stats.lookup_accepted <= len(got.output)


def test_lookup_passes_do_not_teach_the_heads_profile():
    decoder = decode.Decoder(_scripted(right=lambda j: False), costs=FLAT)
    decoder.profiles[True] = AcceptanceProfile(8, forget=1.0)
    got = decoder.generate([PROMPT], max_bytes=100, draft="chain-8+lookup")[0]
    heads_passes = got.stats.forward_passes - 1 - got.stats.lookup_passes  # the prefill drafts nothing
    assert got.stats.lookup_passes > 0 and decoder.profiles[True].trials[0] == heads_passes
    learned = sum(p.trials[0] for p in decoder.lookups.by_length.values())  # counts fade by 0.995 a record
    assert learned == pytest.approx(got.stats.lookup_passes, rel=0.02)


def test_lookup_stats_are_summed():
    got = generate_batch(_scripted(), [PROMPT, PROMPT], max_bytes=100, draft="plain+lookup", costs=FLAT)
    total = SpeculativeStats.total(g.stats for g in got)
    assert total.lookup_accepted == 2 * got[0].stats.lookup_accepted > 0
    assert total.lookup_passes == 2 * got[0].stats.lookup_passes


# the quick suite keeps the default draft and plain decoding with lookup
@pytest.mark.parametrize("draft", ["auto+lookup", pytest.param("tree-4+lookup", marks=pytest.mark.slow), "plain+lookup",
                                   pytest.param("chain-all+lookup", marks=pytest.mark.slow)])
def test_tiny_models_greedy_with_lookup_equals_plain_greedy(draft):
    """An untrained model repeats itself, so its own output holds matches; the prompts repeat too."""
    model = tiny_model(n_future=4)
    prompts = [SONGS[0] * 2, b"abcabcabcab", b"", bytes(range(40)) * 2]
    got = decode.Decoder(model, costs=FLAT, compile="off").generate(prompts, max_bytes=70, draft=draft)
    assert [g.output for g in got] == [decode.generate(model, p, max_bytes=70).output for p in prompts]
    assert sum(g.stats.lookup_passes for g in got) > 0


# the quick suite keeps the prompt that starts beyond the context
@pytest.mark.parametrize("prompt_len", [pytest.param(40, marks=pytest.mark.slow),
                                        pytest.param(63, marks=pytest.mark.slow), 150])
def test_lookup_drafts_stop_at_the_window_end_and_slide(prompt_len):
    """seq_len is 64: lookup drafts, which may reach 15 bytes past the heads, are cut where the
    window ends (each row's own: rows of a batch stand at different places in their windows), and
    slides keep speculative output equal to plain."""
    model = tiny_model(n_future=4)
    prompt = (b"".join(SONGS) * 4)[:prompt_len]
    prompts = [prompt, prompt[:prompt_len // 2 + 3], SONGS[1] * 2]
    got = decode.Decoder(model, costs=FLAT, compile="off").generate(prompts, max_bytes=120, draft="plain+lookup")
    assert [g.output for g in got] == [decode.generate(model, p, max_bytes=120).output for p in prompts]
    assert got[0].stats.slides >= 1 and got[0].stats.lookup_passes > 0


@pytest.mark.slow
@FITTED
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 1), head_type=st.sampled_from(["transformer", "causal", "linear"]),
       prompt=st.one_of(st.sampled_from(SONGS), st.sampled_from(SONGS).map(lambda s: s * 2),
                        st.binary(max_size=30).map(lambda b: b * 2)),
       draft=st.sampled_from(["auto+lookup", "chain-8+lookup", "tree-8+lookup", "plain+lookup"]),
       max_bytes=st.integers(1, 40))
def test_fitted_models_greedy_with_lookup_equals_plain_greedy(seed, head_type, prompt, draft, max_bytes):
    model = fitted_model(seed, head_type)
    max_bytes = min(max_bytes, model.config.seq_len - len(prompt) - 1)
    plain = decode.generate(model, prompt, max_bytes=max_bytes)
    got = decode.Decoder(model, costs=FLAT, compile="off").generate([prompt], max_bytes=max_bytes, draft=draft)[0]
    assert got.output == plain.output and got.stats.stopped_by == plain.stats.stopped_by


def test_sampled_rows_keep_their_heads_drafts():
    """Sampled rows never draft lookup bytes (their q would be wrong), so a seed gives the same draws."""
    outs = {}
    for draft in ("chain-3", "chain-3+lookup"):
        sampling = Sampling(temperature=1.0, generator=torch.Generator().manual_seed(3))
        got = generate_batch(MarkovModel(seq_len=64), [b"abcabcab"] * 20, max_bytes=40, draft=draft,
                                    sampling=sampling, costs=FLAT)
        outs[draft] = [g.output for g in got]
        assert sum(g.stats.lookup_passes for g in got) == 0
    assert outs["chain-3"] == outs["chain-3+lookup"]
