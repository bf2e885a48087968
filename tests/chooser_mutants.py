"""The arbiter's mutants in test_chooser.py's world (BENCHMARKS.md, "The chooser under attack"): each
patched in turn, auto over the best of plain and the fixed drafts in every case. Not a test: run it
from the repository's root, `python tests/chooser_mutants.py` (about 3 minutes on two cores)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import test_chooser as world  # noqa: E402 (the world's module, beside this file)

from bytemtp.decoding import decode, drafting, loop  # noqa: E402

CASES = [(s, B, False) for s in world.SCENARIOS if s != "half the rows" for B in (1, 8)] + [
    ("half the rows", 2, False), ("never", 8, True), ("always", 8, True)]
FIXED: dict = {}  # the fixed drafts' rates, by case: the same for every mutant


class Patches:
    """monkeypatch's setattr, undone by `undo`."""

    def __init__(self):
        self.done = []

    def setattr(self, obj, name, value):
        self.done.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def undo(self):
        for obj, name, value in reversed(self.done):
            setattr(obj, name, value)
        self.done = []


def judge(name: str) -> None:
    """Print auto over the best fixed draft in every case."""
    out = []
    for scenario, B, mixed in CASES:
        patches = Patches()
        if (scenario, B, mixed) not in FIXED:
            FIXED[scenario, B, mixed] = {m: world._rate(patches, scenario, B, m, mixed=mixed) for m in world.FIXED}
            patches.undo()
        auto = world._rate(patches, scenario, B, "auto", mixed=mixed)
        patches.undo()
        out.append(f"{scenario}-{B}{'-mixed' if mixed else ''}: {auto / max(FIXED[scenario, B, mixed].values()):.3f}")
    print(f"{name}: {'  '.join(out)}", flush=True)


def plan_without_arbiter(self, draft, *, batch_size, static, greedy):
    """`Decoder.plan` choosing by the calibrated costs' margin alone."""
    if not draft.adapts(greedy):
        return drafting.Choice(draft.heads, drafting.DraftTree.chain(draft.heads - 1), 0.0, 0.0)
    costs = self.pass_costs(batch_size, static=static)
    return drafting.choose(self.profiles[greedy], costs, max_heads=self.model.config.n_future,
                           tree=draft.trees(greedy), heads=draft.heads, arbiter=None, lookup=draft.lookup)


def running_mean_plain(arbiter):
    """The old plain figure: the first window, then a running mean (0.7 old, 0.3 new)."""
    seen = getattr(arbiter, "seen", [])
    if not seen:
        return None
    plain = seen[0]
    for rate in seen[1:]:
        plain = 0.7 * plain + 0.3 * rate
    return plain


def main() -> None:
    Arbiter = drafting.Arbiter
    arm, holds_back, record, plan = Arbiter.arm, Arbiter.holds_back, Arbiter.record, decode.Decoder.plan
    plain_property = Arbiter.plain
    judge("the arbiter")
    Arbiter.arm, Arbiter.holds_back = (lambda self, try_s=0.0, *, promising=False: (False, drafting.PLAN_PASSES),
                                       lambda self: True)
    judge("always plain")
    Arbiter.arm, Arbiter.holds_back = (lambda self, try_s=0.0, *, promising=False: (True, drafting.PLAN_PASSES),
                                       lambda self: False)
    judge("always speculate")
    Arbiter.arm, Arbiter.holds_back = arm, holds_back
    decode.Decoder.plan = plan_without_arbiter
    judge("no arbiter (margin only)")
    decode.Decoder.plan = plan

    def keep_every_plain(self, *, speculative, rate, seconds, rewarm_s=0.0, trial=True, short=False):
        if not speculative and not short:
            self.seen = getattr(self, "seen", []) + [rate]
        return record(self, speculative=speculative, rate=rate, seconds=seconds, rewarm_s=rewarm_s, trial=trial,
                      short=short)

    Arbiter.record, Arbiter.plain = keep_every_plain, property(running_mean_plain)
    judge("plain from one window, then a running mean")
    Arbiter.record, Arbiter.plain = record, plain_property

    emitted = loop.Window.emitted
    loop.Window.emitted = lambda self, state: (sum(len(row.out.data) for row in state.rows) - self.bytes0) / self.rows
    judge("a call's windows judged on the rows' average")
    loop.Window.emitted = emitted

    charge = Arbiter.charge
    Arbiter.charge = lambda self, seconds, *, sunk=False: charge(self, seconds)
    judge("the calibration held against tries")
    Arbiter.charge = charge


if __name__ == "__main__":
    main()
