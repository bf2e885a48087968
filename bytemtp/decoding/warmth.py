"""Which heads' KV caches are complete, row by row: `StaleHeads`, kept by `decode.Decoder.decode` and the server's engine, and the re-warm it asks for.

A pass of k heads writes keys and values for the trunk and heads 1..k only, so after a plain pass
(or a slide run with fewer heads) the caches of the heads beyond it miss the positions decoded
since. A re-plan that wants more heads than are complete must first run those positions again
(`rewarm`, which `emit_tracked` and the passes keep informed). The trade-off: a position per row and head is tracked, so that a re-warm runs
only the positions that are missing (after a short plain stretch, a few bytes: about one pass),
rather than each row's whole window (at batch 1 on a CPU, the cost of some twenty plain passes).
So that what is missing stays short, a call whose draft adapts runs every head wherever it runs a
whole window (the prompt, a slide): a small part of that window's cost.
"""

from __future__ import annotations

import torch

from bytemtp.decoding.batch import Batch
from bytemtp.decoding.drafting import TREE_RANKS
from bytemtp.model.layout import build_layout
from bytemtp.vocab import EOS


class StaleHeads:
    """For each row of a call (by its index among the call's prompts) and each head h, the first
    cache position whose keys and values head h lacks (None: it lacks none)."""

    def __init__(self, n_rows: int, n_future: int, *, warm: int):
        self.n_future = n_future
        self.first: list[list[int | None]] = [[None] * warm + [0] * (n_future - warm) for _ in range(n_rows)]

    def passed(self, row: int, *, heads: int, start: int) -> None:
        """A pass of `heads` heads wrote the row's positions from `start` on."""
        first = self.first[row]
        for h in range(heads, self.n_future):
            first[h] = start if first[h] is None else min(first[h], start)

    def slid(self, row: int, *, heads: int) -> None:
        """The row's window slid and was run again with `heads` heads: the others lack all of it."""
        self.first[row] = [None] * heads + [0] * (self.n_future - heads)

    def missing_from(self, row: int, heads: int) -> int | None:
        """The first position that one of heads 1..`heads` lacks (None: they are complete)."""
        missing = [p for p in self.first[row][:heads] if p is not None]
        return min(missing) if missing else None

    def warmed(self, row: int, heads: int) -> None:
        """Heads 1..`heads` were run again over every position the row holds."""
        self.first[row][:heads] = [None] * heads

    def add(self, n: int, *, warm: int) -> None:
        """n rows join (a server's batch), their caches complete for heads 1..`warm`."""
        self.first += [[None] * warm + [0] * (self.n_future - warm) for _ in range(n)]

    def keep(self, rows: list[int]) -> None:
        """Only these rows stay, in this order (finished rows left the batch)."""
        self.first = [self.first[r] for r in rows]


def emit_tracked(decoder, state: Batch, stale: StaleHeads, *, heads: int) -> bool:
    """`emit_next`, a slide running `heads` heads (at least the warm ones), noting in `stale`
    the rows whose windows slid."""
    starts, warm = {r: state.rows[r].start for r in state.active}, state.warm
    state.warm = max(warm, heads)  # what emit_next runs a slide with
    going = decoder.emit_next(state)
    for r, start in starts.items():
        if state.rows[r].start != start:
            stale.slid(r, heads=state.warm)
    state.warm = warm
    return going

def rewarm(decoder, state: Batch, stale: StaleHeads, heads: int) -> None:
    """Run again, in one pass over the batch, the positions that heads 1..`heads` lack in the
    live rows' caches (`warmth`), and take the heads' candidates after each row's next byte
    (already out, so it stays) anew, so that passes of `heads` heads can run."""
    model, cache = decoder.model, state.cache
    lengths = list(cache.lengths)
    live = [(b, r) for b, r in enumerate(state.active) if r not in state.finished]
    missing = [lengths[b] - p for b, r in live if (p := stale.missing_from(r, heads)) is not None]
    n = max(lengths) if model.config.doc_mask else max([1, *missing])  # document masks: run all
    starts = [max(0, length - n) for length in lengths]
    ids = torch.full((len(lengths), n), EOS, dtype=torch.long, device=model.embed.weight.device)
    for b, r in live:
        window = state.rows[r].tokens()[state.rows[r].start:-1]  # the cache's tokens (the next byte is out)
        assert len(window) == lengths[b], (len(window), lengths[b])
        ids[b, :lengths[b] - starts[b]] = torch.tensor(window[starts[b]:], dtype=torch.long)
    cache.lengths = starts
    logits = model.logits(ids, cache, heads=heads, stacked=decoder.stacked, layout=build_layout(model, ids, cache),
                          last=[max(0, length - start - 1) for length, start in zip(lengths, starts)])
    cache.lengths = lengths
    for r in set(state.active) & state.finished:  # fed, never accepted: any drafts do, none drawn
        state.rows[r].cand += [[EOS] * TREE_RANKS] * (heads - 1 - len(state.rows[r].cand))
    for b, r in live:
        decoder.propose(state.rows[r], logits[b, 0], state.rows[r].nxt)
        state.rows[r].stats.forward_passes += 1
        stale.warmed(r, heads)
    state.warm = heads
