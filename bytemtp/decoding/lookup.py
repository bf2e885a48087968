"""Prompt-lookup drafts: the bytes that followed the last earlier occurrence of a row's newest
bytes, drafted beside (or instead of) the heads' candidates, as Hugging Face's prompt-lookup
decoding and llama.cpp's n-gram drafts do.

`find` takes a row's bytes so far (prompt and output) and looks for the longest suffix of
`MIN_NGRAM`..`MAX_NGRAM` bytes that occurs earlier; the bytes after its latest occurrence are the
draft (cut at the end of what is there). A suffix that occurs earlier has all its shorter suffixes
occur there too, so the longest is found by bisection: about three `bytes.rfind` scans a row a
pass, tens of microseconds on a context of tens of KB. The trade-off: a plain scan each pass
rather than an index kept up to date as bytes come, which costs more on long contexts but has no
state to keep in step with sliding windows and rows that join and leave.

`LookupProfile` is how often lookup drafts are accepted, by depth and by the length of the match
(a long match predicts much better than a two-byte one): an `AcceptanceProfile` of one rank for
each match length, learning only from passes that drafted lookup bytes (the heads' profile learns
only from the heads' drafts). `plan_pass` chooses, for one pass, the tree every row shares and
each row's source (lookup or heads) by expected accepted bytes per second of pass: the heads'
tree as the decoder chose it, or that tree with its top-rank chain made longer, up to
`drafting.MAX_NODES`, for rows whose lookup draft is long (verification needs no head deeper than
the first, so a chain may be longer than the heads that run). A row that drafts lookup bytes has
them in place of its heads' top-rank chain (`substitute`); its heads' other ranks stay where the
tree has them. Greedy rows only: sampled rows keep their heads' drafts (their verification needs
the draft's distribution q, which lookup has not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from bytemtp.decoding.batch import Batch, Row
from bytemtp.decoding.drafting import MAX_NODES, AcceptanceProfile, DraftTree, PassCosts

MIN_NGRAM, MAX_NGRAM = 2, 8  # suffix lengths tried (bytes)
MAX_DRAFT = MAX_NODES - 1  # lookup bytes a pass may draft


@dataclass(frozen=True)
class Match:
    """A suffix of `length` bytes found earlier, and the bytes that followed it there."""

    length: int
    draft: bytes | tuple[int, ...]  # the ids that followed


def find(history: bytes | str, *, max_draft: int = MAX_DRAFT, min_ngram: int = MIN_NGRAM,
         max_ngram: int = MAX_NGRAM) -> Match | None:
    """The longest suffix of `history` (min_ngram..max_ngram bytes) that occurs earlier in it, at its
    latest earlier occurrence, with up to `max_draft` bytes that followed it; None without one.
    A str history holds a BPE baseline's ids, one character each (`Row.history`); its draft is ids."""
    n = len(history)
    lo, hi, best = min_ngram, min(max_ngram, n - 1), None
    while lo <= hi:  # occurring earlier is monotone in the length: bisect for the longest
        mid = (lo + hi) // 2
        pos = history.rfind(history[n - mid:], 0, n - 1)  # ends before the last byte: something follows
        if pos >= 0:
            best, lo = (mid, pos), mid + 1
        else:
            hi = mid - 1
    if best is None or max_draft < 1:
        return None
    length, pos = best
    draft = history[pos + length:pos + length + max_draft]
    return Match(length, tuple(map(ord, draft)) if isinstance(draft, str) else draft)


class LookupProfile:
    """How often lookup draft bytes are accepted: p(depth) for each match length (see the module
    docstring). The prior: half of the first bytes, then 0.8 of each next one once those before
    it were accepted (copying, once it starts, tends to go on)."""

    def __init__(self, *, depths: int = MAX_DRAFT, strength: float = 2.0):
        prior = [0.5] + [0.8] * (depths - 1)
        self.by_length = {m: AcceptanceProfile(depths + 1, ranks=1, prior=prior, strength=strength)
                          for m in range(MIN_NGRAM, MAX_NGRAM + 1)}

    def _profile(self, match: Match) -> AcceptanceProfile:
        return self.by_length[min(max(match.length, MIN_NGRAM), MAX_NGRAM)]

    def expected(self, match: Match, depth: int) -> list[float]:
        """Expected accepted bytes of drafting the first d bytes of the match, for d = 0..depth
        (at most the draft's length)."""
        profile, out, prob = self._profile(match), [0.0], 1.0
        for d in range(1, min(depth, len(match.draft)) + 1):
            prob *= profile.p(d, 0)
            out.append(out[-1] + prob)
        return out

    def record(self, match: Match, *, offered: int, accepted: int) -> None:
        """A pass verified the match's first `offered` bytes and accepted the first `accepted`."""
        profile = self._profile(match)
        for depth in range(1, min(offered, accepted + 1) + 1):
            profile.record(depth, 0 if depth <= accepted else None)


def chain_length(tree: DraftTree) -> int:
    """Depth of the tree's top-rank chain (its first nodes)."""
    n = 0
    while n + 1 < tree.T and tree.parents[n + 1] == n and tree.ranks[n + 1] == 0:
        n += 1
    return n


def rank_paths(tree: DraftTree) -> list[tuple[int, ...]]:
    """Each node's ranks from the root (the root's is empty)."""
    paths: list[tuple[int, ...]] = []
    for parent, rank in zip(tree.parents, tree.ranks):
        paths.append(() if parent < 0 else paths[parent] + (rank,))
    return paths


def extended(tree: DraftTree, depth: int) -> DraftTree:
    """The tree with its top-rank chain made `depth` deep; a plain chain where that would pass
    MAX_NODES."""
    paths = rank_paths(tree)[1:]
    more = [(0,) * d for d in range(chain_length(tree) + 1, depth + 1)]
    if len(paths) + len(more) + 1 > MAX_NODES:
        return DraftTree.chain(depth)
    return DraftTree.from_paths(paths + more)


def heads_expected(tree: DraftTree, profile: AcceptanceProfile | None, depth: int) -> list[float]:
    """Expected accepted bytes of the heads' candidates laid out as the tree, for rows that may use
    drafts to depth d = 0..depth (nodes deeper than `depth`, which the heads did not draft, count
    nothing)."""
    out = [0.0] * (depth + 1)
    if profile is None:
        return out
    prob = [1.0] * tree.T
    for i in range(1, tree.T):
        d, r = tree.depths[i], tree.ranks[i]
        prob[i] = prob[tree.parents[i]] * profile.p(d, r) if d <= depth and r < profile.ranks else 0.0
        if d <= depth:
            out[d] += prob[i]
    for d in range(1, depth + 1):
        out[d] += out[d - 1]
    return out


@dataclass(frozen=True)
class RowDraft:
    """What one live row may draft in a pass: to depth `limit` at most (its output and window), its
    heads' candidates to `heads_depth` (weighed by `heads`, their profile) and a lookup `match`."""

    limit: int
    heads_depth: int
    heads: AcceptanceProfile | None
    match: Match | None


def plan_pass(tree: DraftTree, rows: list[RowDraft | None], *, heads: int, costs: PassCosts | None,
              lookups: LookupProfile) -> tuple[DraftTree, list[bool]]:
    """The tree of one pass and, per row, whether it drafts its lookup bytes: the most expected
    bytes per second over the heads' `tree` and (with `costs`) that tree with its top-rank chain
    deepened for the lookup drafts. Rows are None where finished."""
    longest = max((len(r.match.draft) for r in rows if r is not None and r.match is not None), default=0)
    options = [tree]
    if costs is not None:
        options += [extended(tree, d) for d in range(chain_length(tree) + 1, min(longest, MAX_DRAFT) + 1)]
    # the lookup drafts' expectation by depth, once a row
    via_by_depth = [lookups.expected(r.match, r.limit) if r is not None and r.match is not None else [0.0]
                    for r in rows]
    best = None
    for option in options:
        chain, gained, uses = chain_length(option), 0.0, []
        expected = {}  # the heads' expectation by profile and depth: rows mostly share them
        for r, vias in zip(rows, via_by_depth):
            if r is None:
                uses.append(False)
                continue
            key = (id(r.heads), min(r.heads_depth, r.limit))
            if key not in expected:
                expected[key] = heads_expected(option, r.heads, key[1])[-1]
            own, via = expected[key], vias[min(chain, len(vias) - 1)]
            uses.append(via > own)
            gained += 1.0 + max(own, via)
        rate = gained / costs(heads, option.T) if costs is not None else gained
        if best is None or rate > best[0] * 1.0001:
            best = (rate, option, uses)
    return best[1], best[2]


def substitute(cand: list[list[int]], draft: bytes | tuple[int, ...] | None, depth: int, *, filler: int) -> list[list[int]]:
    """A row's candidates for a tree `depth` deep: the heads' `cand` [depth - 1][rank], with the
    lookup `draft` as the top rank where it reaches, and `filler` where neither has a byte (depths
    the row is not offered)."""
    out = []
    for d in range(1, depth + 1):
        ranks = list(cand[d - 1]) if d <= len(cand) else [filler]
        if draft is not None and d <= len(draft):
            ranks[0] = draft[d - 1]
        out.append(ranks)
    return out


def lookup_pass(state: Batch, batch: list[Row], tree: DraftTree, limits: list[int], *, heads: int,
                lookups: LookupProfile, costs: Callable[[], PassCosts]) -> tuple[DraftTree, list[int], list[Match | None]]:
    """A pass of `Decoder.step` where rows may draft lookup bytes (`Row.lookup`): the tree the
    batch shares (the heads' `tree`, maybe with a deeper chain), each row's offered depth (its
    `limits` allowing), and the match each row drafts (None: its heads' drafts), whose bytes
    replace its top-rank chain in `Row.cand` for this pass. `costs()` gives the pass costs, asked
    only when some row has a match."""
    depth = tree.depth  # the heads' candidates reach this deep
    rows = [None if r in state.finished else
            RowDraft(limit, depth, state.profile(row),
                     find(row.history()) if row.lookup and row.sampling.greedy else None)
            for r, row, limit in zip(state.active, batch, limits)]
    if all(r is None or r.match is None for r in rows):
        return tree, [min(depth, limit) for limit in limits], [None] * len(batch)
    tree, uses = plan_pass(tree, rows, heads=heads, costs=costs(), lookups=lookups)
    offered, used = [], []
    for row, draft, use in zip(batch, rows, uses):
        match = draft.match if use else None
        if match is not None or tree.depth > depth:
            row.cand = substitute(row.cand, match and match.draft, tree.depth, filler=row.nxt)
        offered.append(0 if draft is None else
                       min(draft.limit, tree.depth, max(depth, len(match.draft)) if match else depth))
        used.append(match)
    return tree, offered, used
