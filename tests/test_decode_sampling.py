"""Speculative sampling has exactly the target distribution: chi-square tests of whole decodings of
`MarkovModel` against the exact distribution of head 1, shown to catch wrong acceptance rules."""

import pytest
import torch
from doubles import MARKOV_SYMBOLS, MARKOV_TARGET, MarkovModel, chi2_critical, generate_batch, seeded_sampling

from bytemtp.decoding import decode
from bytemtp.decoding import picks as picks_lib
from bytemtp.decoding.drafting import TREE_RANKS, PassCosts
from bytemtp.decoding.sampling import Sampling, distribution, gumbel
from bytemtp.decoding.strategy import Draft
from bytemtp.vocab import EOS

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
    sampling = Sampling(temperature=1.0, generator=gen)
    model, outputs, stats = MarkovModel(), [], []
    for _ in range(n // 2000):  # batches of 2000 rows (one call per batch)
        batch = generate_batch(model, [b""] * 2000, max_bytes=3,
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


def _accept_all_drafts(picks, drafts):
    """A wrong rule: every draft accepted, the bonus byte head 1's pick after them (emits the
    draft distribution)."""
    return len(drafts), picks[len(drafts)]


def _one_noise_for_the_whole_pass(logits_BTKV, sampling, *, keys, ats, vocab_size):
    """A subtly wrong rule: every node of a pass picks with the noise of its first (each pick
    alone draws from p, but the bytes of a pass are not independent)."""
    B, T, K, V = logits_BTKV.shape
    noise = torch.stack([gumbel(key, [at + k for k in range(K)], V) for key, at in zip(keys, ats)])[:, None]
    picks = (distribution(logits_BTKV, sampling, vocab_size=vocab_size).double().log() + noise).argmax(-1)
    return torch.cat([picks[..., :1], picks[..., 1:, None].expand(B, T, K - 1, TREE_RANKS).flatten(2)], dim=-1)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("seam,name,wrong_rule,n", [(decode, "accept_drafts", _accept_all_drafts, 2000),
                                                    (picks_lib, "sampled_picks", _one_noise_for_the_whole_pass, 4000)])
def test_chi_square_catches_a_wrong_acceptance_rule(monkeypatch, seam, name, wrong_rule, n):
    monkeypatch.setattr(seam, name, wrong_rule)
    outputs, _ = _sample_outputs(n, 2, seed=11)
    assert _chi_square(outputs) > _CHI2_26_P001


# --- longer outputs: draft positions >= 3, the bonus byte at k >= 3, temperature, top-k, top-p ----

_FLAT_COSTS = PassCosts({(1, 1): 1.0, (1, 16): 1.0, (5, 1): 1.0, (5, 16): 1.0})  # drafting is free


def _exact_output_probs(model: "MarkovModel", sampling: Sampling, n_bytes: int) -> dict[bytes, float]:
    """Exact probability of every n-byte output under head 1 with the sampling transform."""
    probs = {b"": 1.0}
    for pos in range(n_bytes):
        nxt = {}
        for prefix, pr in probs.items():
            prev = prefix[-1] if prefix else EOS
            dist = distribution(model.table[pos % 2, prev, 0], sampling)
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


# --- rows of one batch that choose bytes differently -----------------------------------------------

@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_sampled_rows_beside_greedy_rows_keep_the_target_distribution():
    """A batch mixing greedy and sampled rows (as a server's batch does): each sampled row has
    head 1's distribution, each greedy row writes what plain greedy decoding writes."""
    from bytemtp.decoding.batch import Row
    from bytemtp.decoding.generation import Output, SpeculativeStats
    from bytemtp.decoding.loop import Loop

    model = MarkovModel()
    sampled = Sampling(temperature=1.0, generator=torch.Generator().manual_seed(5))
    rows = [Row(b"", Output(SpeculativeStats(), max_bytes=3, stop=(), on_bytes=None),
                sampled if r % 2 else Sampling()) for r in range(8000)]
    decoder = decode.Decoder(model, costs=_FLAT_COSTS)
    loop = Loop(decoder, Draft(3).for_model(model.config.n_future), rows, static=False, greedy=False)
    while loop.emit():  # what `Decoder.generate` runs, on rows of their own samplings
        loop.advance()
    greedy = decode.generate(model, b"", max_bytes=3).output
    assert {bytes(row.out.data) for row in rows[0::2]} == {greedy}
    assert _chi_square([bytes(row.out.data) for row in rows[1::2]]) < _CHI2_26_P001
    assert sum(sum(row.stats.accepted) for row in rows[1::2]) > 0  # the sampled rows' drafts were verified
