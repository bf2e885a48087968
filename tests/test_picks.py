"""A pass's picks (bytemtp.decoding.picks): the table of a batch whose rows choose bytes by rules of
their own (`pass_picks`: greedy rows together, rows that sample alike together) equals, value for
value, each row's picks alone, and a sampled row's head-1 pick at each node is the byte that
`sampling.pick` draws alone at that output position."""

import pytest
import torch

from bytemtp.decoding.batch import Row
from bytemtp.decoding.drafting import TREE_RANKS
from bytemtp.decoding.generation import Output, SpeculativeStats
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
