"""The state of a decoding call, apart from the model and the decoder: one `Row` per prompt (its
output rules, its window, the byte due next and the heads' candidates after it), the `Batch`
of rows decoded together (which cache row holds which prompt, which rows have finished, what
the passes teach: the acceptance profile and the calibrated costs) and, with the batch it
describes, which heads' caches are complete (`StaleHeads`). `loop.Loop` advances a batch pass
by pass over the steps of `decode.Decoder`; `calibration.measure_pass_costs` times those steps on
dummy rows.

Stale heads: a pass of k heads writes keys and values for the trunk and heads 1..k only, so
after a plain pass (or a slide run with fewer heads) the caches of the heads beyond it miss the
positions decoded since. A re-plan that wants more heads than are complete must first run those
positions again (`Decoder.rewarm`, a partial prefill). The trade-off: a position per row and head is tracked, so that
a re-warm runs only the positions that are missing (after a short plain stretch, a few bytes:
about one pass), rather than each row's whole window (at batch 1 on a CPU, the cost of some
twenty plain passes). So that what is missing stays short, a call whose draft adapts runs every
head wherever it runs a whole window (the prompt, a slide): a small part of that window's cost.
"""

from __future__ import annotations

from typing import Callable

from bytemtp.decoding.drafting import TREE_RANKS, AcceptanceProfile, DraftTree, PassCosts, accepted_run
from bytemtp.decoding.generation import Output, SpeculativeStats
from bytemtp.decoding.sampling import Sampling
from bytemtp.model.kvcache import KVCache
from bytemtp.vocab import EOS


class Row:
    """One prompt's decoding: its output rules, how it chooses bytes (`sampling`: rows of one batch
    may differ), its window, the byte due next and the candidates of the heads after it (greedy:
    each head's top bytes; sampling: one draft each and its q). `lookup`: whether the row may
    draft prompt-lookup bytes (`lookup`; greedy rows only). `prompt` holds the prompt's ids: its
    bytes, or a list of a BPE baseline's token ids. Rows made from one `Sampling` draw their keys
    from its generator in the order they are made."""

    def __init__(self, prompt: bytes | list[int], out: Output, sampling: Sampling | None = None, *,
                 lookup: bool = False):
        self.prompt, self.out, self.sampling = prompt, out, sampling or Sampling()
        self.lookup = lookup
        self.pad = False  # a placeholder that keeps a compiled batch at its bucket's size (`Batch.pad_to`)
        self.start = 0  # window start, in tokens from the leading EOS
        self.nxt = EOS
        self.cand: list[list[int]] = []  # [depth - 1][rank]
        self.sure = 1 << 30  # depths of the heads' top chain that are sure enough (`Decoder.confidence`)
        # a sampled row's key, drawn now from its sampling's generator: its byte at output position i
        # is a function of the key and i (`sampling.pick`), whatever the passes draft
        self.key = 0 if self.sampling.greedy else self.sampling.draw_key()

    @classmethod
    def for_prompts(cls, prompts: list[bytes], vocab, sampling: Sampling, *, max_bytes: int,
                    stop: tuple[bytes, ...], depths: int, lookup: bool,
                    on_bytes: Callable[[int, bytes], None] | None = None) -> list[Row]:
        """A call's rows: each prompt (encoded, for a BPE baseline's `vocab`) with its output, counting
        drafts to `depths`, streaming to `on_bytes(row, piece)`; a call of max_bytes 0 is finished."""
        rows = [cls(p if vocab.is_bytes else vocab.encode(p),
                    Output(SpeculativeStats(drafted=[0] * depths, accepted=[0] * depths),
                           max_bytes=max_bytes, stop=stop, pieces=vocab.pieces,
                           on_bytes=None if on_bytes is None else (lambda piece, r=r: on_bytes(r, piece))),
                    sampling, lookup=lookup)
                for r, p in enumerate(prompts)]
        if max_bytes == 0:
            for row in rows:
                row.out.stats.stopped_by = "max_bytes"
        return rows

    @property
    def stats(self) -> SpeculativeStats:
        return self.out.stats

    def tokens(self) -> list[int]:
        return [EOS, *self.prompt, *self.out.data]

    def history(self) -> bytes | str:
        """The prompt's and output's ids as one string that prompt lookup searches: bytes, or for a
        BPE baseline's ids (`prompt` a list) a str of one character an id."""
        if isinstance(self.prompt, bytes):
            return self.prompt + bytes(self.out.data)
        return "".join(map(chr, self.prompt)) + "".join(map(chr, self.out.data))

    @property
    def n_tokens(self) -> int:
        """Tokens so far, the leading EOS and the byte due next (already emitted) included."""
        return 1 + len(self.prompt) + len(self.out.data)

    @classmethod
    def placeholder(cls, n_future: int) -> Row:
        """A finished row that only fills a slot of a batch whose shape is fixed (fed EOS, never accepted)."""
        row = cls(b"", Output(SpeculativeStats(), max_bytes=0, stop=(), on_bytes=None))
        row.cand, row.pad = [[EOS] * TREE_RANKS] * (n_future - 1), True
        return row


class StaleHeads:
    """For each row of a batch (by its index in `Batch.rows`) and each head h, the first cache
    position whose keys and values head h lacks (None: it lacks none); see the module docstring."""

    def __init__(self, n_rows: int, n_future: int, *, warm: int):
        self.n_future = n_future
        self.first: list[list[int | None]] = [[None] * warm + [0] * (n_future - warm) for _ in range(n_rows)]

    def passed(self, row: int, *, heads: int, start: int) -> None:
        """A pass of `heads` heads wrote the row's positions from `start` on."""
        first = self.first[row]
        for h in range(heads, self.n_future):
            f = first[h]
            if f is None or f > start:
                first[h] = start

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


class Batch:
    """The rows being decoded together, and how: cache row b holds rows[active[b]]; finished rows
    stay in the cache (fed, never accepted) until half of them are, then the cache drops them (not
    on the static step, whose batch shape stays). `profiles` (by whether the row is greedy) learn
    from the passes and `costs` are calibrated by them (None: not); `stale` says which heads'
    caches each row lacks. A batch that serves requests as they come (`bytemtp.serving.engine`)
    `add`s rows between passes and `remove_finished` ones; on the static step it keeps its size
    at a bucket with placeholder rows (`pad_to`), so that its passes run compiled shapes."""

    def __init__(self, rows: list[Row], cache: KVCache, *, warm: int, n_future: int,
                 profiles: dict[bool, AcceptanceProfile] | None, costs: PassCosts | None, static: bool = False):
        self.rows, self.cache, self.warm = rows, cache, warm  # warm: heads whose caches are complete
        self.profiles, self.costs, self.static = profiles, costs, static
        self.active = list(range(len(rows)))
        self.finished: set[int] = set()
        self.stale = StaleHeads(len(rows), n_future, warm=warm)
        self.compile_s = 0.0  # seconds of passes that ran a shape for the first time (compiling: no rate)

    @property
    def greedy(self) -> bool:
        """Whether every row not finished decodes greedily (then passes may draft trees)."""
        return all(self.rows[r].sampling.greedy for r in self.active if r not in self.finished)

    def profile(self, row: Row) -> AcceptanceProfile | None:
        """The acceptance profile that a row's passes teach."""
        return None if self.profiles is None else self.profiles[row.sampling.greedy]

    def learn(self, row: Row, path: list[int], nxt: int, tree: DraftTree, *, offered: int, lookup, heads: int,
              lookups) -> int | None:
        """What a pass teaches and counts, for one of its rows: the lookup profile learns from the
        row's prompt-lookup draft (`lookup`, a `lookup.Match`; the run of its bytes the path accepted
        is returned), else the heads' profile from what the heads got right (the accepted bytes,
        then head 1's `nxt`); the row counts the pass's heads and draft shape."""
        run = None
        if lookup is not None:  # lookup bytes were drafted: the lookup profile learns, not the heads'
            run = accepted_run(path, tree, len(lookup.draft))
            lookups.record(lookup, offered=min(offered, len(lookup.draft)), accepted=run)
            row.stats.lookup_passes += 1
        elif (profile := self.profile(row)) is not None:  # what the heads got right: the accepted bytes, then head 1's
            truth = [row.cand[tree.depths[n] - 1][tree.ranks[n]] for n in path[1:]] + [nxt]
            profile.record_pass(row.cand, truth, offered=offered, greedy=row.sampling.greedy)
        stats = row.stats
        stats.heads_used[heads] = stats.heads_used.get(heads, 0) + 1
        shape = tree.truncated(offered).describe()
        stats.shapes[shape] = stats.shapes.get(shape, 0) + 1
        return run

    def add(self, rows: list[Row], *, warm: int) -> list[int]:
        """Append rows (their cache rows empty, at the end, complete for heads 1..`warm` once
        prefilled), placeholders dropped first; their indices in the cache."""
        if any(row.pad for row in self.rows):
            self._keep([b for b, r in enumerate(self.active) if not self.rows[r].pad])
        self.cache.grow(len(rows))
        self.stale.add(len(rows), warm=warm)
        first = len(self.active)
        self.active.extend(range(len(self.rows), len(self.rows) + len(rows)))
        self.rows.extend(rows)
        return list(range(first, first + len(rows)))

    def pad_to(self, size: int, *, n_future: int) -> None:
        """Fill the batch with placeholder rows up to `size` rows (a batch bucket of the static step)."""
        n = size - len(self.active)
        if n > 0:
            b = self.add([Row.placeholder(n_future) for _ in range(n)], warm=self.warm)
            self.finished.update(self.active[i] for i in b)

    def remove_finished(self) -> list[Row]:
        """Drop every finished row (placeholders too) from the batch and its cache, rows renumbered,
        once a row that is not a placeholder has finished; the rows dropped, placeholders not."""
        gone = [self.rows[r] for r in self.active if r in self.finished and not self.rows[r].pad]
        if gone:
            self._keep([b for b, r in enumerate(self.active) if r not in self.finished])
        return gone

    def _keep(self, live: list[int]) -> None:
        """Only the rows in these cache rows stay, renumbered in this order."""
        self.cache.keep(live)
        self.stale.keep([self.active[b] for b in live])
        self.rows = [self.rows[self.active[b]] for b in live]
        self.active, self.finished = list(range(len(self.rows))), set()

    def drop_finished(self) -> None:
        live = [b for b, r in enumerate(self.active) if r not in self.finished]
        if not self.static and len(live) * 2 <= len(self.active) and len(live) < len(self.active):
            self.cache.keep(live)
            self.active = [self.active[b] for b in live]

    def interrupt(self) -> None:
        """Decoding ends here: the rows not finished stop by "interrupted"."""
        for r, row in enumerate(self.rows):
            if r not in self.finished:
                row.out.stats.stopped_by = "interrupted"
