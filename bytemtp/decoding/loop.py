"""The decoding pass cycle, with one owner: `Loop` advances a `batch.Batch` pass by pass.

A pass is: plan the draft at the batch's size (`Decoder.plan`: its heads and tree, from the
acceptance profile and the pass costs measured at that size, on the step that runs), re-warm the
caches of heads the plan needs that the batch lacks (`Decoder.rewarm`, from `Batch.stale`), draft,
forward (eager or on the compiled static step), verify and accept (`Decoder.step`), mark which
heads' caches the pass left stale (`PassHeads.whole_after`), then emit each row's next byte,
sliding full windows (`emit`). The loop orchestrates; the model work is the decoder's steps.
`Decoder.generate` (a call's prompts, decoded together until every row finishes) and the server's
engine (`bytemtp.serving.engine`: requests `admit`ted and `remove_finished` between passes) both
run this loop, so a change to how a pass is chosen or run is made once.

The plan is re-made after each window's passes (`Window.length`: 16, or 4 where it measures plain
decoding or tries speculation, as `drafting.Arbiter` says) from the newest profile (when the draft adapts) and
whenever what it was made for changes: the batch size it is planned at, whether the rows are all
greedy (only then may passes draft trees), the step. A call plans at its starting size and
greediness (rows that finish leave, the plan stays); a server plans at the batch bucket
(`batch_buckets`) at or above the rows it runs, and at its live rows' greediness. On the compiled
step a server's batch is kept at its bucket's size with placeholder rows (`Batch.pad_to`), so that
its passes run the shapes compiled for the buckets when it started.
"""

from __future__ import annotations

import time
from typing import Protocol


from bytemtp.decoding.batch import Batch, Row
from bytemtp.decoding.calibration import CalibratedCosts
from bytemtp.decoding.drafting import EXPLORE_PASSES, MAX_NODES, AcceptanceProfile, Choice
from bytemtp.decoding.strategy import Draft
from bytemtp.model.kvcache import KVCache
from bytemtp.model.model import ByteMTP
from bytemtp.model.pass_heads import PassHeads



def batch_buckets(max_batch: int) -> list[int]:
    """The batch sizes a server plans at (and measures pass costs at): powers of two up to
    max_batch, and it."""
    return sorted({min(2 ** i, max_batch) for i in range(max_batch.bit_length() + 1)})


class Steps(Protocol):
    """What the loop asks of the decoder (`decode.Decoder`): its model and what its passes run after
    the trunk (`pass_heads`), what passes teach (`profiles`, `calibration`), the plan, and the steps of a
    pass."""

    model: ByteMTP
    pass_heads: PassHeads
    profiles: dict[bool, AcceptanceProfile]
    calibration: CalibratedCosts
    last_choice: Choice | None

    def plan(self, draft: Draft, *, batch_size: int, static: bool, greedy: bool) -> Choice: ...

    def prefill(self, rows: list[Row], cache: KVCache, heads: int) -> None: ...

    def rewarm(self, state: Batch, heads: int) -> None: ...

    def step(self, state: Batch, choice: Choice) -> None: ...

    def emit_next(self, state: Batch, *, heads: int) -> tuple[bool, list[int]]: ...


class Window:
    """The passes of one plan, timed as a whole: the bytes the rows emitted over them, per row live
    when it opened, over the wall time from its plan to the next, its re-warms apart. What a plan really
    delivers, with everything a pass does not time itself (emitting, slides, the loop), so that
    plain decoding is a measured arm (`drafting.Arbiter`); the plan's `passes` run before the next."""

    def __init__(self, state: Batch, choice: Choice, *, lookup: bool = False, greedy: bool = True,
                 t0: float | None = None, slowest: bool = False):
        self.choice, self.length, self.t0 = choice, choice.passes, time.perf_counter() if t0 is None else t0
        self.lookup, self.greedy = lookup, greedy  # whose arbiter it reports to (`PassCosts.arbiter`)
        live = [state.rows[r] for r in state.active if r not in state.finished and not state.rows[r].pad]
        self.rows, self.bytes0 = len(live), sum(len(row.out.data) for row in state.rows)
        self.slowest, self.starts = slowest, [(row, len(row.out.data)) for row in live]
        self.passes, self.rewarm_s, self.compile_s0 = 0, 0.0, state.compile_s
        self.stopped = False  # a try ended early, having spent its budget: judged as a try all the same

    def lost(self, state: Batch) -> float:
        """Seconds a try has lost so far against plain decoding of the bytes it emitted (0: not a
        try, or plain decoding not measured yet): what `Arbiter.may_go_on` weighs after each pass."""
        if state.costs is None or self.length != EXPLORE_PASSES or not self.choice.speculates(self.lookup):
            return 0.0
        plain = state.costs.arbiter(self.lookup, self.greedy).plain
        if plain is None or not self.rows:
            return 0.0
        return time.perf_counter() - self.t0 - (state.compile_s - self.compile_s0) - self.emitted(state) / plain

    def emitted(self, state: Batch) -> float:
        """Bytes a row emitted since the window opened: on average, or (`slowest`: a call, which
        ends when its last row does) those of the row that emitted least among the rows still
        decoding, so that speculation is judged on the rows it helps least, not on the rows it
        finishes early (at batch 8 on the demo's tuned model, judged on the average, auto ran
        4-head passes that left the slowest rows behind: 0.83x plain decoding)."""
        going = [len(row.out.data) - n for row, n in self.starts if not row.out.stats.stopped_by]
        if self.slowest and going:
            return min(going)
        return (sum(len(row.out.data) for row in state.rows) - self.bytes0) / self.rows

    def close(self, state: Batch) -> None:
        """Record what the window delivered in the batch's costs' arbiter, the seconds of passes that
        compiled a shape apart (so that a try that compiled is judged on its other passes, never
        left unjudged to be tried again at once); a window of fewer than 4 passes (a call's last
        few) counts in the arbiter's balance only; nothing for one whose every pass compiled."""
        compile_s = state.compile_s - self.compile_s0
        seconds = time.perf_counter() - self.t0 - self.rewarm_s - compile_s
        if state.costs is None or not self.passes or not self.rows or seconds <= 0:
            return
        state.costs.arbiter(self.lookup, self.greedy).record(
            speculative=self.choice.speculates(self.lookup), rate=self.emitted(state) / seconds, seconds=seconds,
            rewarm_s=self.rewarm_s, trial=self.length == EXPLORE_PASSES, short=self.passes < 4 and not self.stopped)


class Loop:
    """One batch's decoding, pass by pass (see the module docstring). `rows` are prefilled
    together; `greedy` fixes the plan's greediness (a call: whether all its rows are greedy; None:
    the live rows', as a server's); `buckets` plans at the bucket at or above the rows the batch
    runs (a server) instead of at its starting size. `static`: the passes run the compiled step."""

    def __init__(self, decoder: Steps, draft: Draft, rows: list[Row], *, static: bool,
                 greedy: bool | None = None, buckets: list[int] | None = None):
        model = decoder.model
        n = model.config.n_future
        self.decoder, self.draft, self.greedy, self.buckets = decoder, draft, greedy, buckets
        # adapting: whole windows (prompt, slide) run every head, so a re-warm runs only plain passes' bytes
        self.full = n if draft.adapts(True if greedy is None else greedy) else draft.heads
        self.size = len(rows)  # the size a call plans at
        first = self.full if buckets is not None else self._prompt_heads(static)
        cache = KVCache.for_model(model, batch_size=len(rows), max_len=model.config.seq_len + MAX_NODES)
        self.state = Batch(rows, cache, warm=first, n_future=n, profiles=decoder.profiles, costs=None,
                           static=static)
        self.choice: Choice | None = None
        self._planned: tuple | None = None  # (size, greedy) the choice was made for
        self.window: Window | None = None  # the passes of the current plan, timed as a whole
        self.owed: list[tuple[float, int, int]] = []  # prefills of more than one head: (seconds, heads, nodes)
        if rows:
            self._prefill(rows, cache, first)

    def _prefill(self, rows: list[Row], cache: KVCache, heads: int) -> None:
        """Prefill rows (`Decoder.prefill`); one of more heads than plain decoding runs is owed to the
        arbiter (`_charge`), as speculation's cost."""
        t0 = time.perf_counter()
        self.decoder.prefill(rows, cache, heads)
        if heads > 1:
            self.owed.append((time.perf_counter() - t0, heads, max(cache.lengths)))
        self._charge()

    def _charge(self) -> None:
        """Charge the batch's arbiter what prefills of more heads than one cost beyond one head's (by
        the pass costs' ratio at their size), once the costs are known."""
        state = self.state
        if state.costs is None or not self.owed:
            return
        greedy = self.greedy if self.greedy is not None else state.greedy
        arbiter = state.costs.arbiter(self.draft.lookup, greedy)
        for seconds, heads, nodes in self.owed:
            arbiter.charge(seconds * (1 - state.costs(1, nodes) / state.costs(heads, nodes)))
        self.owed = []

    def _prompt_heads(self, static: bool) -> int:
        """The heads a call's prompts run: every head the draft may use (a later re-warm then runs
        only plain passes' bytes), but one where its costs' arbiter holds speculation back (plain
        decoding delivered more, or has not been measured yet), so that a call that decodes plain
        pays a plain prefill."""
        costs = self.decoder.calibration.for_run(self.size, static=static)
        if costs is None or not self.draft.adapts(True if self.greedy is None else self.greedy):
            return self.full
        arbiter = costs.arbiter(self.draft.lookup, True if self.greedy is None else self.greedy)
        return self.full if arbiter.winning else 1

    # --- rows joining and leaving (a server's batch) ---------------------------------------------

    def admit(self, rows: list[Row]) -> None:
        """Add rows to the batch, each prefilled with every head the draft may use into a new
        cache row of its own (their first bytes come out at the next `emit`)."""
        state = self.state
        for b, row in zip(state.add(rows, warm=self.full), rows):
            view = state.cache.row(b)
            self._prefill([row], view, self.full)  # every head: a later re-warm runs less
            state.cache.lengths[b] = view.lengths[0]
            state.cache.doc_starts[b] = view.doc_starts[0]
        self._pad()

    def remove_finished(self) -> list[Row]:
        """Drop the finished rows from the batch (`Batch.remove_finished`); the rows dropped."""
        gone = self.state.remove_finished()
        if gone:
            self._pad()
        return gone

    def _pad(self) -> None:
        if self.state.static and self.buckets is not None and self.state.rows:
            self.state.pad_to(self._bucket(), n_future=self.decoder.model.config.n_future)

    def _bucket(self) -> int:
        live = sum(not self.state.rows[r].pad for r in self.state.active)
        return next(b for b in self.buckets if b >= live)

    # --- the cycle -------------------------------------------------------------------------------

    def emit(self) -> bool:
        """Emit each row's next byte (`Decoder.emit_next`), noting the rows whose windows slid; False
        when every row is finished. A slide runs the heads of the passes now (the warm ones): a
        later plan that wants more re-warms the window then, so a call that has settled on few heads
        (or on plain decoding) does not pay for all of them at every slide (at batch 8 on the
        compiled step, slides of all 8 transformer heads made the automatic draft 0.77x plain while
        it ran plain passes). Heads whose caches stay whole whatever a pass runs (draft heads, which
        keep none: `PassHeads.whole_after`) slide with every head the draft may use."""
        state = self.state
        # the warm heads, and those up to `full` whose caches stay whole anyway (`PassHeads.whole_after`)
        heads = max(state.warm, min(self.full, self.decoder.pass_heads.whole_after(state.warm)))
        going, slid = self.decoder.emit_next(state, heads=heads)
        for r in slid:
            state.stale.slid(r, heads=heads)
        return going

    def advance(self) -> None:
        """One pass over the batch: plan, re-warm what the plan needs, then draft, forward, verify
        and accept (`Decoder.step`), marking the heads whose caches the pass left stale."""
        state = self.state
        state.drop_finished()
        choice = self.plan()
        if choice.heads > state.warm:  # more heads than have complete caches: complete them
            t0 = time.perf_counter()
            self.decoder.rewarm(state, choice.heads)
            self.window.rewarm_s += time.perf_counter() - t0  # what switching to speculation cost
        starts = {r: state.cache.lengths[b] for b, r in enumerate(state.active)}
        self.decoder.step(state, choice)
        whole = self.decoder.pass_heads.whole_after(state.warm)  # heads past these lack the pass's keys
        for r, start in starts.items():
            state.stale.passed(r, heads=whole, start=start)

    def close(self) -> None:
        """The call's last window into the arbiter (`Window.close`: a short one counts in its balance)."""
        if self.window is not None and self.state.costs is not None:
            self.window.close(self.state)
            self.window = None

    def plan(self) -> Choice:
        """The draft of the next pass: re-planned after each window's passes when the draft adapts,
        and whenever the size or greediness it is planned at changes (then the batch's passes
        calibrate the costs of that size)."""
        state, decoder = self.state, self.decoder
        size = self.size if self.buckets is None else self._bucket()
        greedy = self.greedy if self.greedy is not None else state.greedy
        key = (size, greedy)
        lost = 0.0 if self.window is None else self.window.lost(state)  # a try stops when it has spent its budget
        if lost > 0 and not state.costs.arbiter(self.draft.lookup, greedy).may_go_on(lost):
            self.window.stopped = True
        ended = self.window is not None and (self.window.passes >= self.window.length or self.window.stopped)
        if self.choice is None or key != self._planned or ended and self.draft.adapts(greedy):
            if self.window is not None and key == self._planned:
                self.window.close(state)
            t0 = time.perf_counter()  # the plan is the next window's: choosing a draft costs what it chose
            self.choice = decoder.last_choice = decoder.plan(self.draft, batch_size=size, static=state.static,
                                                             greedy=greedy)
            if key != self._planned:  # after the plan, which measures the costs the first time (charged apart)
                state.costs = decoder.calibration.for_run(size, static=state.static)
                self._planned = key
                self._charge()
                t0 = time.perf_counter()
            self.window = Window(state, self.choice, lookup=self.draft.lookup, greedy=greedy, t0=t0,
                                 slowest=self.buckets is None)
        self.window.passes += 1
        return self.choice
