"""What a decoding pass runs after the trunk: one interface, `PassHeads`, and its kinds.

The model's trunk turns ids into a state z; what turns z into a pass's logits differs by model,
and decoding (`bytemtp.decoding`) asks this interface only, never the kind it holds:

- `StackedHeads`: the independent training heads (transformer, linear) with their weights stacked,
  so that the first k run as one batched layer (one matmul per projection instead of k), reading
  and writing the same cache as the heads one by one;
- `HeadsInTurn`: the training heads one by one (`ByteMTP.head_states`): causal heads, which each
  need the previous one's state, and the reference the other kinds are tested against;
- `bytemtp.model.draft.DraftPass`: head 1, then the model's draft heads (`model.draft`) on its
  state, after the pass's picks.

What a kind answers: the logits of the first k heads at every position or at one a row (`__call__`,
`logits`: prefills, re-warms); what a decoding pass runs in one graph (`in_pass`, eagerly `run_pass`: the
logits of `graph_heads(k)` heads, and the states the others follow from), and the rest once head 1's
picks are known (`after_picks`); which cache layers a pass writes (`cache_layers`, `layers_written`);
which heads' caches stay complete after a pass (`whole_after`: training heads past k miss the pass's
keys, draft heads keep none); and what a compiled step's record is keyed by (`record_key`). A new
kind (an EAGLE-style drafter, say) is one subclass and its tests.

Legend: B batch, T time, K heads, V vocabulary, D width, N nodes (B x T).
"""

from __future__ import annotations

import abc

import torch
import torch.nn.functional as F

from bytemtp.model.kvcache import KVCache
from bytemtp.model.layout import Layout, attend
from bytemtp.model.transfer import to_device


class PassHeads(abc.ABC):
    """What a decoding pass runs after the trunk (module docstring). A snapshot for inference,
    made once per loaded model (`ByteMTP.decode_heads`): kinds that copy weights do so when made."""

    name: str  # what a compiled step's record calls the kind (`record_key`)

    def __init__(self, model):
        self.model = model

    @abc.abstractmethod
    def __call__(self, z_BTD: torch.Tensor, layout: Layout, cache: KVCache | None, *, k: int,
                 last: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, k, V) of the first k heads on trunk state z (B, T, D); with `last` (a (B,)
        tensor of positions) only there: (B, 1, k, V). Writes the cache layers of `cache_layers(k)`.
        Every kind says its own (the interface has none to offer)."""

    def logits(self, ids_BT: torch.Tensor, cache: KVCache | None = None, *, heads: int | None = None,
               layout: Layout, last: list[int] | None = None) -> torch.Tensor:
        """The trunk, then the first `heads` heads (`__call__`; all by default), on ids (B, T) placed
        as `layout` says; advances the cache. With `last` (one position a row), only there:
        (B, 1, heads, V)."""
        z_BTD = self.model(ids_BT, cache, layout=layout)  # through __call__, so wrappers' hooks run
        pick = None if last is None else to_device(last, ids_BT.device)
        k = self.model.config.n_future if heads is None else heads
        out = self(z_BTD, layout, cache, k=k, last=pick)
        if cache is not None:
            cache.advance(ids_BT.shape[1])
        return out

    def run_pass(self, ids_BT: torch.Tensor, cache: KVCache, *, heads: int,
                 layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
        """An eager decoding pass: the trunk, then `in_pass`, on ids (B, T) placed as `layout` says;
        advances the cache."""
        out = self.in_pass(self.model(ids_BT, cache, layout=layout), layout, cache, k=heads)
        cache.advance(ids_BT.shape[1])
        return out

    def graph_heads(self, k: int) -> int:
        """How many heads' logits `in_pass` gives for a pass of k heads (the rest: `after_picks`)."""
        return k

    def in_pass(self, z_BTD: torch.Tensor, layout: Layout, cache: KVCache | None, *,
                k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """What a decoding pass of k heads runs before its picks (in the compiled step's graph):
        the logits (B, T, graph_heads(k), V) and the states (B, T, .) that `after_picks` reads."""
        return self(z_BTD, layout, cache, k=k), z_BTD[..., :0]

    def after_picks(self, states_ND: torch.Tensor, first_N: torch.Tensor, k: int) -> torch.Tensor:
        """The logits (N, k - graph_heads(k), V) of the heads after the graph's, at N nodes, from
        `in_pass`'s states there and head 1's pick at each (`first_N`): none here."""
        return states_ND.new_zeros(states_ND.shape[0], 0, self.model.config.table_rows)

    def finish(self, logits_BTJV: torch.Tensor, states: torch.Tensor, greedy: torch.Tensor | None, *, heads: int,
               first, after=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A decoding pass's logits of all its `heads` heads (B, T, heads, V), and the greedy picks
        still good for them (None: pick again), from what `in_pass` gave (its logits, its states,
        the compiled step's greedy picks). Here the graph ran every head: as they are. A kind that
        runs heads after the picks computes them here from head 1's pick at every node, which
        `first(logits, greedy)` gives (B, T), through `after` (the compiled step's `after_picks`;
        None: this one). The decoder calls it after every pass, whatever the kind."""
        return logits_BTJV, greedy

    def cache_layers(self, heads: int) -> tuple[int, ...]:
        """The cache layers a pass of `heads` heads writes, in the order it writes them."""
        return self.model.cache_layers(heads)

    def layers_written(self, heads: int) -> int:
        """How many of the cache's first layers a pass of `heads` heads writes (`KVCache.compact`)."""
        return self.model.layers_written(heads)

    def whole_after(self, heads: int) -> int:
        """The heads whose caches a pass of `heads` heads leaves complete: those past it lack the
        pass's keys and values (stale until a re-warm runs them again)."""
        return heads

    def record_key(self) -> list:
        """What a compiled step's graphs depend on besides the model's config (JSON values)."""
        return [self.name]


class HeadsInTurn(PassHeads):
    """The training heads one by one (`ByteMTP.head_states`): causal heads, which read the previous
    head's state, and the reference that the other kinds are tested against."""

    name = "in-turn"

    def __call__(self, z_BTD, layout, cache, *, k, last=None):
        model = self.model
        rows = None if last is None else torch.arange(len(last), device=z_BTD.device)
        return torch.stack([model.head_logits(j, h_BTD if last is None else h_BTD[rows, last][:, None])
                            for j, h_BTD in model.head_states(z_BTD, cache, layout=layout, heads=k)], dim=2)


def _rms_norm(x: torch.Tensor, weight_K1D: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), eps=eps) * weight_K1D


class StackedHeads(PassHeads):
    """The independent heads with their weights stacked along a new leading dim: the first k
    run on the trunk state as one batched layer (views of the stack, no copy), into the same
    cache slots as `Head` by `Head`.

    A snapshot for inference, made once per loaded model: built from the model's weights when
    made, not kept in step with later training.
    """

    name = "stacked"

    def __init__(self, model):
        cfg = model.config
        assert cfg.head.stackable, cfg.head_type
        super().__init__(model)
        self.cfg = cfg
        heads = list(model.heads)
        stack = lambda get: torch.stack([get(h) for h in heads]).detach()  # noqa: E731
        self.final_norm = stack(lambda h: h.norm.weight)[:, None, None, :]  # (K, 1, 1, D)
        if not cfg.head.layered:
            self.proj = stack(lambda h: h.proj.weight).transpose(1, 2)  # (K, D, D) as x @ W
            self.layers = []
        else:
            self.layers = [{
                "attn_norm": stack(lambda h: h.layers[i].attn_norm.weight)[:, None, None, :],
                "qkv": stack(lambda h: h.layers[i].attn.qkv.weight).transpose(1, 2),
                "out": stack(lambda h: h.layers[i].attn.out.weight).transpose(1, 2),
                "mlp_norm": stack(lambda h: h.layers[i].mlp_norm.weight)[:, None, None, :],
                "up": stack(lambda h: h.layers[i].mlp.up.weight).transpose(1, 2),
                "down": stack(lambda h: h.layers[i].mlp.out.weight).transpose(1, 2),
            } for i in range(cfg.head_layers)]
        if len(model.unembed) > 1:
            self.unembed = torch.stack([u.weight for u in model.unembed]).detach().transpose(1, 2)
        else:
            self.unembed = model.unembed[0].weight.detach().t()  # (D, V), shared

    def cache_layers(self, heads: int) -> tuple[int, ...]:
        """Layer i of every head in turn, after the trunk's (`ByteMTP.cache_layers`, stacked)."""
        return self.model.cache_layers(heads, stacked=True)

    def _mm(self, x_KBTD: torch.Tensor, w_KDF: torch.Tensor) -> torch.Tensor:
        K, B, T, D = x_KBTD.shape
        return torch.bmm(x_KBTD.reshape(K, B * T, D), w_KDF).view(K, B, T, -1)

    def _attention(self, x_KBTD, layer: dict, i: int, layout: Layout, cache: KVCache | None) -> torch.Tensor:
        cfg = self.cfg
        K, B, T, D = x_KBTD.shape
        H, E = cfg.n_attn_heads, cfg.head_dim
        qkv = self._mm(x_KBTD, layer["qkv"][:K]).view(K, B, T, 3, H, E).permute(3, 0, 1, 4, 2, 5)
        q, k, v = layout.rotate(qkv[0]), layout.rotate(qkv[1]), qkv[2]  # (K, B, H, T, E)
        ck = cv = None
        if cache is not None:  # head j's layer i sits at trunk + j * layers_per_head + i
            first, step = cfg.trunk_layers + i, cfg.layers_per_head
            ck = cache.k[first:first + K * step:step]
            cv = cache.v[first:first + K * step:step]
        y = attend(q, k, v, layout, ck, cv)
        return self._mm(y.transpose(2, 3).reshape(K, B, T, D), layer["out"][:K])

    def _mlp(self, x_KBTD, layer: dict) -> torch.Tensor:
        K = x_KBTD.shape[0]
        h = self._mm(x_KBTD, layer["up"][:K])
        if self.cfg.mlp == "swiglu":
            gate, h = h.chunk(2, dim=-1)
            h = F.silu(gate) * h
        else:
            h = F.gelu(h)
        return self._mm(h, layer["down"][:K])

    def __call__(self, z_BTD: torch.Tensor, layout: Layout, cache: KVCache | None, *, k: int,
                 last: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, k, V) of the first k heads on trunk state z (B, T, D); with `last`
        (a (B,) tensor of positions) only there: (B, 1, k, V)."""
        eps = self.cfg.norm_eps
        x = z_BTD.expand(k, *z_BTD.shape)
        if not self.layers:
            x = self._mm(x, self.proj[:k])
        for i, layer in enumerate(self.layers):
            x = x + self._attention(_rms_norm(x, layer["attn_norm"][:k], eps), layer, i, layout, cache)
            x = x + self._mlp(_rms_norm(x, layer["mlp_norm"][:k], eps), layer)
        if last is not None:
            x = x[:, torch.arange(len(last), device=x.device), last][:, :, None]  # (k, B, 1, D)
        x = _rms_norm(x, self.final_norm[:k], eps)
        if self.unembed.dim() == 3:
            logits = self._mm(x, self.unembed[:k])
        else:
            logits = x @ self.unembed
        return logits.permute(1, 2, 0, 3)
