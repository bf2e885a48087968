"""Choosing bytes (bytemtp.decoding.sampling): greedy and sampled picks never emit special ids, a seed
repeats a sampling, top-k and top-p truncate; and speculative sampling keeps the model's
distribution: the pick by position draws from p, one verify step emits exactly what plain sampling
emits at those positions whatever the drafts, and whole decodings (rows of different lengths, EOS,
a max_bytes cut inside a draft, a window slide) have the exact distribution of plain sampling and
its very bytes under every draft.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import pytest
import torch
from doubles import EOS_MARKOV_IDS, EosMarkovModel, chi2_critical, rare_eos_model, seeded_sampling

from bytemtp.decoding import decode
from bytemtp.decoding.drafting import PassCosts
from bytemtp.decoding.sampling import Sampling, distribution, greedy_ids, gumbel, next_byte, pick, verify_sampled
from bytemtp.decoding.strategy import Draft
from bytemtp.model.kvcache import window_start
from bytemtp.vocab import EOS, PAD

# --- the pick by position, and one verify step ---------------------------------------------------

def test_the_noise_is_a_function_of_key_position_and_id_alone():
    a = gumbel(7, [3, 9], 264)
    b = gumbel(7, [9, 0, 3], 264)
    assert a.dtype == torch.float64 and a.shape == (2, 264) and torch.isfinite(a).all()
    assert torch.equal(a[0], b[2]) and torch.equal(a[1], b[0])  # whatever else is drawn with it
    assert not torch.equal(a[0], a[1]) and not torch.equal(gumbel(8, [3], 264)[0], a[0])
    assert not torch.equal(gumbel(7 + (1 << 62), [3], 264)[0], a[0])  # every bit of a key counts
    u = torch.exp(-torch.exp(-gumbel(1, list(range(200)), 264)))  # back to the uniforms
    assert 0.0 < float(u.min()) and float(u.max()) < 1.0 and abs(float(u.mean()) - 0.5) < 0.01


def _splitmix_noise(key: int, position: int, byte: int) -> float:
    """The noise at (key, position, id) by splitmix64 in Python's integers: the reference."""
    mask = (1 << 64) - 1

    def mix(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    stream = mix((key + (position + 1) * 0x9E3779B97F4A7C15) & mask)
    z = mix((stream + (byte + 1) * 0x9E3779B97F4A7C15) & mask)
    return -math.log(-math.log(((z >> 11) + 0.5) * 2.0 ** -53))


def test_the_noise_is_splitmix64_of_key_position_and_id():
    """Computed in place over whole passes (`sampling._mix`): the reference's values."""
    keys, positions = [0, 7, (1 << 63) - 1, 123456789 << 20], [0, 1, 255, 4095, 1 << 40]
    for key in keys:
        noise = gumbel(key, positions, 264)
        for i, position in enumerate(positions):
            for byte in (0, 1, 97, 255, 263):
                want = _splitmix_noise(key, position, byte)  # (the C library's log may round the last bit apart)
                assert float(noise[i, byte]) == pytest.approx(want, rel=1e-13), (key, position, byte)


@pytest.mark.parametrize("over", ["positions", "keys"])
def test_the_pick_draws_from_p(over):
    p = torch.tensor([0.5, 0.25, 0.0, 0.125, 0.0625, 0.0625])
    n = 20000
    if over == "positions":  # one row's bytes, position after position
        picks = pick(p.expand(n, -1), 3, list(range(n)))
    else:  # one position of many rows
        picks = [pick(p[None], key, [5])[0] for key in range(n)]
    counts = torch.bincount(torch.tensor(picks), minlength=len(p)).double()
    assert counts[2] == 0
    keep = p > 0
    chi2 = float(((counts[keep] - n * p[keep]) ** 2 / (n * p[keep])).sum())
    assert chi2 < chi2_critical(int(keep.sum()) - 1), chi2


def _t(*rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


STEPS = {
    "no-drafts": _t((.5, .25, .125, .125)),
    "three-drafts": _t((.25, .25, .5, 0), (.5, .25, .125, .125), (.125, .125, .25, .5), (.125, .375, .25, .25)),
    "p-zero-somewhere": _t((.5, .5, 0, 0), (0, .25, .25, .5), (.25, .5, .25, 0)),
}


@pytest.mark.parametrize("name", STEPS)
def test_one_verify_step_emits_what_plain_sampling_emits_whatever_the_drafts(name):
    """Draft by draft, the step accepts a draft exactly when it is the byte that plain sampling
    with the key writes at its position, and the byte after is plain sampling's next one: so the
    step's bytes are plain sampling's, for every draft and every key."""
    p_TV = STEPS[name]
    n, V = len(p_TV) - 1, p_TV.shape[1]
    for key, at in [(k, 17 * k % 50) for k in range(40)]:
        plain = [pick(p_TV[j][None], key, [at + j])[0] for j in range(n + 1)]  # one byte at a time
        assert all(float(p_TV[j, x]) > 0 for j, x in enumerate(plain))
        for drafts in itertools.product(range(V), repeat=n):
            n_ok, nxt = verify_sampled(p_TV, list(drafts), key=key, at=at)
            assert list(drafts[:n_ok]) + [nxt] == plain[:n_ok + 1]
            assert n_ok == n or drafts[n_ok] != plain[n_ok]


_FLAT = PassCosts({(1, 1): 1.0, (1, 16): 1.0, (8, 1): 1.0, (8, 16): 1.0})


@pytest.mark.usefixtures("one_thread")
def test_a_seed_repeats_the_bytes_of_plain_sampling_under_every_draft():
    """The bytes a seed draws do not depend on the drafts: plain `generate`, plain and speculative
    passes of fixed depths and the automatic draft (which re-plans from measured rates) all write
    the same bytes, row by row, and another seed writes others."""
    model = EosMarkovModel(n_future=4)
    prompts = [b"a", b"cab", b"bcabca", b""]

    def batch(draft, seed=5, **kw):
        got = decode.Decoder(model, costs=_FLAT, compile="off").generate(
            prompts, max_bytes=40, draft=draft, sampling=seeded_sampling(seed, **kw))
        return [g.output for g in got]

    for kw in ({}, {"temperature": 0.7, "top_k": 2}):
        want = batch("plain", **kw)
        for draft in ("chain-2", "chain-4", "auto", Draft(3)):
            assert batch(draft, **kw) == want, draft
        first = decode.generate(model, prompts[0], max_bytes=40, sampling=seeded_sampling(5, **kw)).output
        assert first == want[0]  # the first row draws the first key: plain decoding alone
        assert batch("auto", seed=6, **kw) != want


def _plain_probs(model: EosMarkovModel, prompt: bytes, sampling: Sampling,
                 max_bytes: int) -> dict[bytes, float]:
    """Exact probability of every output of plain sampling: each id drawn by head 1 at the slot
    that the window rule (`window_start`) gives the context's last id."""
    seq_len, probs = model.config.seq_len, defaultdict(float)

    def walk(tokens: list[int], start: int, pr: float) -> None:
        start = window_start(len(tokens), start, seq_len)
        dist = distribution(model.table[(len(tokens) - 1 - start) % 3, tokens[-1], 0], sampling)
        out = bytes(tokens[1 + len(prompt):])
        for x in EOS_MARKOV_IDS:
            px = pr * float(dist[x])
            if px == 0.0:
                continue
            if x == EOS:
                probs[out] += px
            elif len(out) + 1 == max_bytes:
                probs[out + bytes([x])] += px
            else:
                walk(tokens + [x], start, px)

    walk([EOS, *prompt], 0, 1.0)
    return dict(probs)


def _chi_square(outputs: list[bytes], expected: dict[bytes, float]) -> tuple[float, int]:
    """Pearson's statistic over the outputs with an expected count of at least 5 (the rest pooled
    into one bin), and its degrees of freedom."""
    n = len(outputs)
    assert set(outputs) <= set(expected), set(outputs) - set(expected)
    big = {x for x, p in expected.items() if n * p >= 5}
    counts = defaultdict(int)
    for out in outputs:
        counts[out if out in big else None] += 1
    chi2 = sum((counts[x] - n * expected[x]) ** 2 / (n * expected[x]) for x in big)
    rest = 1.0 - sum(expected[x] for x in big)
    bins = len(big)
    if n * rest >= 5:
        chi2 += (counts[None] - n * rest) ** 2 / (n * rest)
        bins += 1
    return chi2, bins - 1


# prompts of different lengths in one batch; the window of 8 slides in the last two (before
# their third and second byte), and their drafts are cut where the window ends
PROMPTS = [b"", b"a", b"cab", b"bcabca", b"abcabca"]


@pytest.mark.slow
@pytest.mark.parametrize("heads,max_bytes,kw", [
    (1, 3, {}),                                     # plain batch sampling: the exact reference itself
    (2, 3, {}),
    (4, 3, {}),                                     # three drafts, cut to two by max_bytes after the first byte
    (4, 4, {"temperature": 0.8, "top_k": 3}),
])
def test_speculative_sampling_has_plain_samplings_distribution_per_row(heads, max_bytes, kw):
    n_per_prompt, batch = 3000, 2500
    model = EosMarkovModel()
    sampling_ = seeded_sampling(100 + heads + max_bytes, **kw)
    expected = {p: _plain_probs(model, p, sampling_, max_bytes) for p in PROMPTS}
    assert all(sum(e.values()) == pytest.approx(1.0) for e in expected.values())
    prompts = PROMPTS * (batch // len(PROMPTS))
    outputs, stats = defaultdict(list), []
    decoder = decode.Decoder(model, compile="off")
    for _ in range(n_per_prompt * len(PROMPTS) // batch):
        got = decoder.generate(prompts, max_bytes=max_bytes, draft="plain" if heads == 1 else Draft(heads),
                               sampling=sampling_)
        for p, g in zip(prompts, got):
            outputs[p].append(g.output)
        stats += [g.stats for g in got]
    for p in PROMPTS:
        chi2, df = _chi_square(outputs[p], expected[p])
        assert chi2 < chi2_critical(df), (p, chi2, df)
    assert any(s.stopped_by == "eos" for s in stats) and any(s.slides for s in stats)
    if heads > 1:  # drafts were accepted and rejected at every depth that max_bytes leaves, none deeper
        drafted = [sum(s.drafted[j] for s in stats) for j in range(heads - 1)]
        accepted = [sum(s.accepted[j] for s in stats) for j in range(heads - 1)]
        usable = min(heads, max_bytes) - 1
        assert all(0 < a < d for a, d in zip(accepted[:usable], drafted[:usable]))
        assert drafted[usable:] == [0] * (heads - 1 - usable)


def test_never_emits_pad_or_special_ids():
    logits = torch.zeros(264)
    logits[PAD] = 100.0
    logits[256] = 99.0
    logits[260] = 98.0
    logits[65] = 1.0
    assert next_byte(logits, Sampling()) == 65
    rows = torch.stack([logits, logits.roll(1)])  # the second ranks 259 first, then EOS
    assert greedy_ids(rows).tolist() == [65, EOS]
    probs = distribution(logits, Sampling(temperature=1.0))
    assert probs[PAD] == 0 and probs[256] == 0 and probs[259:].sum() == 0


def test_a_temperature_below_the_greedy_threshold_decodes_greedily():
    """Sampling owns the rule the server's parser asks too: below GREEDY_BELOW (1e-5) a
    temperature is greedy, made 0 when the value is made, so that no reader divides by it."""
    for tiny in (1e-40, 1e-9, Sampling.GREEDY_BELOW / 2):
        s = Sampling(temperature=tiny, generator=torch.Generator().manual_seed(1))
        assert s.greedy and s.temperature == 0.0
    edge = Sampling(temperature=Sampling.GREEDY_BELOW)
    assert not edge.greedy and edge.temperature == Sampling.GREEDY_BELOW
    model = rare_eos_model()
    want = decode.generate(model, b"a", max_bytes=30, sampling=Sampling(temperature=0)).output
    tiny = Sampling(temperature=1e-9, generator=torch.Generator().manual_seed(1))
    assert decode.generate(model, b"a", max_bytes=30, sampling=tiny).output == want
    assert decode.Decoder(model).generate([b"a", b"b"], max_bytes=30, sampling=tiny, draft=Draft(heads=2))[0].output == want


def test_sampling_is_seeded_and_truncated():
    model = rare_eos_model()
    def run(seed):
        gen = torch.Generator().manual_seed(seed)
        return decode.generate(model, b"a", max_bytes=30,
                               sampling=Sampling(temperature=1.0, generator=gen)).output
    assert run(1) == run(1)
    assert run(1) != run(2)
    logits = torch.arange(264, dtype=torch.float32) / 10
    top2 = distribution(logits, Sampling(temperature=1.0, top_k=2))
    assert (top2 > 0).sum() == 2 and top2[EOS] > 0
    nucleus = distribution(logits, Sampling(temperature=1.0, top_p=0.3))
    kept = nucleus > 0
    full = distribution(logits, Sampling(temperature=1.0))
    assert full[kept].sum() >= 0.3 and full[kept].sum() - full[kept].min() < 0.3
    with pytest.raises(ValueError, match="top_p"):
        Sampling(top_p=0.0)
    for bad in (float("nan"), float("inf"), -1.0):  # nan passed `< 0`, and inf divided the logits to nan
        with pytest.raises(ValueError, match="temperature=.* expected a finite number >= 0"):
            Sampling(temperature=bad)
