"""Decoding: plain one-byte-per-pass decoding (the reference) and self-speculative decoding.

`generate` is the reference: one prompt, one byte per forward pass, greedy or sampled (temperature,
top-k, top-p; the row's key drawn from a seeded `torch.Generator`, each byte by its position:
`sampling`), until EOS, a stop string or `max_bytes`.

`Decoder` is the fast path for many prompts at once: the pass cycle (`loop.Loop`, which the server's
engine runs too) over small named steps, in the manner of gpt-fast. What a pass runs after the trunk
is the model's `PassHeads` (`pass_heads`: the heads stacked, one by one, or head 1 and the draft
heads), which the decoder asks and never tells apart. `prefill` runs the prompts (`rewarm`, a partial
prefill, runs again what heads a plan needs lack) and `propose` takes each row's next byte and the
heads' candidates; a pass (`step`) lays them out as a chain or tree (`draft`, as far as each row
`offers`), runs them (`forward`, then `after_picks` for heads that follow the pass's picks), says
which path survives (`verify`: greedy along head 1, sampled drafts by `sampling.accept_drafts`) and
`accept`s it (its bytes, its cache slots; the batch learns from it, `Batch.learn`); `emit_next`
emits the next byte, sliding full windows. Rows may also draft prompt-lookup bytes
(`lookup.lookup_pass`: greedy rows, a `Draft` with lookup) in place of their heads' top-rank chain,
the pass's chain deepened where that pays; the verification is the same, so greedy output does not
change. How it drafts is a `strategy.Draft`; one that adapts has its heads and tree chosen (`plan`)
from what a pass costs here (`calibration`, timed by `measure_pass_costs` on the decoder's own step)
and how often each head has been right (`drafting`), so speculation does not cost more than it
returns (untrained heads: plain decoding). Passes run eagerly or, where compiling pays
(`compiled.CompilePolicy`), on the compiled static step. Greedy output equals plain greedy output;
sampled output equals plain sampled output with the same key (a row's draws go by output position,
on chains), so it has exactly the model's distribution and a seed repeats it whatever the plan.

Generation starts a new document: the prompt is preceded by EOS, as every document is in the packed
training stream. The model never emits BOS, PAD or the padding ids above them; EOS ends the output and
is not part of it. Generation is not limited by the context: when the next prediction would need more
than `seq_len` positions, the window slides (the newest half of the context is kept and run through the
model again), by one rule (`window_start`) that plain and speculative decoding share, so their greedy
outputs stay equal.

Exactness: greedy speculative output equals plain greedy output wherever a verify pass over T bytes
computes the same next-byte choices as T one-byte passes; in float32 and float64 they differ only at
exact ties, in bf16 rounding can flip a choice. Plain and speculative decoding of a batch share one
prefill, so comparing them never mixes in the batch's own rounding.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from bytemtp.decoding.batch import Batch, Row
from bytemtp.decoding.calibration import CalibratedCosts
from bytemtp.decoding.compiled import Compile, CompilePolicy
from bytemtp.decoding.drafting import TREE_RANKS, AcceptanceProfile, Choice, DraftTree, PassCosts, choose
from bytemtp.decoding.generation import DecodeStats, Generation, Output, as_bytes, as_prompt_list
from bytemtp.decoding.lookup import LookupProfile, lookup_pass
from bytemtp.decoding.picks import Picks, pass_picks
from bytemtp.decoding.sampling import Sampling, accept_drafts, allowed_mask, next_byte
from bytemtp.decoding.strategy import Draft
from bytemtp.decoding.loop import Loop
from bytemtp.model.kvcache import KVCache, context_left, window_start
from bytemtp.model.layout import build_layout
from bytemtp.model.model import ByteMTP
from bytemtp.model.pass_heads import PassHeads
from bytemtp.model.transfer import to_device
from bytemtp.vocab import EOS


@torch.inference_mode()
def generate(model: ByteMTP, prompt: bytes | str, *, max_bytes: int, sampling: Sampling | None = None,
             stop: tuple[bytes, ...] = (), on_bytes: Callable[[bytes], None] | None = None) -> Generation:
    """Plain decoding, one byte per forward pass, until EOS, a stop string or max_bytes: the
    reference that `Decoder` is tested against (the window slides by `window_start`). A str
    prompt is encoded as UTF-8."""
    prompt, stop = as_bytes(prompt), tuple(as_bytes(s) for s in stop)
    sampling = sampling or Sampling()
    t0 = time.perf_counter()
    vocab = model.vocab
    out = Output(DecodeStats(), max_bytes=max_bytes, stop=stop, on_bytes=on_bytes, pieces=vocab.pieces)
    prompt = prompt if vocab.is_bytes else vocab.encode(prompt)
    if max_bytes == 0:
        out.stats.stopped_by = "max_bytes"
        return out.result(t0)
    device, seq_len = model.embed.weight.device, model.config.seq_len
    tokens = [EOS, *prompt]
    cache = KVCache.for_model(model, batch_size=1)
    start = window_start(len(tokens), 0, seq_len)
    ids = torch.tensor([tokens[start:]], device=device)
    logits = model.logits(ids, cache, heads=1, layout=build_layout(model, ids, cache))[0, -1, 0]
    out.stats.forward_passes = 1
    key = None if sampling.greedy else sampling.draw_key()  # a sampled byte is a function of it and its position
    vocab_size = model.config.vocab_size
    while not out.emit(byte := next_byte(logits, sampling, key=key, at=len(out.data), vocab_size=vocab_size)):
        tokens.append(byte)
        moved = window_start(len(tokens), start, seq_len)
        if moved != start:  # slide: run the newest part of the context again
            start = moved
            cache.reset()
            ids = torch.tensor([tokens[start:]], device=device)
        else:
            ids = torch.tensor([[byte]], device=device)
        logits = model.logits(ids, cache, heads=1, layout=build_layout(model, ids, cache))[0, -1, 0]
        out.stats.forward_passes += 1
    return out.result(t0)


class Decoder:
    """Self-speculative decoding of one loaded model (see the module docstring).

    Made once per model and reused: what its passes run after the trunk is made once (`pass_heads`,
    `ByteMTP.decode_heads`: the heads stacked, or one by one with stacked=False, the reference;
    head 1 and the draft heads where the model has them), what a pass costs is measured once per
    batch size (`pass_costs`, kept in `calibration`), and the heads' acceptance is tracked across
    calls. `confidence` (0: off) ends a greedy row's draft of the heads where the probability that
    its top chain is right so far, as the heads' own distributions say, falls below it, and a pass
    whose rows all end early runs fewer nodes. `costs` gives the pass costs instead of measuring
    them (tests). `compile` says when the passes run the compiled static step: on, off, or auto
    (when a call's work repays compiling); `policy` (a `compiled.CompilePolicy`) applies it and
    holds the step.
    """

    def __init__(self, model: ByteMTP, *, stacked: bool = True, costs: PassCosts | None = None,
                 compile: Compile | str | bool = Compile.AUTO, confidence: float = 0.0):
        if not 0.0 <= confidence <= 1.0:
            raise ValueError(f"confidence={confidence} is not allowed; expected 0 <= confidence <= 1 (0: off)")
        self.model, self.confidence = model, confidence
        self.pass_heads: PassHeads = model.decode_heads(stacked=stacked)
        n = model.config.n_future
        self.profiles = {True: AcceptanceProfile(n), False: AcceptanceProfile(n, ranks=1)}  # by greedy
        self.lookups = LookupProfile()  # how often prompt-lookup drafts are accepted
        self.calibration = CalibratedCosts(self.pass_heads, given=costs)
        self.policy = CompilePolicy(model, self.pass_heads, compile)
        self.last_choice: Choice | None = None
        self.device = model.embed.weight.device

    def pass_costs(self, batch_size: int, *, static: bool = False) -> PassCosts:
        """Seconds per pass for k heads over T nodes at this batch size, eager or compiled
        (`CalibratedCosts.costs`: measured on this decoder's step, or recorded by an earlier process)."""
        return self.calibration.costs(self, batch_size, static=static)

    def plan(self, draft: Draft, *, batch_size: int, static: bool, greedy: bool) -> Choice:
        """The heads and tree of the next passes, and how many run before the next plan: the
        draft's fixed chain, or (one that adapts) the best by the newest profile and the costs of
        the batch as it started (rows that finish leave), speculating or not as the costs' arbiter
        says where the passes calibrate them (`drafting.Arbiter`: on what each arm delivered)."""
        if not draft.adapts(greedy):
            return Choice(draft.heads, DraftTree.chain(draft.heads - 1), 0.0, 0.0)
        costs = self.pass_costs(batch_size, static=static)
        calibrated = self.calibration.for_run(batch_size, static=static) is not None
        arbiter = costs.arbiter(draft.lookup, greedy) if calibrated else None
        return choose(self.profiles[greedy], costs, max_heads=self.model.config.n_future, tree=draft.trees(greedy),
                      heads=draft.heads, arbiter=arbiter, lookup=draft.lookup)

    # --- a call ----------------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(self, prompts: list[bytes | str], *, max_bytes: int, draft: Draft | str = Draft(),
                 sampling: Sampling | None = None, stop: tuple[bytes, ...] = (),
                 on_bytes: Callable[[int, bytes], None] | None = None,
                 cancel: Callable[[], bool] | None = None) -> list[Generation]:
        """Decode many prompts at once, drafting as `draft` says (a `Draft` or its name: by
        default the heads and the draft are chosen each pass; "plain" decodes one byte a pass).

        Each row accepts its own number of bytes per pass and leaves the batch when it
        finishes; every row equals that row decoded alone. `on_bytes(row, piece)` streams.
        `cancel()`, asked before every pass, ends decoding when it returns True: each row keeps
        what it has, stopped by "interrupted" (a Ctrl-C handler sets it). Prompts and stop
        strings may be bytes or str (encoded as UTF-8).
        """
        prompts, stop = as_prompt_list(prompts), tuple(as_bytes(s) for s in stop)
        draft = (Draft.parse(draft) if isinstance(draft, str) else draft).for_model(self.model.config.n_future)
        t0 = time.perf_counter()
        rows = Row.for_prompts(prompts, self.model.vocab, sampling or Sampling(), max_bytes=max_bytes, stop=stop,
                               depths=draft.max_depth(self.model.config.n_future), lookup=draft.lookup,
                               on_bytes=on_bytes)
        if rows and max_bytes != 0:  # (0: finished before a pass, `Row.for_prompts`)
            greedy = all(row.sampling.greedy for row in rows)
            loop = Loop(self, draft, rows, static=self.policy.use(len(rows), max_bytes), greedy=greedy)
            while loop.emit():
                if cancel is not None and cancel():
                    loop.state.interrupt()
                    break
                loop.advance()
            loop.close()
        return [row.out.result(t0) for row in rows]

    # --- the steps of a pass ---------------------------------------------------------------------

    def step(self, state: Batch, choice: Choice) -> None:
        """One speculative pass over the batch: draft, forward, verify, then accept (or propose
        anew) row by row; its time calibrates the pass costs (under automatic choice; a re-warm
        before it is the loop's window's, `loop.Window`)."""
        t0 = time.perf_counter()
        cache = state.cache
        k = min(choice.heads, state.warm)  # heads whose caches are complete can run
        batch = [state.rows[r] for r in state.active]
        tree, offered, used = offers(state, batch, choice.tree.truncated(state.warm - 1), heads=k, lookup=choice.lookup,
                                     seq_len=self.model.config.seq_len, lookups=self.lookups, confidence=self.confidence,
                                     costs=lambda: self.pass_costs(len(state.rows), static=state.static))
        starts, ats = list(cache.lengths), [len(row.out.data) for row in batch]  # the next byte is out
        live = [row for r, row in zip(state.active, batch) if r not in state.finished]
        logits, states, greedy = self.forward(self.draft(batch, tree), tree, cache, heads=k, static=state.static,
                                              rows=live)
        cache.rewind(tree.T)
        logits, greedy = self.pass_heads.finish(logits, states, greedy, heads=k,
                                                first=lambda lg, gr: self.first_picks(lg, batch, ats, gr),
                                                after=self.policy.static.drafts_at if state.static else None)
        picks = self.read_picks(logits, batch, ats, live, heads=k, greedy=greedy)  # the pass's one transfer
        verdicts = verify(picks, state, batch, tree, offered)
        layers = self.pass_heads.layers_written(k)
        for b, (r, row) in enumerate(zip(state.active, batch)):
            if r in state.finished:
                continue
            path, nxt = verdicts[b]
            n_out = len(row.out.data)
            run = state.learn(row, path, nxt, tree, offered=offered[b], lookup=used[b], heads=k, lookups=self.lookups)
            done = self.accept(row, b, path, tree, cache, start=starts[b], layers=layers, offered=offered[b])
            if run is not None:  # the lookup bytes output (a stop string or EOS may end them)
                row.stats.lookup_accepted += min(run, len(row.out.data) - n_out)
            if done:
                state.finished.add(r)
                continue
            self.propose(row, picks, b, path[-1], nxt)
        state.warm = k  # the heads whose candidates the rows hold
        if state.static and self.policy.static.last_was_new:  # compiling: not a cost, nor a rate
            state.compile_s += time.perf_counter() - t0
        elif state.costs is not None:  # what it delivered is measured over the loop's windows (`loop.Window`)
            state.costs.observe(k, tree.T, time.perf_counter() - t0)

    def prefill(self, rows: list[Row], cache: KVCache, heads: int) -> None:
        """Run each row's window (EOS + prompt, or its newest part) through the model from the
        cache's start, and take the next byte and the heads' candidates at its last position."""
        seq_len = self.model.config.seq_len
        for row in rows:
            row.start = window_start(len(row.tokens()), row.start, seq_len)
        windows = [row.tokens()[row.start:] for row in rows]
        cache.lengths = [0] * len(rows)
        self.run_windows(rows, cache, windows, heads=heads, ends=[len(w) for w in windows])

    def rewarm(self, state: Batch, heads: int) -> None:
        """A partial prefill: run again, in one pass over the batch, the positions that heads
        1..`heads` lack in the live rows' caches (`Batch.stale`), and take the heads' candidates
        after each row's next byte (out already, so it stays) anew, so that passes of `heads`
        heads can run. Finished rows are fed EOS (with EOS drafts, never accepted)."""
        cache, stale, ends = state.cache, state.stale, list(state.cache.lengths)
        live = [(b, r) for b, r in enumerate(state.active) if r not in state.finished]
        missing = [ends[b] - p for b, r in live if (p := stale.missing_from(r, heads)) is not None]
        n = max(ends) if self.model.config.doc_mask else max([1, *missing])  # document masks: run all
        cache.lengths = [max(0, end - n) for end in ends]
        windows = [[EOS] * (end - start) for end, start in zip(ends, cache.lengths)]
        for b, r in live:  # the cache's tokens (the next byte is out)
            row = state.rows[r]
            windows[b] = row.tokens()[row.start:-1][cache.lengths[b]:]
        for r in set(state.active) & state.finished:
            state.rows[r].cand += [[EOS] * TREE_RANKS] * (heads - 1 - len(state.rows[r].cand))
        self.run_windows([state.rows[r] for r in state.active], cache, windows, heads=heads, ends=ends,
                         live=[b for b, _ in live], next_out=True)
        for _, r in live:
            stale.warmed(r, heads)
        state.warm = heads

    def run_windows(self, rows: list[Row], cache: KVCache, windows: list[list[int]], *, heads: int,
                    ends: list[int], live: list[int] | None = None, next_out: bool = False) -> None:
        """Run each cache row's window after its cache (`cache.lengths`), right-padded into one batch,
        leave the cache at `ends`, and propose for the rows (those at the indices `live`, by default
        all) from their window's last position: their next byte (unless it is out already,
        `next_out`) and the heads' candidates after it."""
        width = max(len(w) for w in windows)
        ids = to_device([w + [EOS] * (width - len(w)) for w in windows], self.device)
        t0 = time.perf_counter()
        logits = self.pass_heads.logits(ids, cache, heads=heads, layout=build_layout(self.model, ids, cache),
                                   last=[max(0, len(w) - 1) for w in windows])  # (B, 1, K, V)
        seconds = time.perf_counter() - t0
        cache.lengths = ends
        if live is not None:
            rows, logits = [rows[b] for b in live], logits.index_select(0, to_device(live, logits.device))
        if rows:
            self.propose_all(rows, logits, next_out=next_out, ats=[len(row.out.data) - next_out for row in rows])
        for row in rows:
            row.stats.forward_passes += 1
            row.stats.step_s += seconds  # the model's own time, as a pass's step

    def propose_all(self, rows: list[Row], logits_B1KV: torch.Tensor, *, next_out: bool, ats: list[int]) -> None:
        """`propose` for each row from the logits at its last position (B, 1, K, V), read in one
        transfer: head 1's pick there (the byte at output position `ats[b]`) unless the row's next
        byte is out already (`next_out`), and the heads' candidates after it."""
        picks = self.read_picks(logits_B1KV, rows, ats, rows, heads=logits_B1KV.shape[2])
        for b, row in enumerate(rows):
            self.propose(row, picks, b, 0, row.nxt if next_out else None)

    def read_picks(self, logits_BTKV: torch.Tensor, rows: list[Row], ats: list[int], live: list[Row], *,
                   heads: int, greedy: torch.Tensor | None = None) -> Picks:
        """What the logits say at every node (`picks.pass_picks`: each row by its own sampling; the
        `greedy` picks the compiled step made in its graph, where it ran), brought to the host in
        one transfer counted in the `live` rows' statistics."""
        vocab_size = self.model.config.vocab_size
        table = pass_picks(logits_BTKV, rows, ats, allowed_mask(logits_BTKV, vocab_size), confidence=self.confidence,
                           greedy_BTW=greedy, vocab_size=vocab_size)
        return Picks.read(table, live, heads=heads, confident=self.confidence > 0)

    def propose(self, row: Row, picks: Picks, b: int, node: int, nxt: int | None = None) -> None:
        """The row's next byte (head 1's pick at `node`, unless verification already made it) and
        the heads' candidates after it, from the pass's picks (`picks.Picks`): a greedy row's
        ranked ids, a sampled row's one draft a head, each drawn with the noise of the output
        position it is for. With `confidence`, a greedy row also notes how deep its drafts stay
        sure enough (`Row.sure`)."""
        row.nxt = picks.pick(b, node) if nxt is None else nxt
        cands = picks.cands(b, node)
        if row.sampling.greedy:
            row.cand = cands
            if self.confidence:
                row.sure = picks.sure(b, node)
        else:
            row.cand = [c[:1] for c in cands]

    def draft(self, rows: list[Row], tree: DraftTree) -> torch.Tensor:
        """The ids of one pass (B, T): each row's next byte and its candidates laid out as the tree."""
        if tree.T == 1:
            return to_device([[row.nxt] for row in rows], self.device)
        nodes = list(zip(tree.depths[1:], tree.ranks[1:]))
        return to_device([[row.nxt] + [row.cand[d - 1][r] for d, r in nodes] for row in rows], self.device)

    def forward(self, ids_BT: torch.Tensor, tree: DraftTree, cache: KVCache, *, heads: int, static: bool,
                rows: list[Row] = ()) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """What one pass of the tree after each row's cache (which it advances) runs before its picks
        (`PassHeads.in_pass`): the logits (B, T, j, V) of its first j heads and the states the others
        follow from, with the greedy picks the compiled static step made in its graph (None when
        the pass ran eagerly, with the layout built here). The seconds of the step itself (the
        compiled call, or the eager model) go into the `rows`' statistics (`step_s`)."""
        chain = tree.is_chain
        greedy = None
        if static:
            step = self.policy.static
            logits = step(ids_BT, cache, heads=heads, depths=None if chain else tree.depths,
                          ancestors=None if chain else tree.ancestors)
            states, greedy, seconds = step.states, step.picks, step.last_s
        else:
            model, t0 = self.model, time.perf_counter()
            layout = build_layout(model, ids_BT, cache, depths=None if chain else list(tree.depths),
                                  ancestors=None if chain else tree.ancestors, drafts=True)
            logits, states = self.pass_heads.run_pass(ids_BT, cache, heads=heads, layout=layout)
            seconds = time.perf_counter() - t0
        for row in rows:
            row.stats.step_s += seconds
        return logits, states, greedy

    def first_picks(self, logits_BTJV: torch.Tensor, rows: list[Row], ats: list[int],
                    greedy: torch.Tensor | None) -> torch.Tensor:
        """Head 1's pick at every node of a pass (B, T), each row by its own sampling (the compiled
        step's greedy picks where it made them): what `PassHeads.finish` reads the heads after the
        graph's from."""
        vocab_size = self.model.config.vocab_size
        return pass_picks(logits_BTJV, rows, ats, allowed_mask(logits_BTJV, vocab_size), greedy_BTW=greedy,
                          vocab_size=vocab_size)[..., 0]

    def accept(self, row: Row, b: int, path: list[int], tree: DraftTree, cache: KVCache, *,
               start: int, layers: int, offered: int) -> bool:
        """Emit the accepted drafts (until the output ends), count them, record what the heads
        got right, and keep the path's cache slots; True when the row is finished."""
        stats = row.stats
        stats.forward_passes += 1
        emitted, done = 0, False
        for node in path[1:]:
            byte = row.cand[tree.depths[node] - 1][tree.ranks[node]]
            done = row.out.emit(byte)
            emitted += byte != EOS
            if done:
                break
        for depth in range(1, offered + 1):
            stats.count(depth, used=depth <= emitted)
        if not tree.is_chain:  # a chain's path is in place already
            cache.compact(b, [start + node for node in path], layers=layers)
        cache.lengths[b] = start + len(path)
        return done

    def emit_next(self, state: Batch, *, heads: int) -> tuple[bool, list[int]]:
        """Emit each row's next byte, sliding the windows that are full (a slide runs the row's
        newest context again with `heads` heads, which chooses its next byte anew: the rows that
        slide together run in one pass); False when all are finished, and the rows (by index in
        `state.rows`) whose windows slid."""
        seq_len, rows, finished = self.model.config.seq_len, state.rows, state.finished
        going, slid = list(enumerate(state.active)), []
        while going:
            sliding = []
            for b, r in going:
                row = rows[r]
                if r in finished:
                    continue
                if row.out.emit(row.nxt):
                    finished.add(r)
                elif row.n_tokens > seq_len and (moved := window_start(row.n_tokens, row.start, seq_len)) != row.start:
                    row.start = moved
                    row.stats.slides += 1
                    sliding.append((b, r))
            if sliding:
                view = state.cache.rows([b for b, _ in sliding])
                self.prefill([rows[r] for _, r in sliding], view, heads)
                state.cache.take_back(view, [b for b, _ in sliding])
                slid += [r for _, r in sliding]
            going = sliding
        return len(finished) < len(rows), slid


def offers(state: Batch, batch: list[Row], tree: DraftTree, *, heads: int, seq_len: int, lookups: LookupProfile,
           confidence: float, costs: Callable[[], PassCosts], lookup: bool = True) -> tuple[DraftTree, list[int], list]:
    """A pass's tree, the depth of drafts each row offers (what max_bytes and its window leave, and
    with `confidence` what its heads are sure of) and each row's prompt-lookup draft, if any and
    if the plan lets rows draft them (`lookup`: not the arbiter's plain arm), (`lookup.lookup_pass`,
    which may deepen the tree; `costs` gives the pass costs it weighs)."""
    limits = [0 if r in state.finished else
              min(row.out.bytes_left(), context_left(row.n_tokens, row.start, seq_len))
              for r, row in zip(state.active, batch)]
    offered, used = [min(tree.depth, limit) for limit in limits], [None] * len(batch)
    if lookup and any(row.lookup for row in batch):
        tree, offered, used = lookup_pass(state, batch, tree, limits, heads=heads, lookups=lookups, costs=costs)
    if confidence:  # a greedy row's heads' drafts end where they stop being sure; the pass with them
        offered = [o if u is not None or not row.sampling.greedy else min(o, row.sure)
                   for o, u, row in zip(offered, used, batch)]
        if max(offered, default=0) < tree.depth and all(u is None for u in used):
            tree = tree.truncated(max(offered, default=0))
    return tree, offered, used


def verify(picks: Picks, state: Batch, rows: list[Row], tree: DraftTree,
           offered: list[int]) -> list[tuple[list[int], int]]:
    """For each row of a pass: the accepted path (node indices from the root) and the byte after it.
    A greedy row accepts a child whose byte is head 1's choice at its parent and whose depth is
    within what the row may use (`offered`); a sampled row (a chain: a batch with a sampled row
    drafts chains) accepts its drafts while each equals head 1's pick by position
    (`sampling.accept_drafts`). Rows finished or placeholders are not verified."""
    kids, out = tree.children, []
    for b, (r, row) in enumerate(zip(state.active, rows)):
        if r in state.finished:
            out.append(([0], EOS))
        elif row.sampling.greedy:
            path, node = [0], 0
            while True:
                want = picks.pick(b, node)
                nxt = next((c for c in kids[node] if tree.depths[c] <= offered[b]
                            and row.cand[tree.depths[c] - 1][tree.ranks[c]] == want), None)
                if nxt is None:
                    break
                path.append(nxt)
                node = nxt
            out.append((path, picks.pick(b, node)))
        else:
            n = offered[b]
            n_ok, nxt = accept_drafts([picks.pick(b, t) for t in range(n + 1)], [c[0] for c in row.cand[:n]])
            out.append((list(range(n_ok + 1)), nxt))
    return out
