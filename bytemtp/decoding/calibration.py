"""What a decoding pass costs, calibrated: the grid a decoder times its own step on, the table
made from those times, and `CalibratedCosts`, one decoder's costs by batch size and step.

The decoder's choice of draft (`drafting.choose`) weighs bytes against seconds, so the seconds
must be those of the step that really runs: `measure_pass_costs` times the decoder's
own `step` on rows in the middle of the context, over the shapes of `timing_grid`, and
`cost_table` keeps the fastest of the repeats (noise only ever adds time). The trade-off: a
grid of about twenty shapes, measured once per batch size and step (eager or compiled), rather
than every shape the chooser may ask about; `PassCosts` interpolates between them and corrects
them by what the passes take while decoding. Costs measured on the compiled step are recorded
beside the compile cache (`compiled.record_costs`), so that a later process neither measures
them again nor compiles a shape before the decoder chooses it.
"""

from __future__ import annotations

import time

import torch

from bytemtp.decoding.batch import Batch, Row
from bytemtp.decoding.compiled import NODE_BUCKETS, cached_costs, record_costs
from bytemtp.decoding.drafting import (MAX_NODES, TREE_RANKS, AcceptanceProfile, Choice, DraftTree, PassCosts,
                                      best_tree)
from bytemtp.decoding.generation import Output, SpeculativeStats
from bytemtp.model.kvcache import KVCache
from bytemtp.runtime.devices import synchronize

GRID_NODES = (1, 2, 4, 8, MAX_NODES)  # nodes a pass is timed at


def grid_heads(n_future: int) -> list[int]:
    """Head counts a pass is timed at: 1, 2, 4 and all."""
    return sorted({1, min(2, n_future), min(4, n_future), n_future})


def timing_grid(n_future: int) -> dict[tuple[int, int], DraftTree]:
    """The (k heads, T nodes) a pass is timed at, each with the tree it drafts (the likeliest
    under a flat profile). k heads over fewer than k nodes draft too shallow a tree to need them
    all: such a pass does no better than one of fewer heads, so it is charged what k nodes cost
    and never timed (on the compiled step, six graphs fewer to compile)."""
    flat = AcceptanceProfile(n_future, prior=[0.5] * (n_future - 1), strength=1.0)
    return {(k, T): DraftTree.from_paths([p for p, _ in best_tree(flat, k - 1, T, ranks=TREE_RANKS)])
            for k in grid_heads(n_future) for T in GRID_NODES if T >= k or k == T == 1}


def cost_table(times: dict[tuple[int, int], list[float]], n_future: int, *, stepwise: bool) -> PassCosts:
    """The costs of the timed grid: each shape's fastest time, the untimed shapes filled in (k
    heads over fewer than k nodes as over k; one head drafts nothing, so its row is only ever
    read at T = 1)."""
    ks, Ts = grid_heads(n_future), GRID_NODES
    table = {key: min(v) for key, v in times.items()}
    for k in ks[1:]:
        for T in Ts:
            if T < k:
                table[k, T] = table[k, next(T2 for T2 in Ts if T2 >= k)]
    for T in Ts[1:]:
        table[1, T] = table[min(2, n_future), T] if n_future > 1 else table[1, 1]
    return PassCosts(table, stepwise=stepwise)


class CalibratedCosts:
    """One decoder's pass costs by (batch size, compiled step). Given costs (tests) are used as
    they are and never calibrated; otherwise the costs this process measured, or for the
    compiled step those an earlier process recorded in the compile cache (keyed by what the
    passes run after the trunk, `pass_heads`)."""

    def __init__(self, pass_heads, *, given: PassCosts | None = None):
        self.pass_heads, self.given = pass_heads, given
        self.known: dict[tuple[int, bool], PassCosts] = {}  # by (batch size, compiled)

    def lookup(self, batch_size: int, *, static: bool) -> PassCosts | None:
        """The costs at hand: given, measured in this process, or recorded by an earlier one."""
        if self.given is not None:
            return self.given
        key = (batch_size, static)
        if key not in self.known and static:  # measured by an earlier process that compiled the step
            table = cached_costs(self.pass_heads, batch_size=batch_size)
            if table is not None:
                self.known[key] = PassCosts.from_dict(table, stepwise=True)
        return self.known.get(key)

    def add(self, batch_size: int, costs: PassCosts, *, static: bool) -> PassCosts:
        """Keep costs just measured (on the compiled step, also for later processes)."""
        self.known[batch_size, static] = costs
        if static:
            record_costs(self.pass_heads, batch_size=batch_size, costs_ms=costs.to_dict())
        return costs

    def costs(self, decoder, batch_size: int, *, static: bool) -> PassCosts:
        """The decoder's pass costs at this batch size on the eager or the compiled step (`lookup`),
        measured on its own step (`measure_pass_costs`) the first time they are asked."""
        costs = self.lookup(batch_size, static=static)
        if costs is None:
            t0 = time.perf_counter()
            with torch.inference_mode():
                costs = self.add(batch_size, measure_pass_costs(decoder, batch_size, static=static), static=static)
            costs.setup_s = time.perf_counter() - t0  # speculation's to pay (`PassCosts.arbiter`)
        return costs

    def for_run(self, batch_size: int, *, static: bool) -> PassCosts | None:
        """The costs that a run's passes calibrate: none when they were given, else those measured."""
        return None if self.given is not None else self.known.get((batch_size, static))


def measure_pass_costs(decoder, batch_size: int, *, repeats: int = 5,
                       static: bool = False) -> PassCosts | None:
    """Seconds per decoding step (draft, forward pass, verify, accept) of a `decode.Decoder`, k
    heads over T nodes, on the shapes of `timing_grid`, on rows in the middle of the context: the
    fastest of interleaved repeats after a warm-up round (`cost_table`), timed as
    `Decoder.step` runs, on the eager or the compiled static step (whose costs step from bucket
    to bucket). With no repeats, only the warm-up round runs (every shape compiled) and nothing
    is returned."""
    model = decoder.model
    n, seq_len = model.config.n_future, model.config.seq_len
    shapes = timing_grid(n)
    rows = [Row(b"", Output(SpeculativeStats(), max_bytes=1 << 30, stop=(), on_bytes=None))
            for _ in range(batch_size)]
    cache = KVCache.for_model(model, batch_size=batch_size, max_len=seq_len + MAX_NODES)
    # the dummy rows teach no profile and calibrate nothing
    state = Batch(rows, cache, warm=n, n_future=n, profiles=None, costs=None, static=static)
    device = model.embed.weight.device
    times: dict[tuple[int, int], list[float]] = {key: [] for key in shapes}
    for rep in range(repeats + 1):
        for (k, T), tree in shapes.items():
            for row in rows:
                row.nxt, row.cand, row.start = 0, [list(range(TREE_RANKS))] * (n - 1), 0
                row.out.data = bytearray(b"x" * (seq_len // 2))
            cache.lengths = [seq_len // 2] * batch_size
            state.warm, state.finished = n, set()
            synchronize(device)
            t0 = time.perf_counter()
            decoder.step(state, Choice(k, tree, 0.0, 0.0))
            synchronize(device)
            if rep:  # the first round warms up
                times[k, T].append(time.perf_counter() - t0)
    return cost_table(times, n, stepwise=static) if repeats else None


def compile_shapes(decoder, batch_size: int) -> None:
    """Compile now every shape of the decoder's static step that it may choose at this batch size
    (a benchmark's warm-up: no compiling inside timed runs); nothing without the step. Besides the
    timing grid's shapes, one head over a chain in every node bucket: the passes that verify
    prompt-lookup drafts, longer than any the heads draft alone."""
    static = decoder.policy.static
    if static is not None:
        with torch.inference_mode():
            measure_pass_costs(decoder, batch_size, repeats=0, static=True)
            model = decoder.model
            cache = KVCache.for_model(model, batch_size=batch_size, max_len=model.config.seq_len + MAX_NODES)
            for T in NODE_BUCKETS:
                cache.lengths = [0] * batch_size
                static(torch.zeros(batch_size, T, dtype=torch.long, device=cache.k.device), cache, heads=1)
