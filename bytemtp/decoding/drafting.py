"""What to draft: the shape of a speculative pass, the heads' running acceptance, what a pass costs.

Self-speculative decoding pays only when the bytes a pass accepts outweigh what the pass costs
over a plain one, and both depend on the model, the device and the batch. So the decoder does
not take a fixed draft length: each pass it drafts the shape that maximises expected bytes per
second,

    rate(k, tree) = (1 + sum over tree nodes of P(node accepted)) / cost(k heads, T nodes),

where a node at depth d stands for rank r of head d+1's candidates and is accepted when every
node on its path is, so P(node) is the product of `AcceptanceProfile.p(depth, rank)` along the
path (rank 0 = the head's top byte). `PassCosts` holds measured seconds per pass for k heads
over T fed nodes. A model whose heads 2..n are untrained soon shows p ~ 0 at depth 1, and the
best shape becomes the root alone with one head: plain decoding.

A `DraftTree` lists its nodes with parents before children and the all-top-rank chain first,
so a pass that accepts along that chain leaves its cache slots in place. A chain is the tree
with one candidate per depth; sampling always drafts a chain (one draft per position, each
drawn with the noise of its position: `sampling.verify_sampled`).

Where a shape has run and really delivered fewer bytes per second than plain decoding
(`PassCosts.realized`), the chooser falls back to plain; but a figure that is never refreshed
would keep the shape out for ever, whatever the load or the text do later. So speculation that
lost is tried again (`Retries`): after its m-th loss in a row it waits `base * 2**(m - 1)`
re-plans, then the shape the chooser prefers runs for one re-plan's passes, which refresh its
figure; a retry that wins (the shape delivered at least what plain decoding did) clears the
losses. The back-off is one for every speculative shape (`SPECULATION`): a shape that has not run
yet waits while every shape that ran lost, so that trying the next shape and the next after a loss,
each with no figure of its own, does not make the losses add up (at batch 8 on the compiled step,
with heads right too rarely to pay, that exploration cost 10-20% against plain decoding). The trade-off: a deterministic
exponential back-off rather than an optimistic bonus or random exploration, so that tests
replay exactly and a shape that keeps losing costs a share of passes that halves with every
loss (after m losses, about one re-plan in base * 2**m), while one that has become better is
found again after a wait that is bounded by the losses it had.
"""

from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass

import torch

TREE_RANKS = 8  # candidates per head that a tree may use (its top 8 bytes)
SPECULATION = "speculation"  # the key of the one back-off (`Retries`) that every speculative shape shares
MAX_NODES = 16  # fed nodes in one pass at most (root included)


@dataclass(frozen=True)
class DraftTree:
    """Nodes of one pass: node 0 is the root (the byte head 1 already chose); node i > 0 is
    candidate `ranks[i]` of head `depths[i] + 1`, child of `parents[i]`."""

    parents: tuple[int, ...]
    depths: tuple[int, ...]
    ranks: tuple[int, ...]

    @classmethod
    def chain(cls, n_drafts: int) -> DraftTree:
        n = n_drafts + 1
        return cls(tuple(range(-1, n - 1)), tuple(range(n)), (0,) * n)

    @classmethod
    def from_paths(cls, paths: list[tuple[int, ...]]) -> DraftTree:
        """From rank paths (each a tuple of ranks, depth = its length), closed under prefixes:
        the all-zero chain first, then the others in the given order (parents before children)."""
        chain = sorted((p for p in paths if not any(p)), key=len)
        order = [()] + chain + [p for p in paths if any(p)]
        index = {p: i for i, p in enumerate(order)}
        assert len(index) == len(order) and all(p[:-1] in index for p in order[1:]), paths
        return cls(tuple(index[p[:-1]] if p else -1 for p in order), tuple(len(p) for p in order),
                   tuple(p[-1] if p else 0 for p in order))

    @property
    def T(self) -> int:
        return len(self.parents)

    @functools.cached_property
    def depth(self) -> int:
        return max(self.depths)

    @functools.cached_property
    def is_chain(self) -> bool:
        return self.depths == tuple(range(self.T))

    @functools.cached_property
    def children(self) -> list[list[int]]:
        """Each node's children (made once per tree: a tree is reused pass after pass)."""
        kids: list[list[int]] = [[] for _ in self.parents]
        for i, p in enumerate(self.parents[1:], 1):
            kids[p].append(i)
        return kids

    @functools.cached_property
    def ancestors(self) -> torch.Tensor:
        """(T, T) bools: node i sees node j (itself and every node on its path)."""
        see = torch.zeros(self.T, self.T, dtype=torch.bool, device="cpu")  # the tree's shape, on the host
        for i, p in enumerate(self.parents):
            see[i, i] = True
            if p >= 0:
                see[i] |= see[p]
        return see

    def truncated(self, depth: int) -> DraftTree:
        """The nodes of depth <= `depth` (parents come first, so indices stay valid); kept, as a
        pass asks it of the same few trees again and again."""
        if depth >= self.depth:
            return self
        cut = self._truncations.get(depth)
        if cut is None:
            keep = [i for i, d in enumerate(self.depths) if d <= depth]
            where = {i: j for j, i in enumerate(keep)}
            cut = self._truncations[depth] = DraftTree(tuple(where.get(self.parents[i], -1) for i in keep),
                                                       tuple(self.depths[i] for i in keep),
                                                       tuple(self.ranks[i] for i in keep))
        return cut

    @functools.cached_property
    def _truncations(self) -> dict[int, DraftTree]:
        return {}

    def describe(self) -> str:
        return self._description

    @functools.cached_property
    def _description(self) -> str:  # asked every pass: made once a tree
        if self.T == 1:
            return "none"
        if self.is_chain:
            return f"chain of {self.T - 1}"
        width = [sum(d == depth for d in self.depths) for depth in range(1, self.depth + 1)]
        return f"tree of {self.T - 1} ({'-'.join(map(str, width))})"


def accepted_run(path: list[int], tree: DraftTree, length: int) -> int:
    """Lookup bytes an accepted path used: its leading top-rank nodes, up to the draft's length."""
    n = 0
    for node in path[1:]:
        if tree.ranks[node] != 0 or n >= length:
            break
        n += 1
    return n


class AcceptanceProfile:
    """Running estimate of p(depth, rank): how often head depth+1's rank-th candidate is the
    byte head 1 settles on at that depth, once the path before it has been accepted.

    Counts start from a prior worth `strength` observations (a fair guess for a trained model:
    0.6 for the first draft, decaying with depth), so early passes explore and the counts soon
    dominate. Counts decay by `forget` each record, so the profile follows the text."""

    def __init__(self, n_future: int, *, ranks: int = TREE_RANKS, strength: float = 2.0,
                 forget: float = 0.995, prior: list[float] | None = None):
        depths = max(0, n_future - 1)
        prior = prior or [0.6 * 0.85 ** d for d in range(depths)]
        self.ranks, self.forget = ranks, forget
        self.prior = [[p] + [min(0.5 * (1 - p), 0.15) / r for r in range(1, ranks)] for p in prior]
        self.strength = strength
        self.hits = [[0.0] * ranks for _ in range(depths)]
        self.trials = [0.0] * depths

    def p(self, depth: int, rank: int) -> float:
        d = depth - 1
        return (self.hits[d][rank] + self.strength * self.prior[d][rank]) / (self.trials[d] + self.strength)

    def record(self, depth: int, rank: int | None) -> None:
        """At `depth`, the true byte was candidate `rank` of its head (None: not among them)."""
        d = depth - 1
        self.trials[d] = self.trials[d] * self.forget + 1.0
        row = self.hits[d]
        for r in range(self.ranks):
            row[r] *= self.forget
        if rank is not None and rank < self.ranks:
            row[rank] += 1.0

    def record_pass(self, cand: list[list[int]], truth: list[int], *, offered: int, greedy: bool) -> None:
        """What the heads got right in one pass, whose candidates were `cand` [depth - 1][rank]
        and whose true bytes are `truth` (the accepted drafts, then head 1's byte after them): at
        each depth up to the first miss, the rank of the true byte among that head's candidates
        (sampling: accepted or not), up to the depth the row was `offered` and the heads reach."""
        # candidates deeper than the heads reach (a lookup draft's, left from an earlier pass) teach nothing
        for depth in range(1, min(len(truth), len(cand), max(offered, 1), len(self.trials)) + 1):
            if greedy:
                ranks = cand[depth - 1]
                self.record(depth, ranks.index(truth[depth - 1]) if truth[depth - 1] in ranks else None)
            elif depth <= offered:
                self.record(depth, 0 if depth < len(truth) else None)

    def first(self) -> list[float]:
        """p(depth, 0) for every depth: the chain's conditional acceptance."""
        return [self.p(d, 0) for d in range(1, len(self.trials) + 1)]


class PassCosts:
    """Seconds of one pass that runs k heads over T fed nodes: measured on a grid of (k, T)
    before decoding and interpolated linearly in between (flat beyond the grid), then corrected
    by what passes really take while decoding (`observe`): a (k, T) that has run uses its own
    running mean (the loop's overheads and the machine's load included), the others the grid
    times the running ratio of observed to predicted over all passes, plain ones included. The
    grid times whole decoding steps, as the fastest of several tries, and is made monotone (more
    heads or nodes never cost less), so its shape is clean and the ratio carries the load.
    `stepwise` costs (a compiled step, which pads a pass up to the next grid point) take the
    grid point at or above instead of interpolating."""

    def __init__(self, table: dict[tuple[int, int], float], *, calibrate: bool = True, stepwise: bool = False):
        self.ks = sorted({k for k, _ in table})
        self.Ts = sorted({T for _, T in table})
        # a pass with more heads or more nodes never costs less: smooth the noise out of the grid
        self.table = {}
        for k in self.ks:
            for T in self.Ts:
                below = [self.table[k2, T] for k2 in self.ks if k2 < k] + \
                        [self.table[k, T2] for T2 in self.Ts if T2 < T]
                self.table[k, T] = max([table[k, T], *below])
        self.calibrate, self.stepwise = calibrate, stepwise
        self.seen: dict[tuple[int, int], float] = {}  # running mean of observed seconds
        self.scale = 1.0  # running mean of observed over predicted: the loop and the load now
        self.realized: dict[tuple[int, int], float] = {}  # bytes a row per second, by (k, T) as kept
        self.runs: dict[tuple[int, int], int] = {}  # passes observed, by (k, T) as kept
        self.retries = Retries()  # when a shape that delivered less than plain decoding runs again

    def _between(self, grid: list[int], x: int) -> tuple[int, int, float]:
        if x <= grid[0]:
            return grid[0], grid[0], 0.0
        for lo, hi in zip(grid, grid[1:]):
            if x <= hi:
                return (hi, hi, 0.0) if self.stepwise else (lo, hi, (x - lo) / (hi - lo))
        return grid[-1], grid[-1], 0.0

    def predicted(self, k: int, T: int) -> float:
        """The grid's interpolation, uncorrected."""
        k0, k1, a = self._between(self.ks, k)
        T0, T1, b = self._between(self.Ts, T)
        t = self.table
        return ((1 - a) * (1 - b) * t[k0, T0] + a * (1 - b) * t[k1, T0]
                + (1 - a) * b * t[k0, T1] + a * b * t[k1, T1])

    def _key(self, k: int, T: int) -> tuple[int, int]:
        """Where a pass's cost is kept: its own (k, T), or for stepwise costs the grid point it runs as."""
        if not self.stepwise:
            return k, T
        k = self._between(self.ks, k)[0]
        return k, self._between(self.Ts, max(T, k))[0]  # k heads run at least k nodes

    def __call__(self, k: int, T: int) -> float:
        k, T = self._key(k, T)
        if (k, T) in self.seen:
            return self.seen[k, T]
        return self.predicted(k, T) * self.scale

    def observe(self, k: int, T: int, seconds: float, *, bytes_per_row: float | None = None,
                weight: float = 0.1) -> None:
        """A pass of k heads over T nodes took `seconds` (its whole step, from draft to accept)
        and gave each row `bytes_per_row` bytes on average."""
        if not self.calibrate:
            return
        k, T = self._key(k, T)
        if bytes_per_row is not None:
            rate, old_rate = bytes_per_row / seconds, self.realized.get((k, T))
            self.realized[k, T] = rate if old_rate is None else (1 - weight) * old_rate + weight * rate
            self.runs[k, T] = self.runs.get((k, T), 0) + 1
        old = self.seen.get((k, T))
        self.seen[k, T] = seconds if old is None else (1 - weight) * old + weight * seconds
        self.scale = (1 - weight) * self.scale + weight * seconds / self.predicted(k, T)

    def realize(self, k: int, T: int, rate: float, *, weight: float = 0.3) -> None:
        """What a stretch of passes of k heads over T nodes really delivered, `rate` bytes a row a
        second over the loop's whole time (the passes, emitting, sliding, re-warming: `loop.Window`),
        into `realized`, which weighs a plan against plain decoding."""
        if not self.calibrate:
            return
        k, T = self._key(k, T)
        old = self.realized.get((k, T))
        self.realized[k, T] = rate if old is None else (1 - weight) * old + weight * rate
        self.runs[k, T] = self.runs.get((k, T), 0) + 1

    def ratio(self, k: int, T: int) -> float:
        """What the pass costs over a plain one (one head, one node)."""
        return self(k, T) / self(1, 1)

    @classmethod
    def from_dict(cls, table_ms: dict[str, float], **kw) -> PassCosts:
        """The costs that `to_dict` wrote."""
        return cls({tuple(int(x) for x in key.split("x")): ms / 1e3 for key, ms in table_ms.items()}, **kw)

    def to_dict(self) -> dict:
        return {f"{k}x{T}": round(s * 1e3, 4) for (k, T), s in sorted(self.table.items())}


class Retries:
    """When speculation that lost to plain decoding (by what it really delivered) runs again: after
    its m-th loss in a row, once `base * 2**(m - 1)` re-plans that prefer it have gone by (module
    docstring). Kept with the costs, under one key (`SPECULATION`), so that one decoder's calls
    share it."""

    def __init__(self, base: int = 2):
        self.base = base
        self.losses: dict[tuple[int, int], int] = {}  # losses in a row
        self.waited: dict[tuple[int, int], int] = {}  # re-plans since the last loss
        self.trying: dict[tuple[int, int], int] = {}  # retries granted: the shape's passes seen then

    def due(self, key: tuple[int, int], *, lost: bool, runs: int) -> bool:
        """At a re-plan that prefers `key` by expectation: whether it runs, where it `lost` by its
        figure after `runs` passes of it. One that did not lose runs, and its losses are cleared (a
        retry that wins resets them); one whose retry has passed and lost again waits twice as
        long; a retry that has not run yet (its call ended) stays due."""
        if not lost:
            for kept in (self.losses, self.waited, self.trying):
                kept.pop(key, None)
            return True
        if key in self.trying:
            if self.trying[key] == runs:
                return True
            del self.trying[key]
            self.losses[key] += 1
            self.waited[key] = 0
            return False
        if key not in self.losses:
            self.losses[key], self.waited[key] = 1, 0
            return False
        self.waited[key] += 1
        if self.waited[key] >= self.base * 2 ** (self.losses[key] - 1):
            self.trying[key] = runs
            return True
        return False


@dataclass(frozen=True)
class Choice:
    """Heads to run in a pass and the tree it verifies, with the expected bytes per pass and
    the expected rate relative to plain decoding."""

    heads: int
    tree: DraftTree
    bytes_per_pass: float
    speedup: float


def best_tree(profile: AcceptanceProfile, max_depth: int, max_nodes: int, *,
              ranks: int) -> list[tuple[tuple[int, ...], float]]:
    """The nodes (rank paths) of the most likely tree, best first, up to max_nodes - 1 of them,
    each with its probability of being accepted (best-first search over ranks sorted by p)."""
    if max_depth < 1 or max_nodes < 2:
        return []
    out = []
    heap = [(-profile.p(1, 0), (0,))]
    while heap and len(out) < max_nodes - 1:
        neg, path = heapq.heappop(heap)
        prob = -neg
        out.append((path, prob))
        depth, rank = len(path), path[-1]
        if rank + 1 < ranks:  # the next sibling
            sib = path[:-1] + (rank + 1,)
            parent = prob / profile.p(depth, rank) if profile.p(depth, rank) > 0 else 0.0
            heapq.heappush(heap, (-parent * profile.p(depth, rank + 1), sib))
        if depth < max_depth:  # the first child
            heapq.heappush(heap, (-prob * profile.p(depth + 1, 0), path + (0,)))
    return out


def choose(profile: AcceptanceProfile, costs: PassCosts, *, max_heads: int, tree: bool,
           max_nodes: int = MAX_NODES, heads: int | None = None, margin: float = 0.1) -> Choice:
    """The (heads, tree) that maximises expected bytes per second, assuming the next passes
    draft alike; `heads` fixes the number of heads (a forced --heads), `tree` False drafts
    chains only. Speculation must promise `margin` more than plain decoding to be chosen over
    it, so that estimates off by a few percent do not make decoding slower, and where both have
    run, the chosen pass must have really delivered more bytes per second than plain decoding (a
    pass shape that fixed drafts ran slowly says nothing against another one), unless its retry
    is due (`costs.retries`, which every call here advances: call it once per re-plan)."""
    ranks = profile.ranks if tree else 1
    best = None
    for k in ([heads] if heads else range(1, max_heads + 1)):
        nodes = best_tree(profile, k - 1, max_nodes, ranks=ranks)
        expected = 1.0
        options = [(expected, 0)]
        for n, (_, prob) in enumerate(nodes, 1):
            expected += prob
            options.append((expected, n))
        for expected, n in options:
            rate = expected / costs(k, n + 1)
            if best is None or rate > best[0] * 1.0001:
                best = (rate, k, [p for p, _ in nodes[:n]], expected)
    rate, k, paths, expected = best
    plain_key = costs._key(1, 1)
    plain_rate = costs.realized.get(plain_key, 1 / costs(1, 1))
    key = costs._key(k, len(paths) + 1)
    spec_rate = costs.realized.get(key)  # what this pass delivered, where it ran
    # one back-off for all speculation: a shape that has not run yet waits while every one that ran lost
    ran = [r for shape, r in costs.realized.items() if shape != plain_key]
    lost = spec_rate < plain_rate if spec_rate is not None else bool(ran) and max(ran) < plain_rate
    if heads is None and k > 1 and (rate < (1 + margin) * plain_rate or not costs.retries.due(
            SPECULATION, lost=lost, runs=sum(n for shape, n in costs.runs.items() if shape != plain_key))):
        rate, k, paths, expected = plain_rate, 1, [], 1.0
    return Choice(heads=k, tree=DraftTree.from_paths(paths) if paths else DraftTree.chain(0),
                  bytes_per_pass=expected, speedup=rate * costs(1, 1))
