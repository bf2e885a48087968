"""A pass's picks (bytemtp.decoding.picks): the table of a batch whose rows choose bytes by rules of
their own (`pass_picks`: greedy rows together, rows that sample alike together) equals, value for
value, each row's picks alone, and a sampled row's head-1 pick at each node is the byte that
`sampling.pick` draws alone at that output position."""

import pytest
import torch

from bytemtp.decoding.batch import Row
from bytemtp.decoding.drafting import TREE_RANKS
from bytemtp.decoding.generation import Output, SpeculativeStats
from bytemtp.decoding import picks as picks_lib
from bytemtp.decoding.picks import greedy_picks, pass_picks, sampled_picks
from bytemtp.decoding.sampling import Sampling, distribution, pick
from bytemtp.vocab import emitted

V = 264
ALLOWED = torch.tensor(emitted(V))


def _row(sampling: Sampling | None, seed: int) -> Row:
    if sampling is not None:
        sampling.generator = torch.Generator(device="cpu").manual_seed(seed)
    return Row(b"", Output(SpeculativeStats(), max_bytes=100, stop=(), on_bytes=None), sampling)


SAMPLINGS = [None, Sampling(temperature=0.8), Sampling(temperature=1.0, top_p=0.9), None,
             Sampling(temperature=0.6, top_k=5), Sampling(temperature=1.3, top_k=400, top_p=0.5)]


@pytest.mark.parametrize("heads", [1, 4])
def test_a_batch_s_picks_equal_each_row_s_by_its_own_rule(heads):
    gen = torch.Generator(device="cpu").manual_seed(0)
    logits = torch.randn(len(SAMPLINGS), 5, heads, V, generator=gen) * 3
    rows = [_row(s, seed) for seed, s in enumerate(SAMPLINGS)]
    ats = [0, 7, 19, 3, 250, 1]
    together = pass_picks(logits, rows, ats, ALLOWED)
    assert together.shape == (len(rows), 5, 1 + (heads - 1) * TREE_RANKS)
    for b, row in enumerate(rows):
        if row.sampling.greedy:
            assert torch.equal(together[b], greedy_picks(logits[b:b + 1], ALLOWED)[0])
            continue
        alone = sampled_picks(logits[b:b + 1], row.sampling, keys=[row.key], ats=[ats[b]])[0]
        assert torch.equal(together[b], alone)
        for t in range(5):  # head 1 at node t: the byte plain sampling writes at position ats[b] + t
            probs = distribution(logits[b, t, 0], row.sampling)[None]
            assert together[b, t, 0] == pick(probs, row.key, [ats[b] + t])[0]
            for k in range(1, heads):  # head k + 1's draft there: the byte at ats[b] + t + k
                probs = distribution(logits[b, t, k], row.sampling)[None]
                assert together[b, t, 1 + (k - 1) * TREE_RANKS] == pick(probs, row.key, [ats[b] + t + k])[0]


def _full_noise_picks(logits, sampling, keys, ats):
    """The reference: every id's noise at every position, the argmax over the whole vocabulary."""
    B, T, K, V = logits.shape
    probs = distribution(logits, sampling)
    positions = torch.tensor(ats)[:, None, None] + torch.arange(T)[:, None] + torch.arange(K)
    noise = picks_lib.gumbel_at(torch.tensor(keys)[:, None, None, None], positions, V)
    return (probs.double().log() + noise).argmax(-1).masked_fill(torch.isnan(probs).any(-1), -1)


@pytest.mark.parametrize("flat_noise", [False, True])
def test_noise_for_the_support_alone_picks_as_noise_for_every_id(flat_noise, monkeypatch):
    """On the host, sampled picks draw noise only for the ids of p > 0 (top-k, top-p, a peaked
    distribution); the picks equal those of every id's noise, ties included: with the noise made
    flat, equal probabilities tie and the lowest id wins, as the whole vocabulary's argmax has it."""
    if flat_noise:
        real = picks_lib.gumbel_at
        monkeypatch.setattr(picks_lib, "gumbel_at", lambda keys, positions, vocab=0, *, ids=None:
                            torch.zeros_like(real(keys, positions, vocab, ids=ids)))
    gen = torch.Generator(device="cpu").manual_seed(3)
    logits = (torch.randn(4, 3, 2, V, generator=gen) * 4).round()  # rounded: equal logits, equal probabilities
    logits[1, 2, 0] = float("nan")
    for sampling in (Sampling(temperature=0.7, top_k=3), Sampling(temperature=1.0, top_p=0.6),
                     Sampling(temperature=0.5, top_k=40, top_p=0.9)):
        keys, ats = [11, 12, 13, 14], [0, 5, 9, 2]
        got = sampled_picks(logits, sampling, keys=keys, ats=ats)
        want = _full_noise_picks(logits, sampling, keys, ats)
        assert torch.equal(got[..., 0], want[..., 0]) and torch.equal(got[..., 1::TREE_RANKS], want[..., 1:])
