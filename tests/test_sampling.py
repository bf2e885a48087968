"""Choosing bytes (bytemtp.decoding.sampling): greedy and sampled picks never emit special ids, a seed
repeats a sampling, top-k and top-p truncate; and speculative sampling keeps the model's
distribution: one verify step enumerated exactly, and whole decodings (rows of different lengths,
EOS, a max_bytes cut inside a draft, a window slide) against the exact distribution of plain
sampling.

The exact test calls `sampling.verify_sampled` with controlled randomness. It draws one uniform
a draft (`torch.rand(n)` from the generator, before anything else) and accepts draft j while
u_j < min(1, p/q); with p and q chosen so that every ratio is a multiple of 1/G, the outcome
depends only on which of G cells each u_j falls in, so one seed a cell (found by drawing the
same uniforms here) enumerates them all, each with probability G^-n. The byte it then samples
is replaced by the distribution it samples from. Every byte after the step comes from the target
itself, so the step is right when the completed sequences have exactly the product of the target
rows p[0], p[1], ...: whatever the drafts were and however many were accepted.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import pytest
import torch
from doubles import EOS_MARKOV_IDS, EosMarkovModel, chi2_critical, rare_eos_model, seeded_sampling

from bytemtp.decoding import decode, sampling
from bytemtp.decoding.sampling import Sampling, distribution, greedy_ids, next_byte
from bytemtp.decoding.strategy import Draft
from bytemtp.model.kvcache import window_start
from bytemtp.vocab import EOS, PAD

# --- one verify step, enumerated exactly --------------------------------------------------------

def _cells(n: int, G: int) -> dict[tuple[int, ...], int]:
    """A seed for each of the G^n cells that n uniforms from a fresh generator may fall in."""
    cells: dict[tuple[int, ...], int] = {}
    seed = 0
    while len(cells) < G ** n:
        u = torch.rand(n, generator=torch.Generator().manual_seed(seed))
        cells.setdefault(tuple((u * G).floor().long().tolist()), seed)
        seed += 1
    return cells


def _step_distribution(p_TV: torch.Tensor, q_DV: torch.Tensor, monkeypatch, G: int) -> dict[tuple[int, ...], float]:
    """Exact probability of every completed sequence (n + 1 ids) after one `verify_sampled`
    step: the drafts drawn from q, the uniforms by cell, the byte it samples by the distribution
    it samples from, and the ids after the step from p."""
    n, V = q_DV.shape
    ratios = (p_TV[:n] / q_DV).clamp(max=1.0)[q_DV > 0].double()
    assert torch.equal(ratios * G, (ratios * G).round()), "every ratio must be a multiple of 1/G"
    drawn: list[torch.Tensor] = []

    def sample(probs_NV, generator):  # the distribution sampled from, in place of a sample
        drawn.append(probs_NV[0].double())
        return [-1]

    monkeypatch.setattr(sampling, "_sample", sample)
    q_hat = (q_DV / q_DV.sum(-1, keepdim=True)).double()
    p = p_TV.double()
    cells = _cells(n, G)
    completed: dict[tuple[int, ...], float] = defaultdict(float)
    for drafts in itertools.product(range(V), repeat=n):
        w_drafts = math.prod(float(q_hat[j, d]) for j, d in enumerate(drafts))
        if w_drafts == 0:
            continue
        for seed in cells.values():
            drawn.clear()
            n_ok, nxt = sampling.verify_sampled(p_TV, q_DV, list(drafts), torch.Generator().manual_seed(seed))
            assert nxt == -1 and len(drawn) == 1 and 0 <= n_ok <= n
            probs = drawn[0]
            assert torch.isfinite(probs).all() and float(probs.sum()) == pytest.approx(1.0, abs=1e-6)
            w = w_drafts / G ** n
            for x in range(V):
                if float(probs[x]) == 0.0:
                    continue
                head = (*drafts[:n_ok], x)
                for tail in itertools.product(range(V), repeat=n - n_ok):
                    w_tail = math.prod(float(p[n_ok + 1 + i, y]) for i, y in enumerate(tail))
                    completed[head + tail] += w * float(probs[x]) * w_tail
    return completed


def _target(p_TV: torch.Tensor) -> dict[tuple[int, ...], float]:
    """The product of the target rows (each normalized)."""
    p = (p_TV / p_TV.sum(-1, keepdim=True)).double()
    T, V = p.shape
    return {seq: math.prod(float(p[t, y]) for t, y in enumerate(seq)) for seq in itertools.product(range(V), repeat=T)}


def _t(*rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


# four ids; every probability a multiple of 1/8, every ratio min(1, p/q) a multiple of 1/G
STEPS = {
    "no-drafts": (_t((.5, .25, .125, .125)), _t(), 1),
    "p-equals-q": (_t((.5, .25, .125, .125), (.125, .125, .25, .5), (.25, .25, .25, .25)),
                   _t((.5, .25, .125, .125), (.125, .125, .25, .5)), 1),
    "p-zero-where-q-is-not": (_t((.5, .5, 0, 0), (0, .25, .25, .5), (.25, .5, .25, 0)),
                              _t((.25, .25, .25, .25), (.5, .25, .125, .125)), 2),
    "ratios-of-quarters": (_t((.375, .125, .25, .25), (.125, .25, .5, .125), (0, .5, .25, .25)),
                           _t((.5, .25, .125, .125), (.5, .25, .125, .125)), 4),
    "three-drafts": (_t((.25, .25, .5, 0), (.5, .25, .125, .125), (.125, .125, .25, .5), (.125, .375, .25, .25)),
                     _t((.5, .25, .125, .125), (.25, .5, .125, .125), (.25, .25, .25, .25)), 2),
    # p's mass short of 1 (rounding, exaggerated so that a rejection can be drawn): p <= q everywhere,
    # so the residual is nowhere positive and the byte after a rejection comes from p itself
    "residual-nowhere-positive": (_t((.25, .25, .125, .125), (.125, .125, .25, .5), (.25, .25, .25, .25)),
                                  _t((.5, .25, .125, .125), (.25, .25, .25, .25)), 2),
}


@pytest.mark.parametrize("name", STEPS)
def test_one_verify_step_keeps_the_target_distribution_exactly(name, monkeypatch):
    p_TV, q_DV, G = STEPS[name]
    q_DV = q_DV.reshape(len(p_TV) - 1, p_TV.shape[1])
    got, want = _step_distribution(p_TV, q_DV, monkeypatch, G), _target(p_TV)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-6)
    assert set(got) <= set(want)
    for seq, prob in want.items():
        assert got.get(seq, 0.0) == pytest.approx(prob, abs=1e-7), (seq, got.get(seq, 0.0), prob)


def test_a_rejection_where_no_residual_is_left_draws_from_p(monkeypatch):
    """The residual-nowhere-positive case reaches that branch: its first draft is rejected now
    and then, and the byte after it is drawn from p."""
    p_TV, q_DV, _ = STEPS["residual-nowhere-positive"]
    assert float((p_TV[0] - q_DV[0]).clamp(min=0).sum()) == 0.0
    drawn = []
    monkeypatch.setattr(sampling, "_sample", lambda probs, generator: drawn.append(probs[0]) or [-1])
    rejected = 0
    for seed in range(20):
        drawn.clear()
        if sampling.verify_sampled(p_TV, q_DV, [0, 0], torch.Generator().manual_seed(seed))[0] == 0:
            rejected += 1
            assert torch.equal(drawn[0], p_TV[0] / p_TV[0].sum())  # from p, not from the empty residual
    assert 0 < rejected < 20


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
