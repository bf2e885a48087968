"""The decoding cache and the context window it serves.

A `KVCache` holds keys and values of every layer (trunk and heads) in preallocated tensors
with a length pointer per row, kept on the host: rewinding rejected drafts moves pointers and
reallocates nothing, and rows of a batch may stand at different lengths. Where a pass's ids go
in it and what each may see is the pass's layout (`bytemtp.model.layout`), not the cache's; the
cache only keeps, per row, the slot where the row's current document begins (`doc_starts`),
which the layout of a document-masked model's chain passes reads and moves (`build_layout`).

After a tree pass the decoder keeps the accepted path (`KVCache.compact`): its slots move to
the front, so the cache again holds one contiguous sequence per row. `context_left` and
`window_start` are the one rule by which decoding slides its window past the context.

Legend: B batch, T time (nodes of a pass), L cached positions, H attention heads, E head size.
"""

from __future__ import annotations

import torch

from bytemtp.model.transfer import to_device


def context_left(n: int, start: int, seq_len: int) -> int:
    """How many more tokens the window holds when the context of the prediction of token n is
    tokens start..n-1 (tokens count from the leading EOS); below 0 the window must slide. The one
    place that says how much context is left: decoding, drafting and task scoring ask it."""
    return seq_len - (n - start)


def window_start(n: int, start: int, seq_len: int) -> int:
    """Where the context of the prediction of token n begins: the current start while that fits
    in seq_len, else the newest half of the context (a slide re-runs seq_len / 2 bytes once every
    seq_len / 2 bytes: one extra position a byte). Plain and speculative decoding both follow this
    rule."""
    if context_left(n, start, seq_len) >= 0:
        return start
    return n - max(1, seq_len // 2)


class KVCache:
    """Keys and values of every layer for decoding, preallocated, with a length pointer per row."""

    def __init__(self, *, n_layers: int, batch_size: int, max_len: int, n_attn_heads: int,
                 head_dim: int, device: torch.device | str, dtype: torch.dtype):
        shape = (n_layers, batch_size, n_attn_heads, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        # the id at every slot (-1: none yet), which the hashed n-gram tables of later passes read
        # (`layout.ngram_history`); written by the pass layouts of models with model.ngram_embeds
        self.ids = torch.full((batch_size, max_len), -1, device=device, dtype=torch.long)
        self.max_len = max_len
        self.lengths = [0] * batch_size
        # per row, the slot of its current document's first id (its latest EOS, or 0): kept by the
        # chain passes of a model with model.doc_mask; meaningful for slots below the row's length
        self.doc_starts = [0] * batch_size

    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int | None = None) -> KVCache:
        cfg = model.config
        param = model.embed.weight
        return cls(n_layers=cfg.total_layers, batch_size=batch_size, max_len=max_len or cfg.seq_len,
                   n_attn_heads=cfg.n_attn_heads, head_dim=cfg.head_dim, device=param.device,
                   dtype=param.dtype)

    @property
    def length(self) -> int:
        """The rows' common length (an error when they differ)."""
        assert min(self.lengths) == max(self.lengths), self.lengths
        return self.lengths[0]

    def advance(self, n: int | list[int]) -> None:
        if isinstance(n, int):  # every row alike: a pass's nodes (asked every pass)
            assert 0 <= n and max(self.lengths) + n <= self.max_len, (self.lengths, n, self.max_len)
            self.lengths = [length + n for length in self.lengths]
            return
        ns = list(n)
        assert all(0 <= m and length + m <= self.max_len for m, length in zip(ns, self.lengths)), \
            (self.lengths, ns, self.max_len)
        self.lengths = [length + m for length, m in zip(self.lengths, ns)]

    def rewind(self, n: int | list[int]) -> None:
        if isinstance(n, int):
            assert 0 <= n <= min(self.lengths), (n, self.lengths)
            self.lengths = [length - n for length in self.lengths]
            return
        ns = list(n)
        assert len(ns) == len(self.lengths) and all(0 <= m <= length for m, length in zip(ns, self.lengths)), \
            (ns, self.lengths)
        self.lengths = [length - m for length, m in zip(self.lengths, ns)]

    def compact(self, row: int, slots: list[int], *, layers: int | None = None) -> None:
        """Move the given slots of one row (a tree's accepted path) to follow its valid
        positions, in order, in the first `layers` layers (all by default)."""
        dst = self.lengths[row]
        if slots == list(range(dst, dst + len(slots))):
            return  # already in place: a chain, or the tree's first branch
        src = to_device(slots, self.k.device)
        for cache in (self.k, self.v):
            part = cache[:layers, row]  # (N, H, L, E) view
            part[:, :, dst:dst + len(slots)] = part.index_select(2, src)
        self.ids[row, dst:dst + len(slots)] = self.ids[row].index_select(0, src)

    def keep(self, rows: list[int]) -> None:
        """Keep only these rows of the batch, in this order (a copy of the kept rows)."""
        index = to_device(rows, self.k.device)
        self.k, self.v = self.k.index_select(1, index), self.v.index_select(1, index)
        self.ids = self.ids.index_select(0, index)
        self.lengths = [self.lengths[r] for r in rows]
        self.doc_starts = [self.doc_starts[r] for r in rows]

    def grow(self, n: int) -> None:
        """Append n empty rows (a copy of the cache: rows join a running batch between passes)."""
        if n <= 0:
            return
        extra = (self.k.shape[0], n, *self.k.shape[2:])
        self.k = torch.cat([self.k, self.k.new_zeros(extra)], dim=1)
        self.v = torch.cat([self.v, self.v.new_zeros(extra)], dim=1)
        self.ids = torch.cat([self.ids, self.ids.new_full((n, self.ids.shape[1]), -1)])
        self.lengths += [0] * n
        self.doc_starts += [0] * n

    def row(self, b: int) -> KVCache:
        """A one-row view of row b: writes of keys and values through it land in this cache; its
        length and document start are its own (copy them back, as the decoder does its length)."""
        view = KVCache.__new__(KVCache)
        view.k, view.v, view.ids = self.k[:, b:b + 1], self.v[:, b:b + 1], self.ids[b:b + 1]
        view.max_len, view.lengths, view.doc_starts = self.max_len, [self.lengths[b]], [self.doc_starts[b]]
        return view

    def rows(self, bs: list[int]) -> KVCache:
        """The cache of rows `bs` as a cache of its own (rows that run a pass apart from the
        others: windows that slide together): a view where they are consecutive, else a copy;
        `take_back` puts what a pass wrote to it in its place."""
        view = KVCache.__new__(KVCache)
        if bs == list(range(bs[0], bs[0] + len(bs))):
            view.k, view.v = self.k[:, bs[0]:bs[0] + len(bs)], self.v[:, bs[0]:bs[0] + len(bs)]
            view.ids = self.ids[bs[0]:bs[0] + len(bs)]
        else:
            index = to_device(bs, self.k.device)
            view.k, view.v = self.k.index_select(1, index), self.v.index_select(1, index)
            view.ids = self.ids.index_select(0, index)
        view.max_len = self.max_len
        view.lengths, view.doc_starts = [self.lengths[b] for b in bs], [self.doc_starts[b] for b in bs]
        return view

    def take_back(self, view: KVCache, bs: list[int]) -> None:
        """The keys, values, ids, lengths and document starts of `rows(bs)` back in their rows."""
        if view.k.data_ptr() != self.k[:, bs[0]].data_ptr():  # a copy: write it back
            index = to_device(bs, self.k.device)
            self.k.index_copy_(1, index, view.k)
            self.v.index_copy_(1, index, view.v)
            self.ids.index_copy_(0, index, view.ids)
        for i, b in enumerate(bs):
            self.lengths[b], self.doc_starts[b] = view.lengths[i], view.doc_starts[i]

    def reset(self) -> None:
        self.lengths = [0] * len(self.lengths)
        self.doc_starts = [0] * len(self.lengths)
