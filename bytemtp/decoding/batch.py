"""The state of a decoding call, apart from the model and the decoder: one `Row` per prompt (its
output rules, its window, the byte due next and the heads' candidates after it) and the `Batch`
of rows decoded together (which cache row holds which prompt, which rows have finished, and
what the passes teach: the acceptance profile and the calibrated costs). `decode.Decoder` runs
its steps over them; `decode.measure_pass_costs` times those steps on dummy rows."""

from __future__ import annotations

import torch

from bytemtp.decoding.drafting import AcceptanceProfile, PassCosts
from bytemtp.decoding.generation import Output, SpeculativeStats
from bytemtp.decoding.sampling import Sampling
from bytemtp.model.kvcache import KVCache
from bytemtp.vocab import EOS


class Row:
    """One prompt's decoding: its output rules, how it chooses bytes (`sampling`: rows of one batch
    may differ), its window, the byte due next and the candidates of the heads after it (greedy:
    each head's top bytes; sampling: one draft each and its q). `lookup`: whether the row may
    draft prompt-lookup bytes (`lookup`; greedy rows only)."""

    def __init__(self, prompt: bytes, out: Output, sampling: Sampling | None = None, *, lookup: bool = False):
        self.prompt, self.out, self.sampling = prompt, out, sampling or Sampling()
        self.lookup = lookup
        self.start = 0  # window start, in tokens from the leading EOS
        self.nxt = EOS
        self.cand: list[list[int]] = []  # [depth - 1][rank]
        self.q: torch.Tensor | None = None  # (depths, V) draft distributions when sampling

    @property
    def stats(self) -> SpeculativeStats:
        return self.out.stats

    def tokens(self) -> list[int]:
        return [EOS, *self.prompt, *self.out.data]

    @property
    def n_tokens(self) -> int:
        """Tokens so far, the leading EOS and the byte due next (already emitted) included."""
        return 1 + len(self.prompt) + len(self.out.data)


class Batch:
    """The rows being decoded together, and how: cache row b holds rows[active[b]]; finished rows
    stay in the cache (fed, never accepted) until half of them are, then the cache drops them (not
    on the static step, whose batch shape stays). `profiles` (by whether the row is greedy) learn
    from the passes and `costs` are calibrated by them (None: not). A batch that serves requests
    as they come (`bytemtp.serving.engine`) `add`s rows between passes and `remove_finished` ones."""

    def __init__(self, rows: list[Row], cache: KVCache, *, warm: int,
                 profiles: dict[bool, AcceptanceProfile] | None, costs: PassCosts | None, static: bool = False):
        self.rows, self.cache, self.warm = rows, cache, warm  # warm: heads whose caches are complete
        self.profiles, self.costs, self.static = profiles, costs, static
        self.active = list(range(len(rows)))
        self.finished: set[int] = set()

    @property
    def greedy(self) -> bool:
        """Whether every row not finished decodes greedily (then passes may draft trees)."""
        return all(self.rows[r].sampling.greedy for r in self.active if r not in self.finished)

    def profile(self, row: Row) -> AcceptanceProfile | None:
        """The acceptance profile that a row's passes teach."""
        return None if self.profiles is None else self.profiles[row.sampling.greedy]

    def add(self, rows: list[Row]) -> list[int]:
        """Append rows (their cache rows empty, at the end); their indices in the cache."""
        self.cache.grow(len(rows))
        first = len(self.active)
        self.active.extend(range(len(self.rows), len(self.rows) + len(rows)))
        self.rows.extend(rows)
        return list(range(first, first + len(rows)))

    def remove_finished(self) -> list[Row]:
        """Drop every finished row from the batch and its cache (rows renumbered); the rows dropped."""
        gone = [self.rows[r] for r in self.active if r in self.finished]
        if not self.finished:
            return gone
        live = [b for b, r in enumerate(self.active) if r not in self.finished]
        self.cache.keep(live)
        self.rows = [self.rows[self.active[b]] for b in live]
        self.active, self.finished = list(range(len(self.rows))), set()
        return gone

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
