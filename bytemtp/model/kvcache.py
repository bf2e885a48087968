"""The decoding cache and the layout of one forward pass over it.

A `KVCache` holds keys and values of every layer (trunk and heads) in preallocated tensors
with a length pointer per row, kept on the host: rewinding rejected drafts moves pointers and
reallocates nothing, and rows of a batch may stand at different lengths.

A `Layout` says where the T ids of one pass go and what each may see: row b's node i is
written to cache slot `starts[b] + i`, sits at rotary position `starts[b] + depths[i]`, and
attends to the row's cached past and to the nodes that `ancestors[i]` names. A chain (depths
0..T-1, each node seeing those before it) is ordinary causal decoding; a tree of draft
candidates is the same pass with other depths and ancestors. Everything that depends only on
the layout (rotary tables, the attention mask, write indices) is built once a pass, on the
host's numbers, and every layer reuses it: no layer reads a length back from the device.

`StaticLayout` is the same for the compiled static step (bytemtp.decoding.compiled), built from device
tensors so that no host number enters the step. `context_left` and `window_start` are the one
rule by which decoding slides its window past the context.

After a tree pass the decoder keeps the accepted path (`KVCache.compact`): its slots move to
the front, so the cache again holds one contiguous sequence per row.

Legend: B batch, T time (nodes of a pass), L cached positions, H attention heads, E head size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


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
        self.max_len = max_len
        self.lengths = [0] * batch_size

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
        ns = [n] * len(self.lengths) if isinstance(n, int) else list(n)
        assert all(0 <= m and length + m <= self.max_len for m, length in zip(ns, self.lengths)), \
            (self.lengths, ns, self.max_len)
        self.lengths = [length + m for length, m in zip(self.lengths, ns)]

    def rewind(self, n: int | list[int]) -> None:
        ns = [n] * len(self.lengths) if isinstance(n, int) else list(n)
        assert len(ns) == len(self.lengths) and all(0 <= m <= length for m, length in zip(ns, self.lengths)), \
            (ns, self.lengths)
        self.lengths = [length - m for length, m in zip(self.lengths, ns)]

    def compact(self, row: int, slots: list[int], *, layers: int | None = None) -> None:
        """Move the given slots of one row (a tree's accepted path) to follow its valid
        positions, in order, in the first `layers` layers (all by default)."""
        dst = self.lengths[row]
        if slots == list(range(dst, dst + len(slots))):
            return  # already in place: a chain, or the tree's first branch
        src = torch.tensor(slots, device=self.k.device)
        for cache in (self.k, self.v):
            part = cache[:layers, row]  # (N, H, L, E) view
            part[:, :, dst:dst + len(slots)] = part.index_select(2, src)

    def keep(self, rows: list[int]) -> None:
        """Keep only these rows of the batch, in this order (a copy of the kept rows)."""
        index = torch.tensor(rows, device=self.k.device, dtype=torch.long)
        self.k, self.v = self.k.index_select(1, index), self.v.index_select(1, index)
        self.lengths = [self.lengths[r] for r in rows]

    def row(self, b: int) -> KVCache:
        """A one-row view of row b: writes through it land in this cache."""
        view = KVCache.__new__(KVCache)
        view.k, view.v = self.k[:, b:b + 1], self.v[:, b:b + 1]
        view.max_len, view.lengths = self.max_len, [self.lengths[b]]
        return view

    def reset(self) -> None:
        self.lengths = [0] * len(self.lengths)


class _Rotary:
    """What every layout of a pass gives the attention layers: the rotation of queries and keys
    at each node's position (`cos`, `sin`)."""

    def rotate(self, x_BHTE: torch.Tensor) -> torch.Tensor:
        """Rotary embedding at each node's position (x of shape (..., B, H, T, E))."""
        x1, x2 = x_BHTE.float().chunk(2, dim=-1)
        cos, sin = self.cos, self.sin
        rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        return rotated.type_as(x_BHTE)


class Layout(_Rotary):
    """Where the T nodes of one pass go and what each sees (see the module docstring).

    `starts` are the rows' cache lengths (host ints); `depths` (T ints) and `ancestors` (T x T
    bools, node i sees node j) describe a tree; both default to a chain. Positions past the
    rotary table (nodes beyond the context that the decoder does not use) are clamped.
    """

    def __init__(self, starts: list[int], T: int, *, rope: tuple[torch.Tensor, torch.Tensor],
                 cached: bool, depths: list[int] | None = None,
                 ancestors: torch.Tensor | None = None):
        device = rope[0].device
        self.starts, self.T, self.cached = list(starts), T, cached
        self.chain = depths is None
        uniform = min(starts) == max(starts)
        self.start = starts[0] if uniform else None  # the common start, or None when rows differ
        self.L = max(starts) + T  # keys a query may look at (cache slots 0..L-1)
        n_pos = rope[0].shape[0]
        if self.chain and uniform and self.start + T <= n_pos:
            self.cos, self.sin = rope[0][self.start:self.start + T], rope[1][self.start:self.start + T]
        else:
            depth_T = torch.arange(T) if depths is None else torch.tensor(depths)
            pos_BT = (torch.tensor(starts)[:, None] + depth_T).clamp(max=n_pos - 1).to(device)
            self.cos, self.sin = rope[0][pos_BT][:, None], rope[1][pos_BT][:, None]  # (B, 1, T, E/2)
        if not cached and not self.chain:
            raise ValueError("a tree layout needs a cache")
        # the mask: None (one position of rows that stand alike sees every cached key; a chain from slot 0 is plain causal), or
        # (B, 1, T, L) bools, (1, 1, T, L) when the rows stand alike
        self.causal = T > 1 and self.chain and (not cached or (uniform and self.start == 0))
        self.mask = None
        if cached and not self.causal and not (self.chain and T == 1 and uniform):
            see_TT = torch.ones(T, T).tril().bool() if ancestors is None else ancestors.bool().cpu()
            rows = [starts[0]] if uniform else starts
            mask = torch.zeros(len(rows), 1, T, self.L, dtype=torch.bool)
            for b, s in enumerate(rows):
                mask[b, 0, :, :s] = True
                mask[b, 0, :, s:s + T] = see_TT
            self.mask = mask.to(device)
        if uniform:
            self.rows_BT = self.slots_BT = None
        else:
            self.rows_BT = torch.arange(len(starts), device=device)[:, None]
            self.slots_BT = (torch.tensor(starts)[:, None] + torch.arange(T)).to(device)
        self._folded: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def mask_for(self, n: int, dtype: torch.dtype) -> torch.Tensor | None:
        """The mask as an additive bias of the queries' dtype (0 or -inf), for n stacked heads
        folded into the batch ((n * B, 1, T, L)): made once a pass, not once a layer."""
        if self.mask is None:
            return None
        n = 1 if self.mask.shape[0] == 1 else n
        if (n, dtype) not in self._folded:
            bias = torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device)
            bias.masked_fill_(~self.mask, float("-inf"))
            self._folded[n, dtype] = bias.repeat(n, 1, 1, 1) if n > 1 else bias
        return self._folded[n, dtype]


class StaticLayout(_Rotary):
    """The layout of a static decode step: shapes that depend only on (B, T, cache slots).

    Built from device tensors inside the step (no host numbers enter it, so one compiled step
    serves every pass of its shape): `starts_B` the rows' cache lengths, `depths_T` each node's
    depth and `see_TT` the tree's ancestry. Node i of row b sits at rotary position
    `starts_B[b] + depths_T[i]` and attends to the row's cache slots below its start and to the
    nodes it sees. The cache is only read here: every layer's new keys and values are kept in
    `written`, in the order the layers run, and the step writes them into the cache in one go
    (an in-place write inside a compiled graph costs a copy of the whole cache). Nodes that pad
    a pass up to its bucket see only themselves and are never seen: they change no real node.
    """

    def __init__(self, starts_B: torch.Tensor, depths_T: torch.Tensor, see_TT: torch.Tensor, *,
                 rope: tuple[torch.Tensor, torch.Tensor], L: int):
        self.T = depths_T.shape[0]
        pos_BT = (starts_B[:, None] + depths_T).clamp(max=rope[0].shape[0] - 1)
        self.cos, self.sin = rope[0][pos_BT][:, None], rope[1][pos_BT][:, None]  # (B, 1, T, E/2)
        self.past_B1TL = (torch.arange(L, device=starts_B.device) < starts_B[:, None])[:, None, None]
        self.see_TT = see_TT
        self.written: list[tuple[torch.Tensor, torch.Tensor]] = []

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor,
               cache_v: torch.Tensor) -> torch.Tensor:
        """Attention of the nodes (..., B, H, T, E) over the cache's past (..., B, H, L, E) and
        the nodes they see, as two products (the cache is not copied); keeps k and v."""
        self.written.append((k, v))
        scale, wide = 1.0 / math.sqrt(q.shape[-1]), torch.promote_types(q.dtype, torch.float32)
        past = (q @ cache_k.transpose(-1, -2)).to(wide) * scale  # (..., B, H, T, L)
        new = (q @ k.transpose(-1, -2)).to(wide) * scale  # (..., B, H, T, T)
        past = past.masked_fill(~self.past_B1TL, float("-inf"))
        new = new.masked_fill(~self.see_TT, float("-inf"))
        p = torch.cat([past, new], dim=-1).softmax(dim=-1).to(q.dtype)
        L = cache_k.shape[-2]
        return p[..., :L] @ cache_v + p[..., L:] @ v


def causal_layout(T: int, rope: tuple[torch.Tensor, torch.Tensor]) -> Layout:
    """T positions from 0 with no cache: training and full-sequence scoring."""
    return Layout([0], T, rope=rope, cached=False)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Layout,
           cache_k: torch.Tensor | None, cache_v: torch.Tensor | None, dropout: float = 0.0) -> torch.Tensor:
    """Attention of T new queries (..., B, H, T, E) over the cached past and each other.

    With a cache, the new keys and values are written into `cache_k`/`cache_v` (..., B, H, L, E)
    at the layout's slots and the queries attend as the layout says. Leading dims (stacked
    heads) fold into the batch for SDPA.
    """
    if isinstance(layout, StaticLayout):
        return layout.attend(q, k, v, cache_k, cache_v)
    if cache_k is not None:
        T = layout.T
        if layout.start is not None:
            s = layout.start
            cache_k[..., s:s + T, :] = k
            cache_v[..., s:s + T, :] = v
        else:  # (..., B, L, H, E) views put the row and slot indices side by side
            cache_k.transpose(-3, -2)[..., layout.rows_BT, layout.slots_BT, :, :] = k.transpose(-3, -2)
            cache_v.transpose(-3, -2)[..., layout.rows_BT, layout.slots_BT, :, :] = v.transpose(-3, -2)
        k, v = cache_k[..., :layout.L, :], cache_v[..., :layout.L, :]
    lead, shape = q.shape[:-4], q.shape
    n = math.prod(lead) if lead else 1
    if lead:  # SDPA wants (N, H, T, E): fold the stacked heads into the batch
        B, H, E = q.shape[-4], q.shape[-3], q.shape[-1]
        q, k, v = (x.reshape(n * B, H, x.shape[-2], E) for x in (q, k, v))
    mask = layout.mask_for(n, q.dtype)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=layout.causal, dropout_p=dropout)
    return y.reshape(shape) if lead else y
