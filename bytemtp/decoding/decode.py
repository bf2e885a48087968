"""Decoding: plain one-byte-per-pass decoding (the reference) and self-speculative decoding.

`generate` is the reference: one prompt, one byte per forward pass, greedy or sampled (temperature,
top-k, top-p; the row's key drawn from a seeded `torch.Generator`, each byte by its position:
`sampling`), until EOS, a stop string or `max_bytes`.

`Decoder` is the fast path for many prompts at once: the pass cycle (`loop.Loop`, which the server's
engine runs too) over small named steps, in the manner of gpt-fast. `prefill` runs the prompts and `propose` takes each row's next byte
and the heads' candidates; a pass (`step`) lays them out as a chain or tree (`draft`), runs them
(`forward`), says which path survives (`verify`: `verify_greedy`, or `verify_sampled` on chains) and
`accept`s it (its bytes, its cache slots; the acceptance profile learns); `emit_next` emits the next
byte, sliding full windows. Rows may also draft prompt-lookup bytes (`lookup.lookup_pass`: greedy
rows, a `Draft` with lookup) in place of their heads' top-rank chain, the pass's chain deepened
where that pays; the verification is the same, so greedy output does not change. How it drafts is a `strategy.Draft`; one that adapts has its heads and tree
chosen (`plan`) from what a pass costs here (`calibration`, timed by `measure_pass_costs` on the
decoder's own step) and how often each head has been right (`drafting`), so speculation does not cost
more than it returns (untrained heads: plain decoding). Passes run eagerly or, where compiling pays
(`compiled.CompilePolicy`), on the compiled static step. Greedy output equals plain greedy output;
sampled output equals plain sampled output with the same key (a row's draws go by output position,
`sampling.verify_sampled`, on chains), so it has exactly the model's distribution and a seed
repeats it whatever the plan.

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
from bytemtp.decoding.calibration import CalibratedCosts, measure_pass_costs
from bytemtp.decoding.compiled import NODE_BUCKETS, Compile, CompilePolicy
from bytemtp.decoding.drafting import MAX_NODES, AcceptanceProfile, Choice, DraftTree, PassCosts, choose
from bytemtp.decoding.generation import DecodeStats, Generation, Output, SpeculativeStats, as_bytes, as_prompt_list
from bytemtp.decoding.lookup import LookupProfile, accepted_run, lookup_pass
from bytemtp.decoding.picks import Picks, pass_picks
from bytemtp.decoding.sampling import Sampling, accept_drafts, allowed_mask, next_byte
from bytemtp.decoding.strategy import Draft
from bytemtp.decoding.loop import Loop
from bytemtp.model.kvcache import KVCache, context_left, window_start
from bytemtp.model.layout import build_layout
from bytemtp.model.model import ByteMTP
from bytemtp.runtime.devices import to_device
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
    while not out.emit(byte := next_byte(logits, sampling, key=key, at=len(out.data))):
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

    Made once per model and reused: the heads are stacked once (`ByteMTP.stack_heads`), what a
    pass costs is measured once per batch size (`pass_costs`, kept in `calibration`), and the
    heads' acceptance is tracked across calls. `confidence` (0: off) ends a greedy row's draft of
    the heads where the probability that its top chain is right so far, as the heads' own
    distributions say, falls below it, and a pass whose rows all end early runs fewer nodes.
    `costs` gives the pass costs instead of measuring them (tests). `compile` says when the passes
    run the compiled static step: on, off, or auto (when a call's work repays compiling); `policy`
    (a `compiled.CompilePolicy`) applies it and holds the step.
    """

    def __init__(self, model: ByteMTP, *, stacked: bool = True, costs: PassCosts | None = None,
                 compile: Compile | str | bool = Compile.AUTO, confidence: float = 0.0):
        if not 0.0 <= confidence <= 1.0:
            raise ValueError(f"confidence={confidence} is not allowed; expected 0 <= confidence <= 1 (0: off)")
        self.model, self.confidence = model, confidence
        # the heads a pass runs: head 1 and the draft heads (`model.draft`), else the training heads,
        # stacked (or, with stacked=False, one by one: the reference)
        self.stacked = model.decode_heads() if stacked or model.drafter is not None else None
        n = model.config.n_future
        self.profiles = {True: AcceptanceProfile(n), False: AcceptanceProfile(n, ranks=1)}  # by greedy
        self.lookups = LookupProfile()  # how often prompt-lookup drafts are accepted
        self.calibration = CalibratedCosts(model, stacked=self.stacked is not None, given=costs)
        self.policy = CompilePolicy(model, self.stacked, compile)
        self.last_choice: Choice | None = None
        self._states: torch.Tensor | None = None  # head 1's states of the last pass (two-phase drafting)
        self._picks: torch.Tensor | None = None  # the greedy picks the compiled step made in its last pass
        self._layers: dict[int, int] = {}  # heads -> the cache layers a pass of them writes
        # whether a pass leaves every head's cache whole (draft heads need none), so that more heads
        # than the last pass ran need only their candidates taken anew, at one position; and whether
        # a pass runs head 1 alone and the draft heads after it at the kept nodes (`DraftPass`)
        self.device = model.embed.weight.device
        self.keeps_warm = getattr(self.stacked, "keeps_warm", False)
        self.two_phase = getattr(self.stacked, "two_phase", False)

    def layers_written(self, heads: int) -> int:
        """The cache layers a pass of `heads` heads writes (the first this many of the cache;
        asked every pass, so kept)."""
        if heads not in self._layers:
            self._layers[heads] = (self.stacked or self.model).layers_written(heads)
        return self._layers[heads]

    # --- compiling and what a pass costs (`compiled`, `calibration`) -----------------------------

    def compile_shapes(self, batch_size: int) -> None:
        """Compile now every shape of the static step that the decoder may choose at this batch
        size (a benchmark's warm-up: no compiling inside timed runs); nothing without the step.
        Besides the timing grid's shapes, one head over a chain in every node bucket: the passes
        that verify prompt-lookup drafts, longer than any the heads draft alone."""
        static = self.policy.static
        if static is not None:
            with torch.inference_mode():
                measure_pass_costs(self, batch_size, repeats=0, static=True)
                cache = KVCache.for_model(self.model, batch_size=batch_size,
                                          max_len=self.model.config.seq_len + MAX_NODES)
                for T in NODE_BUCKETS:
                    cache.lengths = [0] * batch_size
                    static(torch.zeros(batch_size, T, dtype=torch.long, device=cache.k.device), cache, heads=1)

    def pass_costs(self, batch_size: int, *, static: bool = False) -> PassCosts:
        """Seconds per pass for k heads over T nodes at this batch size, on the eager or the compiled
        static step, measured (`measure_pass_costs`) the first time it is asked; for the compiled
        step, those that an earlier process recorded in the compile cache when it compiled the step."""
        costs = self.calibration.lookup(batch_size, static=static)
        if costs is None:
            with torch.inference_mode():
                costs = self.calibration.add(batch_size, measure_pass_costs(self, batch_size, static=static),
                                             static=static)
        return costs

    def plan(self, draft: Draft, *, batch_size: int, static: bool, greedy: bool) -> Choice:
        """The heads and tree of the next passes: the draft's fixed chain, or (one that adapts) the best
        by the newest profile and the costs of the batch as it started (rows that finish leave)."""
        if not draft.adapts(greedy):
            return Choice(draft.heads, DraftTree.chain(draft.heads - 1), 0.0, 0.0)
        return choose(self.profiles[greedy], self.pass_costs(batch_size, static=static),
                      max_heads=self.model.config.n_future, tree=draft.trees(greedy), heads=draft.heads)

    # --- the loop ------------------------------------------------------------------------------

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
        sampling = sampling or Sampling()
        draft = (Draft.parse(draft) if isinstance(draft, str) else draft).for_model(self.model.config.n_future)
        t0 = time.perf_counter()
        depths = draft.max_depth(self.model.config.n_future)
        vocab = self.model.vocab  # bytes, or a BPE baseline's tokens: prompts are encoded, ids written as bytes
        rows = [Row(p if vocab.is_bytes else vocab.encode(p),
                    Output(SpeculativeStats(drafted=[0] * depths, accepted=[0] * depths),
                           max_bytes=max_bytes, stop=stop, pieces=vocab.pieces,
                           on_bytes=None if on_bytes is None else (lambda piece, r=r: on_bytes(r, piece))),
                    sampling, lookup=draft.lookup)
                for r, p in enumerate(prompts)]
        if max_bytes == 0:
            for row in rows:
                row.out.stats.stopped_by = "max_bytes"
        elif rows:
            self.decode(rows, draft, max_bytes=max_bytes, cancel=cancel)
        return [row.out.result(t0) for row in rows]

    def decode(self, rows: list[Row], draft: Draft, *, max_bytes: int,
               cancel: Callable[[], bool] | None) -> None:
        """Prefill, then emit and pass after pass (`loop.Loop`) until every row is finished (or
        `cancel()`). Rows choose bytes by their own `sampling`; trees are drafted only when all are greedy."""
        greedy = all(row.sampling.greedy for row in rows)
        loop = Loop(self, draft, rows, static=self.policy.use(len(rows), max_bytes), greedy=greedy)
        while loop.emit():
            if cancel is not None and cancel():
                loop.state.interrupt()
                break
            loop.advance()

    def step(self, state: Batch, choice: Choice) -> None:
        """One speculative pass over the batch: draft, forward, verify, then accept (or propose
        anew) row by row; its time calibrates the pass costs (under automatic choice), with what
        was spent for it before it (`Batch.carried_s`: a re-warm of the heads it runs), so that a
        switch to more heads is charged what the switch costs."""
        t0, state.carried_s = time.perf_counter() - state.carried_s, 0.0
        cache, seq_len = state.cache, self.model.config.seq_len
        k = min(choice.heads, state.warm)  # heads whose caches are complete can run
        tree = choice.tree.truncated(state.warm - 1)  # ... and only they gave candidates
        batch = [state.rows[r] for r in state.active]
        # a row offers drafts up to the depth that max_bytes and its window leave
        limits = [0 if r in state.finished else
                  min(row.out.bytes_left(), context_left(row.n_tokens, row.start, seq_len))
                  for r, row in zip(state.active, batch)]
        offered, used = [min(tree.depth, limit) for limit in limits], [None] * len(batch)
        if any(row.lookup for row in batch):
            tree, offered, used = lookup_pass(state, batch, tree, limits, heads=k, lookups=self.lookups,
                                              costs=lambda: self.pass_costs(len(state.rows), static=state.static))
        if self.confidence:  # a greedy row's heads' drafts end where they stop being sure; the pass with them
            offered = [o if u is not None or not row.sampling.greedy else min(o, row.sure)
                       for o, u, row in zip(offered, used, batch)]
            if max(offered, default=0) < tree.depth and all(u is None for u in used):
                tree = tree.truncated(max(offered, default=0))
        starts, ats = list(cache.lengths), [len(row.out.data) for row in batch]  # the next byte is out
        live = [row for r, row in zip(state.active, batch) if r not in state.finished]
        logits = self.forward(self.draft(batch, tree), tree, cache, heads=k, static=state.static, rows=live)
        cache.rewind(tree.T)
        if self.two_phase and k > 1:  # the draft heads at every node, from head 1's pick there
            logits = self.with_drafts(logits, batch, ats, heads=k, static=state.static)
        picks = self.read_picks(logits, batch, ats, live, heads=k)  # the pass's one transfer
        verdicts = self.verify(picks, state, batch, tree, offered)
        layers = self.layers_written(k)
        shapes: dict[int, str] = {}  # the shape offered to rows that may use drafts to a depth, by depth
        for b, (r, row) in enumerate(zip(state.active, batch)):
            if r in state.finished:
                continue
            path, nxt = verdicts[b]
            profile = state.profile(row)
            if used[b] is not None:  # lookup bytes were drafted: the lookup profile learns, not the heads'
                run = accepted_run(path, tree, len(used[b].draft))
                self.lookups.record(used[b], offered=min(offered[b], len(used[b].draft)), accepted=run)
                row.stats.lookup_passes += 1
            elif profile is not None:  # what the heads got right: the accepted bytes, then head 1's
                truth = [row.cand[tree.depths[n] - 1][tree.ranks[n]] for n in path[1:]] + [nxt]
                profile.record_pass(row.cand, truth, offered=offered[b], greedy=row.sampling.greedy)
            row.stats.heads_used[k] = row.stats.heads_used.get(k, 0) + 1
            if offered[b] not in shapes:
                shapes[offered[b]] = tree.truncated(offered[b]).describe()
            row.stats.shapes[shapes[offered[b]]] = row.stats.shapes.get(shapes[offered[b]], 0) + 1
            n_out = len(row.out.data)
            done = self.accept(row, b, path, tree, cache, start=starts[b], layers=layers, offered=offered[b])
            if used[b] is not None:  # the lookup bytes output (a stop string or EOS may end them)
                row.stats.lookup_accepted += min(run, len(row.out.data) - n_out)
            if done:
                state.finished.add(r)
                continue
            self.propose(row, picks, b, path[-1], nxt)
        state.warm = k  # the heads whose candidates the rows hold (and, for training heads, whose caches are whole)
        if state.static and self.policy.static.last_was_new:  # compiling: not a cost, nor a rate
            state.compiled = True
        elif state.costs is not None:  # what it delivered is measured over the loop's windows (`loop.Window`)
            state.costs.observe(k, tree.T, time.perf_counter() - t0)

    # --- the steps of a pass ---------------------------------------------------------------------

    def prefill(self, rows: list[Row], cache: KVCache, heads: int) -> None:
        """Run each row's window (EOS + prompt, or its newest part) through the model, right-
        padded into one batch, and take the next byte and the candidates at its last position."""
        model, seq_len = self.model, self.model.config.seq_len
        windows = []
        for row in rows:
            tokens = row.tokens()
            row.start = window_start(len(tokens), row.start, seq_len)
            windows.append(tokens[row.start:])
        lengths = [len(w) for w in windows]
        ids = to_device([w + [EOS] * (max(lengths) - len(w)) for w in windows], model.embed.weight.device)
        cache.lengths = [0] * len(rows)
        t0 = time.perf_counter()
        logits = model.logits(ids, cache, heads=heads, stacked=self.stacked, layout=build_layout(model, ids, cache),
                              last=[n - 1 for n in lengths])  # (B, 1, K, V)
        seconds = time.perf_counter() - t0
        cache.lengths = lengths
        self.propose_all(rows, logits)
        for row in rows:
            row.stats.forward_passes += 1
            row.stats.step_s += seconds  # the model's own time, as a pass's step

    def propose_all(self, rows: list[Row], logits_B1KV: torch.Tensor, *, nxts: list[int] | None = None,
                    ats: list[int] | None = None) -> None:
        """`propose` for each row from the logits at its last position (B, 1, K, V), read in one
        transfer: head 1's pick there (the byte at output position `ats[b]`, by default the next
        the row emits) unless `nxts` gives it, and the heads' candidates after it."""
        ats = [len(row.out.data) for row in rows] if ats is None else ats
        picks = self.read_picks(logits_B1KV, rows, ats, rows, heads=logits_B1KV.shape[2])
        for b, row in enumerate(rows):
            self.propose(row, picks, b, 0, None if nxts is None else nxts[b])

    def read_picks(self, logits_BTKV: torch.Tensor, rows: list[Row], ats: list[int], live: list[Row], *,
                   heads: int) -> Picks:
        """What the logits say at every node (`picks.pass_picks`: each row by its own sampling; the
        greedy picks the compiled step made in its graph, where it ran), brought to the host in
        one transfer counted in the `live` rows' statistics."""
        greedy = self._picks if self._picks is not None and self._picks.shape[:2] == logits_BTKV.shape[:2] else None
        self._picks = None
        table = pass_picks(logits_BTKV, rows, ats, allowed_mask(logits_BTKV), confidence=self.confidence,
                           greedy_BTW=greedy)
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

    def forward(self, ids_BT: torch.Tensor, tree: DraftTree, cache: KVCache, *, heads: int,
                static: bool, rows: list[Row] = ()) -> torch.Tensor:
        """Logits (B, T, heads, V) of one pass of the tree after each row's cache, which it
        advances: on the compiled static step (which also makes the greedy picks), or eagerly
        with the layout built here. The seconds of the step itself (the compiled call, or the
        eager model) go into the `rows`' statistics (`step_s`)."""
        chain = tree.is_chain
        if static:
            step = self.policy.static
            logits = step(ids_BT, cache, heads=heads, depths=None if chain else tree.depths,
                          ancestors=None if chain else tree.ancestors)
            self._states, self._picks, seconds = step.states, step.picks, step.last_s
        else:
            model, t0 = self.model, time.perf_counter()
            layout = build_layout(model, ids_BT, cache, depths=None if chain else list(tree.depths),
                                  ancestors=None if chain else tree.ancestors, drafts=True)
            if self.two_phase:  # head 1 over the nodes; the drafts follow at every node (`with_drafts`)
                logits, self._states = self.stacked.head1(model(ids_BT, cache, layout=layout), layout, cache)
                cache.advance(ids_BT.shape[1])
            else:
                logits = model.logits(ids_BT, cache, heads=heads, stacked=self.stacked, layout=layout)
            seconds = time.perf_counter() - t0
        for row in rows:
            row.stats.step_s += seconds
        return logits

    def with_drafts(self, logits_BT1V: torch.Tensor, rows: list[Row], ats: list[int], *, heads: int,
                    static: bool) -> torch.Tensor:
        """Head 1's logits of a pass with the draft heads' (B, T, heads, V): at every node, the
        drafts read head 1's pick there (`DraftPass.drafts`, on the compiled step where it runs),
        the byte the row emits if it keeps that node; so the pass's picks, the drafts after the
        kept node among them, come back in its one transfer."""
        B, T = logits_BT1V.shape[:2]
        first = pass_picks(logits_BT1V, rows, ats, allowed_mask(logits_BT1V), greedy_BTW=self._picks)[..., 0]
        self._picks = None  # head 1's alone: the pass's picks are read over every head
        h_ND, first_N = self._states.reshape(B * T, -1), first.reshape(B * T).clamp(min=0)  # -1: a NaN, refused later
        drafts = (self.policy.static.drafts_at(h_ND, first_N, heads) if static
                  else self.stacked.drafts(h_ND, first_N, heads - 1))
        return torch.cat([logits_BT1V, drafts.view(B, T, heads - 1, -1).to(logits_BT1V.dtype)], dim=2)

    def verify(self, picks: Picks, state: Batch, rows: list[Row], tree: DraftTree,
               offered: list[int]) -> list[tuple[list[int], int]]:
        """For each row of the pass: the accepted path (node indices from the root) and the byte
        after it. A greedy row accepts a child whose byte is head 1's choice at its parent and
        whose depth is within what the row may use (`offered`); a sampled row (a chain: a batch
        with a sampled row drafts chains) accepts its drafts while each equals head 1's pick by
        position (`sampling.accept_drafts`). Rows finished or placeholders are not verified."""
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

    def emit_next(self, state: Batch) -> tuple[bool, list[int]]:
        """Emit each row's next byte, sliding the windows that are full (a slide runs the row's
        newest context again, which chooses its next byte anew: the rows that slide together run
        in one pass); False when all are finished, and the rows (by index in `state.rows`) whose
        windows slid."""
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
                self.prefill([rows[r] for _, r in sliding], view, state.warm)
                state.cache.take_back(view, [b for b, _ in sliding])
                slid += [r for _, r in sliding]
            going = sliding
        return len(finished) < len(rows), slid


def generate_batch(model: ByteMTP, prompts: list[bytes | str], *, max_bytes: int, draft: Draft | str = Draft(),
                   sampling: Sampling | None = None, stop: tuple[bytes, ...] = (),
                   on_bytes: Callable[[int, bytes], None] | None = None, cancel: Callable[[], bool] | None = None,
                   stacked: bool = True, costs: PassCosts | None = None,
                   compile: Compile | str | bool = Compile.AUTO) -> list[Generation]:
    """`Decoder(model).generate(...)` in one call (a new decoder: stacks the heads and, for the
    automatic choice, measures pass costs; make one `Decoder` to decode many times)."""
    return Decoder(model, stacked=stacked, costs=costs, compile=compile).generate(
        prompts, max_bytes=max_bytes, draft=draft, sampling=sampling, stop=stop, on_bytes=on_bytes, cancel=cancel)


def generate_speculative(model: ByteMTP, prompt: bytes | str, *, max_bytes: int, draft: Draft | str = Draft(),
                         sampling: Sampling | None = None, stop: tuple[bytes, ...] = (),
                         on_bytes: Callable[[bytes], None] | None = None, **kw) -> Generation:
    """Self-speculative decoding of one prompt (see `Decoder.generate`)."""
    return generate_batch(model, [prompt], max_bytes=max_bytes, draft=draft, sampling=sampling, stop=stop,
                          on_bytes=None if on_bytes is None else (lambda _, piece: on_bytes(piece)), **kw)[0]
