"""The layout of one forward pass, and the one function that builds it.

A layout says where the T ids of a pass go and what each may see: row b's node i is written to
cache slot `starts[b] + i`, sits at rotary position `starts[b] + depths[i]`, and attends to the
row's cached past and to the nodes that `ancestors[i]` names. A chain (depths 0..T-1, each node
seeing those before it) is ordinary causal decoding, or, with no cache, training and scoring; a
tree of draft candidates is the same pass with other depths and ancestors. Everything that
depends only on the layout (rotary tables, the attention mask, write indices) is built once a
pass, on the host's numbers (a document mask from the ids, on their device), and every layer
reuses it: no layer reads a length back from the device.

`build_layout` is the one place a pass's layout is made: the training step, evaluation,
likelihoods, rollouts, the decoder and the compiled step each call it once a batch or pass and
hand the result to the trunk and to every head, which take it as a required argument and never
build one of their own. What else attention depends on is added here, and so reaches every layer
of every pass; the price is that every caller of the model names the layout, even where it is the
plain causal one.

Document masking (`model.doc_mask`) is such an addition: a node sees only the nodes of its own
document, a document being what lies from one EOS up to the next (an EOS starts a document, as
the decoder's leading EOS starts generation; the last byte of a document still predicts the EOS).
Node i sees node j iff j <= i and no EOS lies in j+1..i. Rotary positions stay continuous across
documents: attention scores depend only on the distance between positions, so a document at offset
s scores as it would alone from 0 (up to rounding). Without a cache the mask is a (B, 1, T, T) bool
mask for `scaled_dot_product_attention`, built only when some row has an EOS after position 0
(one host check of the ids); otherwise, and always with the option off, the pass is the plain
causal one (`is_causal`, no mask). FlexAttention block masks were the other candidate, but on the
CPU (torch 2.13, the only device measured; CUDA was not) they have no backward pass. On the CPU one
masked attention call (forward and backward) costs about 1.2x the causal one at the `small` shape
(batch 16, 256 positions, width 64, 2 heads; 1.1x at 512 positions, width 128), and a whole `small`
training step about 1.03x. A cached chain pass (rollouts, plain decoding)
reads where each row's current document begins from `KVCache.doc_starts` and moves it past the
pass's last EOS. Draft passes (`drafts`, the decoder) and the static step are left causal: the
decoder's rows hold EOS at slot 0 only (prompts are bytes, and an accepted EOS ends generation), so
no output the decoder uses depends on a document boundary within the pass.

`Layout` is the eager form; `StaticLayout` is the same for the compiled static step
(bytemtp.decoding.compiled), built from device tensors so that no host number enters the step.
`attend` runs attention as either says.

Legend: B batch, T time (nodes of a pass), L cached positions, H attention heads, E head size.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from bytemtp.model.kvcache import KVCache
from bytemtp.model.transfer import batch_to_device, to_device
from bytemtp.vocab import EOS


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
    rotary table (nodes beyond the context that the decoder does not use) are clamped. `doc_BT`
    (a chain's only) is the slot where each node's document begins (`document_starts`): node i of
    row b then sees slots doc_BT[b, i] up to its own, a (B, 1, T, L) mask.
    """

    def __init__(self, starts: list[int], T: int, *, rope: tuple[torch.Tensor, torch.Tensor],
                 cached: bool, depths: list[int] | None = None,
                 ancestors: torch.Tensor | None = None, doc_BT: torch.Tensor | None = None):
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
            depth_T = torch.arange(T, device=device) if depths is None else to_device(depths, device)
            pos_BT = (to_device(starts, device)[:, None] + depth_T).clamp(max=n_pos - 1)
            self.cos, self.sin = rope[0][pos_BT][:, None], rope[1][pos_BT][:, None]  # (B, 1, T, E/2)
        if not cached and not self.chain:
            raise ValueError("a tree layout needs a cache")
        # the mask: None (one position of rows that stand alike sees every cached key; a chain from slot 0 is plain causal), or
        # (B, 1, T, L) bools, (1, 1, T, L) when the rows stand alike
        self.causal = T > 1 and self.chain and (not cached or (uniform and self.start == 0))
        self.mask = None
        if cached and not self.causal and not (self.chain and T == 1 and uniform):
            # built on the host row by row, then moved once
            see_TT = torch.ones(T, T, device="cpu").tril().bool() if ancestors is None else ancestors.bool()  # a host tensor
            rows = [starts[0]] if uniform else starts
            mask = torch.zeros(len(rows), 1, T, self.L, dtype=torch.bool, device="cpu")
            for b, s in enumerate(rows):
                mask[b, 0, :, :s] = True
                mask[b, 0, :, s:s + T] = see_TT
            self.mask = batch_to_device(mask, device)
        if doc_BT is not None:
            assert self.chain, "document masks are for chains"
            slot_L = torch.arange(self.L, device=doc_BT.device)
            own_BT = to_device(starts, doc_BT.device)[:, None] + torch.arange(T, device=doc_BT.device)
            self.mask = ((slot_L >= doc_BT[..., None]) & (slot_L <= own_BT[..., None]))[:, None]  # (B, 1, T, L)
            self.causal = False
        if uniform:
            self.rows_BT = self.slots_BT = None
        else:
            self.rows_BT = torch.arange(len(starts), device=device)[:, None]
            self.slots_BT = to_device(starts, device)[:, None] + torch.arange(T, device=device)
        self._folded: dict[tuple[int, torch.dtype], torch.Tensor] = {}
        self.history: torch.Tensor | None = None  # the ids before each node (`ngram_history`), where a model reads them

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
        self.history: torch.Tensor | None = None  # as Layout's

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


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Layout,
           cache_k: torch.Tensor | None, cache_v: torch.Tensor | None, dropout: float = 0.0) -> torch.Tensor:
    """Attention of T new queries (..., B, H, T, E) over the cached past and each other.

    With a cache, the new keys and values are written into `cache_k`/`cache_v` (..., B, H, L, E)
    at the layout's slots and the queries attend as the layout says. Leading dims (stacked
    heads) fold into the batch for SDPA.

    On the CPU, bf16 (or fp16) queries run in float32: there the flash kernel's backward in bf16
    costs 1.5-4x the float32 one, casts included (forward and backward, 12 x 64 positions, 4 heads
    of 32: 8.1 against 2.0 ms; 16 x 256, 2 heads: 15.4 against 10.6).
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
    low = q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16)
    with torch.autocast("cpu", enabled=False) if low else contextlib.nullcontext():
        wide = (x.float() for x in (q, k, v)) if low else (q, k, v)
        mask = layout.mask_for(n, torch.float32 if low else q.dtype)
        y = F.scaled_dot_product_attention(*wide, attn_mask=mask, is_causal=layout.causal, dropout_p=dropout)
    y = y.to(q.dtype)
    return y.reshape(shape) if lead else y


def ngram_history(ids_BT: torch.Tensor, back: int, *, past_BL: torch.Tensor | None = None,
                  starts_B: torch.Tensor | None = None, depths_T: torch.Tensor | None = None,
                  see_TT: torch.Tensor | None = None) -> torch.Tensor:
    """The ids 1..back positions before each node of a pass (B, T, back), -1 where the sequence had
    not begun: what the hashed n-gram tables read (`model.ngram_embeds`). The id j back is that of
    the node j before it in the pass (a chain's, or in a tree the ancestor at its depth - j, from
    `depths_T` and `see_TT`), else that of cache slot start - (j - depth) in `past_BL` (each row's
    ids, `KVCache.ids`; `starts_B` the rows' cache lengths), else none. Pure tensor arithmetic on
    the ids' device: the static step runs it in its graph."""
    B, T = ids_BT.shape
    device = ids_BT.device
    j_J = torch.arange(1, back + 1, device=device)
    if depths_T is None:  # a chain: node i - j
        target_TJ = torch.arange(T, device=device)[:, None] - j_J
        node_TJ = target_TJ.clamp(min=0)
    else:  # a tree: the ancestor at that depth (the one node it sees there)
        target_TJ = depths_T[:, None] - j_J
        node_TJ = (see_TT[:, None, :] & (depths_T[None, None, :] == target_TJ[..., None])).int().argmax(-1)
    in_pass_BTJ = ids_BT[:, node_TJ]
    if past_BL is None:
        before_BTJ = torch.full_like(in_pass_BTJ, -1)
    else:
        slot_BTJ = starts_B[:, None, None] + target_TJ  # below each row's start where target < 0
        before_BTJ = past_BL.gather(1, slot_BTJ.clamp(0, past_BL.shape[1] - 1).reshape(B, -1)).view(B, T, back)
        before_BTJ = torch.where(slot_BTJ >= 0, before_BTJ, -1)
    return torch.where(target_TJ >= 0, in_pass_BTJ, before_BTJ)


def document_starts(ids_BT: torch.Tensor, starts: list[int], prior: list[int]) -> torch.Tensor:
    """The slot where each node's document begins (B, T), on the ids' device: the slot of the
    row's latest EOS at or before the node in this pass (row b's node i sits at slot
    starts[b] + i), else `prior[b]`, where the row's document began before the pass."""
    device, T = ids_BT.device, ids_BT.shape[1]
    eos_BT = torch.where(ids_BT == EOS, torch.arange(T, device=device), -1).cummax(dim=1).values
    starts_B1, prior_B1 = (to_device(x, device)[:, None] for x in (starts, prior))
    return torch.where(eos_BT >= 0, starts_B1 + eos_BT, prior_B1)


def _cached_documents(ids_BT: torch.Tensor, cache: KVCache) -> torch.Tensor | None:
    """`document_starts` of a chain pass after the cache, which it moves to the pass's last
    node's document; None where every node's document begins at slot 0 (no mask needed)."""
    prior = [d if s > 0 else 0 for s, d in zip(cache.lengths, cache.doc_starts)]  # a row from 0 has no past
    assert all(d <= s for s, d in zip(cache.lengths, prior)), (cache.lengths, cache.doc_starts)
    doc_BT = document_starts(ids_BT, cache.lengths, prior)
    host_BT = doc_BT.cpu()
    cache.doc_starts = host_BT[:, -1].tolist()
    return doc_BT if bool(host_BT.max() > 0) else None


def build_layout(model, ids_BT: torch.Tensor, cache: KVCache | None = None, *,
                 depths: list[int] | torch.Tensor | None = None, ancestors: torch.Tensor | None = None,
                 drafts: bool = False, starts_B: torch.Tensor | None = None) -> Layout | StaticLayout:
    """The layout of one pass of `ids_BT` (B, T) through `model` (its rotary tables and context),
    made once and handed to the trunk and every head:

    - no cache: T positions from 0, causal (training, evaluation, scoring);
    - a `KVCache`: the ids follow each row's cached positions, as a chain or as the tree that
      `depths` (T ints) and `ancestors` (T x T bools, node i sees node j) describe;
    - `starts_B`, the rows' cache lengths as a device tensor (inside the compiled step): a
      `StaticLayout` over the L slots of `cache`'s tensors, with `depths` (T,) and `ancestors`
      (T, T) device tensors.

    A pass must fit the model's context (a ValueError names its positions and the context),
    except a decoder's pass of `drafts` and the static step: their nodes past the context run at
    clamped positions, and the decoder uses none of their outputs. A model with `doc_mask` gets
    a chain pass's document mask here, read from the EOS ids in `ids_BT` (and, with a cache, from
    and into `cache.doc_starts`); drafts and the static step stay causal (module docstring).
    """
    rope, seq_len, T = (model.rope_cos, model.rope_sin), model.config.seq_len, ids_BT.shape[1]
    back = model.config.ngram_embeds - 1  # ids before each node that the n-gram tables read
    if starts_B is not None:
        layout = StaticLayout(starts_B, depths, ancestors, rope=rope, L=cache.k.shape[-2])
        if back > 0:  # the step writes the pass's ids into the cache with its keys and values
            layout.history = ngram_history(ids_BT, back, past_BL=cache.ids, starts_B=starts_B, depths_T=depths,
                                           see_TT=ancestors)
        return layout
    end = T if cache is None else max(cache.lengths) + T
    if end > seq_len and not drafts:
        raise ValueError(f"sequence of {end} positions exceeds the context of {seq_len} (model.seq_len)")
    documents = model.config.doc_mask and depths is None and not drafts
    if cache is None:
        doc_BT = None
        if documents and bool((ids_BT[:, 1:] == EOS).any()):  # else every row is one document: causal
            doc_BT = document_starts(ids_BT, [0], [0])
        layout = Layout([0], T, rope=rope, cached=False, depths=depths, ancestors=ancestors, doc_BT=doc_BT)
        if back > 0:
            layout.history = ngram_history(ids_BT, back)
        return layout
    doc_BT = _cached_documents(ids_BT, cache) if documents else None
    layout = Layout(cache.lengths, T, rope=rope, cached=True, depths=depths, ancestors=ancestors, doc_BT=doc_BT)
    if back > 0:
        _cached_history(layout, ids_BT, cache, back, depths, ancestors)
    return layout


def _cached_history(layout: Layout, ids_BT: torch.Tensor, cache: KVCache, back: int, depths, ancestors) -> None:
    """A cached pass's n-gram history (`ngram_history`, from the cache's ids), and its ids written
    into the cache at the pass's slots, for the passes after it."""
    device = ids_BT.device
    depths_T = None if depths is None else to_device(list(depths), device)
    see_TT = None if ancestors is None else batch_to_device(ancestors.bool(), device)
    layout.history = ngram_history(ids_BT, back, past_BL=cache.ids, starts_B=to_device(cache.lengths, device),
                                   depths_T=depths_T, see_TT=see_TT)
    if layout.start is not None:
        cache.ids[:, layout.start:layout.start + layout.T] = ids_BT
    else:
        cache.ids[layout.rows_BT, layout.slots_BT] = ids_BT
