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

Plain decoding is always one of the arms, and the choice between it and speculation is made on
what each really delivered here (`Arbiter`): bytes a row a second over the loop's whole time
(passes, emitting, slides; `loop.Window`), plain decoding measured before anything is judged (a
first window speculates where the pass costs and the profile expect it to pay). Speculation that
delivers more than plain decoding (by `margin`) runs on; speculation that has not won runs only
while what it has cost against plain decoding, re-warms included, stays within `budget` of the
time decoded (3%), in short windows (`EXPLORE_PASSES`), so that heads that never pay cost at most
that share, and heads that start to pay are found again at the next try the budget allows. The
trade-off: a deterministic budget rather than random exploration, so that tests replay exactly
and auto is never more than the budget (and one short window) slower than plain decoding, at the
price of finding heads that have become good only as often as the budget allows. Measuring the
pass costs counts in that balance but holds no try back (`Arbiter.charge`).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import statistics
from dataclasses import dataclass

import torch

TREE_RANKS = 8  # candidates per head that a tree may use (its top 8 bytes)
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
        self.arbiters: dict[tuple[bool, bool], Arbiter] = {}  # plain against speculation, by lookup and greediness
        self.setup_s = 0.0  # seconds measuring these costs took: charged to the first arbiter made

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

    def observe(self, k: int, T: int, seconds: float, *, weight: float = 0.1) -> None:
        """A pass of k heads over T nodes took `seconds` (its whole step, from draft to accept)."""
        if not self.calibrate:
            return
        k, T = self._key(k, T)
        old = self.seen.get((k, T))
        self.seen[k, T] = seconds if old is None else (1 - weight) * old + weight * seconds
        self.scale = (1 - weight) * self.scale + weight * seconds / self.predicted(k, T)

    def arbiter(self, lookup: bool = False, greedy: bool = True) -> Arbiter:
        """The arbiter of drafts with prompt lookup or without (`Draft.lookup`), for greedy rows or
        sampled ones (sampling spends more of a pass outside the step): each judges on its own
        records. The first one made is charged what measuring these costs took (`setup_s`)."""
        key = (lookup, greedy)
        if key not in self.arbiters:
            self.arbiters[key] = Arbiter()
            if len(self.arbiters) == 1 and self.setup_s:
                self.arbiters[key].charge(self.setup_s, sunk=True)
        return self.arbiters[key]

    def ratio(self, k: int, T: int) -> float:
        """What the pass costs over a plain one (one head, one node)."""
        return self(k, T) / self(1, 1)

    @classmethod
    def from_dict(cls, table_ms: dict[str, float], **kw) -> PassCosts:
        """The costs that `to_dict` wrote."""
        return cls({tuple(int(x) for x in key.split("x")): ms / 1e3 for key, ms in table_ms.items()}, **kw)

    def to_dict(self) -> dict:
        return {f"{k}x{T}": round(s * 1e3, 4) for (k, T), s in sorted(self.table.items())}


EXPLORE_PASSES = 4  # passes of a window that tries speculation (or measures plain decoding)
REMEASURE = 8  # speculative windows in a row after which plain decoding is measured again
PLAN_PASSES = 16  # passes of any other window: between two re-plans of an adapting draft
PLAIN_WINDOWS = 3  # plain windows whose median is the plain figure: no one window sets it
MAX_BACKOFF = 8  # plain windows a lost try holds the next back at most (1, 2, 4, 8 as losses run on)


class Arbiter:
    """Plain decoding against speculation, on what each really delivered at one batch size, step
    and kind of rows (module docstring): `record` takes each window's outcome, `charge` what
    speculation cost outside the windows, `arm` says what the next window runs.

    A first window speculates where it is promising (one try, so that a short call speculates at
    all); then plain decoding is measured. Every second spent speculating or preparing to counts in
    one balance against plain decoding: the windows that speculated (judged on the plain figure),
    their re-warms, the windows too short to judge (a call's last few passes), and what `charge` is
    told (calibrating the pass costs, prefilling and admitting rows with every head rather than
    one). Speculation that has not won runs only while that balance, the calibration apart, stays
    within `budget` of the time decoded, counting the next try at what tries really cost (the last
    one that lost), never at less; the plain figure is the median of the last PLAIN_WINDOWS plain
    windows; and a lost try holds the next back for at most MAX_BACKOFF plain windows (1, 2, 4,
    ... as tries go on losing), so that one unlucky try (a slide inside it) does not lock out a
    winner for long."""

    def __init__(self, *, budget: float = 0.03, margin: float = 0.03):
        self.budget, self.margin = budget, margin
        self.plains: list[float] = []  # bytes a row a second of the last PLAIN_WINDOWS plain windows
        self.window_s = 0.0  # seconds of the last plain window: the unit a back-off waits in
        self.specs: list[float] = []  # what the last speculative windows delivered, since the try that began them
        self.winning = False  # whether speculation delivered more than plain decoding at its last window
        self.balance_s = 0.0  # seconds speculation gained over plain decoding (below 0: what it cost)
        self.total_s = 0.0  # seconds of everything recorded or charged
        self.rewarm_s = 0.0  # what the last switch to speculation cost (re-warming the heads' caches)
        self.pending: list[tuple] = []  # speculative windows that ran before the plain figure stood
        self.try_loss_s = 0.0  # what the last try that lost cost against plain decoding (measured)
        self.losses = 0  # tries lost in a row
        self.since_loss_s = 0.0  # seconds since that loss
        self.spec_run = 0  # speculative windows since plain decoding was last measured
        self.sunk_s = 0.0  # of the balance: what measuring the pass costs took (spent, not risked)

    @property
    def plain(self) -> float | None:
        """Bytes a row a second of plain decoding: the median of the last PLAIN_WINDOWS (None before)."""
        return sorted(self.plains)[PLAIN_WINDOWS // 2] if len(self.plains) == PLAIN_WINDOWS else None

    def record(self, *, speculative: bool, rate: float, seconds: float, rewarm_s: float = 0.0,
               trial: bool = True, short: bool = False) -> None:
        """A window delivered `rate` bytes a row a second over `seconds` (its re-warms' `rewarm_s` apart);
        `trial`: it tried speculation (else it ran on speculation that had won); `short`: too few
        passes to judge it by (a call's last), so it counts in the balance and nothing else."""
        self.total_s += seconds + rewarm_s
        self.since_loss_s += seconds + rewarm_s
        if short:
            if speculative and self.plain is not None:
                self.balance_s += rate * seconds / self.plain - (seconds + rewarm_s)
            elif speculative:
                self.balance_s -= rewarm_s
            return
        if rewarm_s:
            self.rewarm_s = rewarm_s
        if not speculative:
            self.plains = (self.plains + [rate])[-PLAIN_WINDOWS:]
            self.window_s, self.spec_run = seconds, 0
            if self.plain is None:
                return
            for window in self.pending:  # the speculative windows that ran first are judged now
                self._judge(*window)
            if not self.pending and self.specs:  # measured again: speculation weighed anew
                self.winning = self.winning and statistics.median(self.specs) > self.plain * (1 + self.margin)
            self.pending = []
            return
        self.spec_run += 1
        self.specs = [rate] if trial else (self.specs + [rate])[-PLAIN_WINDOWS:]  # no one window ends a win
        if self.plain is None:  # nothing to weigh it against yet: plain decoding runs next
            self.pending.append((rate, seconds, rewarm_s, trial))
            return
        self._judge(rate, seconds, rewarm_s, trial)

    def charge(self, seconds: float, *, sunk: bool = False) -> None:
        """Seconds that speculation cost outside any window: prefilling or admitting rows with more
        heads than plain decoding needs, or (`sunk`) calibrating the pass costs: in the balance, not
        in what a try may risk (`_within`): it would hold every try back, never to be earned back."""
        self.total_s, self.balance_s, self.sunk_s = self.total_s + seconds, self.balance_s - seconds, \
            self.sunk_s + (seconds if sunk else 0.0)

    def _within(self, loss_s: float) -> bool:
        """Whether speculation's cost, sunk costs apart and `loss_s` more, stays within the budget."""
        return self.balance_s + self.sunk_s - loss_s >= -self.budget * (self.total_s - self.sunk_s)

    def _judge(self, rate: float, seconds: float, rewarm_s: float, trial: bool) -> None:
        gain = rate * seconds / self.plain - (seconds + rewarm_s)  # against plain decoding of its bytes
        self.balance_s += gain
        self.winning = statistics.median(self.specs) > self.plain * (1 + self.margin)
        if not trial:
            return
        if gain < 0:  # a try that lost: the next waits (a bounded back-off) and is counted at its cost
            self.try_loss_s, self.since_loss_s, self.losses = -gain, 0.0, self.losses + 1
        else:
            self.losses = 0

    def may_go_on(self, lost_s: float) -> bool:
        """Whether a try that has so far lost `lost_s` seconds against plain decoding of its bytes
        (measured while it runs, `loop.Window`) may run its next pass: while it has not spent what
        the budget had left when it began, so that a try costs what was measured, not predicted."""
        return self.plain is None or self._within(lost_s)

    def holds_back(self) -> bool:
        """Whether the next window runs plain decoding whatever a try would cost (what `arm` says
        with try_s = 0 and nothing promising): asked first, so that a plan that will not speculate
        does not search the best shape (on a small model that search costs more than its passes)."""
        return self.plain is not None and not self.winning and not self._may_try(0.0)

    def _may_try(self, try_s: float) -> bool:
        cost = max(try_s, self.try_loss_s) + self.rewarm_s  # a try costs what the last lost try did, at least
        wait = min(self.try_loss_s / self.budget, min(2 ** max(self.losses - 1, 0), MAX_BACKOFF) * self.window_s)
        return self._within(cost) and self.since_loss_s >= wait

    def arm(self, try_s: float = 0.0, *, promising: bool = False) -> tuple[bool, int]:
        """Whether the next window speculates, and its passes: at first, speculation where it is
        `promising` (the pass costs and the profile expect it to pay: one window, so that a short
        call of a good model speculates at all), then plain decoding, measured before anything is
        judged; speculation while it wins; a try where what it may cost (`try_s`, by the expected
        bytes and pass costs, or the last lost try's cost, whichever is more, and a re-warm like the
        last) keeps speculation's cost within the budget; else plain decoding."""
        if self.plain is None:  # a promising first try (a short call's chance), then plain decoding measured
            return promising and not self.specs, EXPLORE_PASSES
        if self.winning:  # ... with plain decoding measured again now and then, so a stale figure cannot keep it
            return (False, EXPLORE_PASSES) if self.spec_run >= REMEASURE else (True, PLAN_PASSES)
        if self._may_try(try_s):
            return True, EXPLORE_PASSES
        return False, PLAN_PASSES


@dataclass(frozen=True)
class Choice:
    """Heads to run in a pass and the tree it verifies, with the expected bytes per pass and
    the expected rate relative to plain decoding, for `passes` passes (then the next plan)."""

    heads: int
    tree: DraftTree
    bytes_per_pass: float
    speedup: float
    passes: int = PLAN_PASSES
    lookup: bool = True  # whether rows that draft prompt lookup bytes may (False: the arbiter's plain arm)

    def speculates(self, lookup: bool) -> bool:
        """Whether its passes speculate, for a draft that does (`lookup`) or does not draft lookup bytes."""
        return self.heads > 1 or lookup and self.lookup


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
           max_nodes: int = MAX_NODES, heads: int | None = None, margin: float = 0.1,
           arbiter: Arbiter | None = None, lookup: bool = False) -> Choice:
    """The (heads, tree) of the next window and its passes. The shape is the one that maximises
    expected bytes per second, assuming the next passes draft alike; `heads` fixes the number of
    heads (a forced --heads), `tree` False drafts chains only. With an `arbiter` (costs that passes
    calibrate), whether it speculates is the arbiter's (`Arbiter.arm`: on what plain decoding and
    speculation really delivered), and it speculates with the best shape that drafts; without one
    (given costs), speculation must promise `margin` more than plain decoding to be chosen. With
    `lookup` (rows draft prompt lookup bytes), the arbiter's plain arm drafts nothing at all, and its
    speculation drafts lookup bytes, with the heads where they promise to pay."""
    plain_arm = Choice(heads=1, tree=DraftTree.chain(0), bytes_per_pass=1.0, speedup=1.0, lookup=False)
    if heads is None and arbiter is not None and arbiter.holds_back():
        return plain_arm
    ranks = profile.ranks if tree else 1
    best, plain = None, (1.0 / costs(1, 1), 1, [], 1.0)
    for k in ([heads] if heads else range(2, max_heads + 1)):
        nodes = best_tree(profile, k - 1, max_nodes, ranks=ranks)
        expected = 1.0
        for n, (_, prob) in enumerate(nodes, 1):
            expected += prob
            rate = expected / costs(k, n + 1)
            if best is None or rate > best[0] * 1.0001:
                best = (rate, k, [p for p, _ in nodes[:n]], expected)
    if best is None or heads == 1:
        best = plain
    passes = PLAN_PASSES
    if heads is None:
        promising = best[0] >= (1 + margin) * plain[0]
        if arbiter is not None:  # a try's cost: its passes' seconds beyond plain decoding of the bytes expected
            try_s = EXPLORE_PASSES * max(0.0, costs(best[1], len(best[2]) + 1) - best[3] * costs(1, 1))
            if lookup and not promising:  # a try of lookup bytes alone: plain passes, expected to cost nothing more
                try_s = 0.0
            speculate, passes = arbiter.arm(try_s, promising=promising or lookup)
            if not speculate:
                return dataclasses.replace(plain_arm, passes=passes)
            if lookup and not promising:  # speculation by lookup bytes alone
                return dataclasses.replace(plain_arm, lookup=True, passes=passes)
        elif not promising:
            best = plain
    rate, k, paths, expected = best
    return Choice(heads=k, tree=DraftTree.from_paths(paths) if paths else DraftTree.chain(0),
                  bytes_per_pass=expected, speedup=rate * costs(1, 1), passes=passes)
