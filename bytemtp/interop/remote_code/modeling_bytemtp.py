"""The bytemtp byte transformer as a Hugging Face `transformers` causal LM (trust_remote_code).

The modules and their names are bytemtp.model.model.ByteMTP's, so the exported weights load one to
one: `embed`, the `trunk` of blocks, the n future-byte `heads` (each with its final norm) and
the `unembed` matrices (one per head, or one shared). Every step repeats bytemtp.model.model's: rotary
tables from the same formula in float32, rotation of the two halves of each head, nn.RMSNorm,
SwiGLU or GELU, attention through `scaled_dot_product_attention`; so the logits are bytemtp's
up to the rounding of the attention kernel.

`forward` is the next-byte model that `generate` and the Trainer need: trunk, head 1 and its
unembedding, with transformers' KV cache (`DynamicCache`, one layer index per attention layer,
bytemtp's numbering) and left-padded batches (positions from the attention mask's running
count, padding keys masked out). `future_logits` runs every head, as bytemtp's `ByteMTP.logits`.
Generation here is one byte a forward pass: self-speculative decoding with the extra heads is
bytemtp's own. Positions past the context (`seq_len`) are refused, as they have no rotary angle.

This file imports only torch and transformers: an exported folder loads where bytemtp is not
installed.

Legend: B batch, T time (new positions), L keys (cached and new), K heads, V vocabulary, D width,
H attention heads, E head size.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_bytemtp import ByteMTPConfig


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, each (seq_len, head_dim // 2), in float32 (bytemtp's formula),
    computed on the CPU as bytemtp computes them, so the tables are the same on every device."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32, device="cpu"), inv_freq)
    return angles.cos(), angles.sin()


@dataclass
class Layout:
    """What every layer of one forward pass shares: the rotation at each new position and what each
    new position may attend to. `mask` (B or 1, 1, T, L) bools, or None: then `causal` says whether
    the T positions form a causal chain among themselves (a prefill) or see every key (one position)."""

    cos: torch.Tensor  # (B, 1, T, E/2)
    sin: torch.Tensor
    mask: torch.Tensor | None
    causal: bool

    def rotate(self, x_BHTE: torch.Tensor) -> torch.Tensor:
        x1, x2 = x_BHTE.float().chunk(2, dim=-1)
        rotated = torch.cat((x1 * self.cos - x2 * self.sin, x1 * self.sin + x2 * self.cos), dim=-1)
        return rotated.type_as(x_BHTE)


class Attention(nn.Module):
    def __init__(self, config: ByteMTPConfig, layer_idx: int):
        super().__init__()
        self.n_attn_heads, self.head_dim, self.layer_idx = config.n_attn_heads, config.head_dim, layer_idx
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.out = nn.Linear(config.d_model, config.d_model, bias=False)
        self.out.residual_out = True  # initialised smaller (_init_weights)
        self.dropout = config.dropout
        if layer_idx < min(config.value_embeds, config.trunk_layers):  # the first value_embeds trunk layers
            self.value_embed = nn.Embedding(config.vocab_size, config.d_model)

    def forward(self, x_BTD: torch.Tensor, layout: Layout, cache: DynamicCache | None,
                input_ids: torch.Tensor | None = None) -> torch.Tensor:
        B, T, D = x_BTD.shape
        q, k, v = self.qkv(x_BTD).view(B, T, 3, self.n_attn_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if hasattr(self, "value_embed"):  # an embedding of each position's id added to its values
            v = v + self.value_embed(input_ids).view(B, T, self.n_attn_heads, self.head_dim).transpose(1, 2)
        q, k = layout.rotate(q), layout.rotate(k)  # (B, H, T, E)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # (B, H, L, E)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=layout.mask, is_causal=layout.causal,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(B, T, D))


class FeedForward(nn.Module):
    def __init__(self, config: ByteMTPConfig):
        super().__init__()
        self.swiglu = config.mlp == "swiglu"
        self.up = nn.Linear(config.d_model, (2 if self.swiglu else 1) * config.ffn_dim, bias=False)
        self.out = nn.Linear(config.ffn_dim, config.d_model, bias=False)
        self.out.residual_out = True

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        h = self.up(x_BTD)
        if self.swiglu:
            gate, h = h.chunk(2, dim=-1)
            h = F.silu(gate) * h
        else:
            h = F.gelu(h)
        return self.out(h)


class Block(nn.Module):
    """A pre-norm transformer layer: attention, then the feed-forward block, each on the residual stream."""

    def __init__(self, config: ByteMTPConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.attn = Attention(config, layer_idx)
        self.mlp_norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.mlp = FeedForward(config)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x_BTD: torch.Tensor, layout: Layout, cache: DynamicCache | None,
                input_ids: torch.Tensor | None = None) -> torch.Tensor:
        x_BTD = x_BTD + self.drop(self.attn(self.attn_norm(x_BTD), layout, cache, input_ids))
        return x_BTD + self.drop(self.mlp(self.mlp_norm(x_BTD)))


class Head(nn.Module):
    """One future-byte head: its layers (or one linear map) and its final norm."""

    def __init__(self, config: ByteMTPConfig, first_layer_idx: int):
        super().__init__()
        if config.head.layered:
            self.layers = nn.ModuleList(Block(config, first_layer_idx + i) for i in range(config.head_layers))
        else:
            self.proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)

    def forward(self, x_BTD: torch.Tensor, layout: Layout, cache: DynamicCache | None) -> torch.Tensor:
        if hasattr(self, "proj"):
            return self.proj(x_BTD)
        for layer in self.layers:
            x_BTD = layer(x_BTD, layout, cache)
        return x_BTD


class ByteMTPPreTrainedModel(PreTrainedModel):
    config_class = ByteMTPConfig
    base_model_prefix = ""
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    _supports_sdpa = True
    # draft heads (model.draft) travel in the weights for bytemtp's own decoder; this forward is head 1's
    _keys_to_ignore_on_load_unexpected = [r"^drafter\."]

    def _init_weights(self, module: nn.Module) -> None:
        """bytemtp's initialisation for a new model: Normal(0, init_std), the projections into the
        residual stream scaled down by sqrt(2 x layers), norms at one. (Loading weights skips it.)"""
        std = self.config.init_std
        if getattr(module, "residual_out", False):
            std = std / math.sqrt(2 * max(1, self.config.total_layers))
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, std)
        elif isinstance(module, nn.RMSNorm):
            nn.init.ones_(module.weight)


class ByteMTPForCausalLM(ByteMTPPreTrainedModel, GenerationMixin):
    """The byte transformer with n future-byte heads; `forward` gives the next-byte head's logits."""

    def __init__(self, config: ByteMTPConfig):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.ngram = nn.ModuleList(nn.Embedding(config.ngram_rows, config.d_model)
                                   for _ in range(config.ngram_embeds - 1))
        self.trunk = nn.ModuleList(Block(config, i) for i in range(config.trunk_layers))
        self.heads = nn.ModuleList(
            Head(config, config.trunk_layers + k * config.layers_per_head) for k in range(config.n_future))
        n_unembed = config.n_future if config.unembed == "replicated" else 1
        self.unembed = nn.ModuleList(
            nn.Linear(config.d_model, config.vocab_size, bias=False) for _ in range(n_unembed))
        self._rope: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed = value

    def get_output_embeddings(self) -> nn.Linear:
        """The next-byte head's unembedding."""
        return self.unembed[0]

    def rope(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary tables on the weights' device, in the weights' dtype (as bytemtp's buffers are
        after `model.to(dtype)`), made once per device and dtype."""
        weight = self.embed.weight
        key = (weight.device, weight.dtype)
        if key not in self._rope:
            cos, sin = rope_tables(self.config.seq_len, self.config.head_dim, self.config.rope_theta)
            self._rope[key] = cos.to(weight.device, weight.dtype), sin.to(weight.device, weight.dtype)
        return self._rope[key]

    def layout(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
               position_ids: torch.Tensor | None, past: int) -> Layout:
        """The layout of T new ids after `past` cached positions. Positions count the real (unmasked)
        ids before each one, so a left-padded row starts at 0 like a row alone; padding keys are
        masked out, and a padding query sees itself (no row of the mask is empty)."""
        B, T = input_ids.shape
        L, device = past + T, input_ids.device
        if attention_mask is not None and attention_mask.shape != (B, L):
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}; expected ({B}, {L}): "
                             "one entry per cached and new position")
        if position_ids is None:
            if attention_mask is not None:
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]
            else:
                position_ids = torch.arange(past, L, device=device)[None]
        if int(position_ids.max()) >= self.config.seq_len:
            raise ValueError(f"position {int(position_ids.max())} exceeds the context of {self.config.seq_len} "
                             "bytes (seq_len); the exported model does not slide its window (bytemtp generate does)")
        cos, sin = self.rope()
        cos, sin = cos[position_ids][:, None], sin[position_ids][:, None]  # (B or 1, 1, T, E/2)
        padded = attention_mask is not None and not bool(attention_mask.all())
        if not padded and (past == 0 or T == 1):
            return Layout(cos, sin, mask=None, causal=past == 0 and T > 1)
        slot_L, query_T = torch.arange(L, device=device), torch.arange(past, L, device=device)
        mask = (slot_L <= query_T[:, None])[None, None]  # (1, 1, T, L) causal after the past
        if padded:
            mask = mask & attention_mask.bool()[:, None, None, :]
            mask = mask | (slot_L == query_T[:, None])  # a padding query sees itself
        return Layout(cos, sin, mask=mask, causal=False)

    def ngram_history(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                      cache: DynamicCache | None) -> torch.Tensor:
        """The ids 1..n-1 positions before each new id (B, T, n - 1), -1 before the sequence began
        or at padding: from the new ids and those the cache has seen (kept on it, `bytemtp_ids`)."""
        back, (B, T) = len(self.ngram), input_ids.shape
        seen = getattr(cache, "bytemtp_ids", None) if cache is not None else None
        known = input_ids if seen is None else torch.cat([seen, input_ids], dim=1)
        if attention_mask is not None:
            known = torch.where(attention_mask[:, -known.shape[1]:].bool(), known, -1)
        if cache is not None:
            cache.bytemtp_ids = known[:, -back:]  # all that a later pass's history reads
        padded = torch.cat([known.new_full((B, back), -1), known], dim=1)[:, -(T + back):]
        return torch.stack([padded[:, back - j:back - j + T] for j in range(1, back + 1)], dim=-1)

    def trunk_state(self, input_ids: torch.Tensor, layout: Layout, cache: DynamicCache | None,
                    attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Trunk state z (B, T, D) of ids (B, T): their embedding, with the hashed n-gram tables' where
        the model has them (bytemtp's `ngram_ids`: a polynomial hash modulo a prime, then the rows)."""
        x_BTD = self.embed(input_ids)
        if len(self.ngram):
            history_BTJ = self.ngram_history(input_ids, attention_mask, cache)
            h = input_ids.long() + 1
            for n, table in enumerate(self.ngram, start=2):
                h = (h * 1000003 + history_BTJ[..., n - 2].long() + 1) % 2147483647
                x_BTD = x_BTD + table(h % self.config.ngram_rows)
        for block in self.trunk:
            x_BTD = block(x_BTD, layout, cache, input_ids)
        return x_BTD

    def head_states(self, z_BTD: torch.Tensor, layout: Layout, cache: DynamicCache | None = None,
                    heads: int | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        """(k, state) of the first `heads` heads (all by default): each head runs on the trunk state,
        or, for causal heads, on the previous head's state (bytemtp's `head_states`)."""
        h_BTD = None
        for k in range(self.config.n_future if heads is None else heads):
            x_BTD = h_BTD if self.config.head.chained and k > 0 else z_BTD
            h_BTD = self.heads[k](x_BTD, layout, cache)
            yield k, h_BTD

    def head_logits(self, k: int, h_BTD: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) of head k from its state."""
        unembed = self.unembed[k if len(self.unembed) > 1 else 0]
        return unembed(self.heads[k].norm(h_BTD))

    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, cache: DynamicCache | None = None,
                use_cache: bool | None = None, labels: torch.LongTensor | None = None,
                past_key_values: DynamicCache | None = None, **kwargs) -> CausalLMOutputWithPast:
        """Next-byte logits (B, T, V) of head 1 for ids (B, T), and with `labels` (B, T) the mean
        cross-entropy of predicting labels[:, t + 1] at t (labels of -100 are ignored).

        With a cache (`cache`, or `past_key_values` as older callers name it; made when `use_cache`
        is on) the ids follow its positions; `attention_mask` (B, cached + T) marks padding with 0.
        Only the trunk and head 1 write to the cache: heads 2..n run in `future_logits`."""
        cache = cache if cache is not None else past_key_values
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        past = cache.get_seq_length() if cache is not None else 0
        layout = self.layout(input_ids, attention_mask, position_ids, past)
        z_BTD = self.trunk_state(input_ids, layout, cache, attention_mask)
        _, h_BTD = next(self.head_states(z_BTD, layout, cache, heads=1))
        logits_BTV = self.head_logits(0, h_BTD)
        loss = None
        if labels is not None:
            targets = labels[:, 1:].flatten().to(logits_BTV.device)
            loss = F.cross_entropy(logits_BTV[:, :-1].flatten(0, 1).float(), targets, ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits_BTV, cache=cache if use_cache else None)

    def future_logits(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                      position_ids: torch.LongTensor | None = None) -> torch.Tensor:
        """Logits (B, T, K, V) of all K heads for ids (B, T) without a cache: head k (k = 1..K,
        index k - 1) predicts the byte k positions after t, as bytemtp's `ByteMTP.logits`."""
        layout = self.layout(input_ids, attention_mask, position_ids, past=0)
        z_BTD = self.trunk_state(input_ids, layout, None, attention_mask)
        return torch.stack([self.head_logits(k, h_BTD) for k, h_BTD in self.head_states(z_BTD, layout)], dim=2)
