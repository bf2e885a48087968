"""The automatic draft against the best fixed one, on scripted heads and scripted pass costs: auto
is within 5% of the best fixed mode whether drafts never pay, pay only at batch 1, or pay only
after a while, at batch 1 and 8, with the eager step's smooth costs and the compiled step's
stepwise ones (a pass padded up to its bucket). Time is a fake clock that each pass advances by
its scripted cost, re-warms included, so every figure replays exactly."""

import random

import pytest
from doubles import Doc, PathModel

from bytemtp.decoding import decode, loop
from bytemtp.decoding.drafting import PassCosts


class _Clock:
    now = 0.0

    def perf_counter(self) -> float:
        return self.now


# seconds of a pass of k heads over T nodes, by batch size: at batch 1 heads and nodes are nearly free
# (a pass is its overheads); at batch 8 they cost their arithmetic, so that drafts pay only at batch 1
COSTS = {1: {(1, 1): 1.0, (1, 16): 1.3, (8, 1): 1.4, (8, 16): 1.9},
         8: {(1, 1): 1.0, (1, 16): 8.0, (8, 1): 8.0, (8, 16): 16.0}}
SCENARIOS = {  # where head depth j's draft of stream index i is right (rank 0), else None
    "never": lambda j, i: None,
    "always": lambda j, i: 0 if j <= 4 else None,
    "after a while": lambda j, i: (0 if j <= 5 else None) if i > 160 else None,
}
FIXED = ("plain", "chain-2", "chain-4")  # tree-4 was never the best of these (BENCHMARKS.md)


class _Timed(PathModel):
    def __init__(self, docs, clock, costs):
        super().__init__(docs, n_future=8, seq_len=128)
        self.clock, self.costs = clock, costs

    def logits(self, ids, cache, heads=None, *, layout, last=None):
        self.clock.now += self.costs.predicted(heads or self.config.n_future, ids.shape[1])
        return super().logits(ids, cache, heads, layout=layout, last=last)


def _text(seed: int, n: int) -> bytes:
    rng = random.Random(seed)
    return bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz ABCDEF") for _ in range(n))


def _rate(monkeypatch, scenario: str, B: int, stepwise: bool, draft: str, *, max_bytes: int = 300) -> float:
    """Bytes a second (of the fake clock) over two calls of B rows decoding `max_bytes` each."""
    clock = _Clock()
    monkeypatch.setattr(decode, "time", clock)
    monkeypatch.setattr(loop, "time", clock)
    table = COSTS[B]
    costs = PassCosts(dict(table), stepwise=stepwise)
    docs = [Doc(b"%d:" % r, _text(r, max_bytes + 20), SCENARIOS[scenario]) for r in range(B)]
    model = _Timed(docs, clock, PassCosts(dict(table), stepwise=stepwise))
    dec = decode.Decoder(model, compile="off")
    dec.calibration.known[B, False] = costs  # calibrated by the passes, as measured costs are
    out = 0
    for _ in range(2):
        out += sum(len(g.output) for g in dec.generate([d.prompt for d in docs], max_bytes=max_bytes, draft=draft))
    return out / clock.now


@pytest.mark.slow
@pytest.mark.parametrize("stepwise", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("B", [1, 8])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_auto_is_within_5_percent_of_the_best_fixed_mode(monkeypatch, scenario, B, stepwise):
    fixed = {mode: _rate(monkeypatch, scenario, B, stepwise, mode) for mode in FIXED}
    best = max(fixed, key=fixed.get)
    auto = _rate(monkeypatch, scenario, B, stepwise, "auto")
    assert auto >= 0.95 * fixed[best], (auto, fixed)
    assert auto >= 0.95 * fixed["plain"]
    if scenario == "always" and B == 1:
        assert best != "plain" and auto > 1.5 * fixed["plain"]  # the drafts are found and used
    if scenario == "never" or B == 8 and scenario != "always":
        assert best == "plain"  # the scenarios are what they say
