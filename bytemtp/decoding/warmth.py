"""Which heads' KV caches are complete, row by row: `StaleHeads`, kept by `decode.Decoder.decode`.

A pass of k heads writes keys and values for the trunk and heads 1..k only, so after a plain pass
(or a slide run with fewer heads) the caches of the heads beyond it miss the positions decoded
since. A re-plan that wants more heads than are complete must first run those positions again
(`Decoder.rewarm`). The trade-off: a position per row and head is tracked, so that a re-warm runs
only the positions that are missing (after a short plain stretch, a few bytes: about one pass),
rather than each row's whole window (at batch 1 on a CPU, the cost of some twenty plain passes).
So that what is missing stays short, a call whose draft adapts runs every head wherever it runs a
whole window (the prompt, a slide): a small part of that window's cost.
"""

from __future__ import annotations


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
