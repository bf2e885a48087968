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
    """One prompt's decoding: its output rules, its window, the byte due next and the candidates
    of the heads after it (greedy: each head's top bytes; sampling: one draft each and its q)."""

    def __init__(self, prompt: bytes, out: Output):
        self.prompt, self.out = prompt, out
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
    """The rows being decoded together in one call, and how: cache row b holds rows[active[b]];
    finished rows stay in the cache (fed, never accepted) until half of them are, then the cache
    drops them (not on the static step, whose batch shape stays). `profile` learns from the
    passes and `costs` are calibrated by them (None: not)."""

    def __init__(self, rows: list[Row], cache: KVCache, *, warm: int, sampling: Sampling,
                 profile: AcceptanceProfile | None, costs: PassCosts | None, static: bool = False):
        self.rows, self.cache, self.warm = rows, cache, warm  # warm: heads whose caches are complete
        self.sampling, self.profile, self.costs, self.static = sampling, profile, costs, static
        self.active = list(range(len(rows)))
        self.finished: set[int] = set()

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
