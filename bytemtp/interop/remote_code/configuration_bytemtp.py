"""The configuration of a bytemtp model in Hugging Face `transformers`.

The fields are bytemtp's `ModelConfig` fields with the same names and meanings, plus what
transformers expects of a causal LM (vocabulary size, special ids, cache use). The layer
accounting (`trunk_layers`, `total_layers`) and what each head type is (`HEAD_TYPES`, the part of
bytemtp.config's `HeadType` that a forward pass needs) repeat bytemtp's, because this file may not
import bytemtp: a user loading an exported folder need not have it installed. As in bytemtp, the
code asks `config.head` what the heads are and never compares the type's name.

`bytemtp` holds the checkpoint's own config.json ({"format_version", "bytemtp_version",
"config"}), so bytemtp loads the exported folder back as a checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from transformers import PretrainedConfig


@dataclass(frozen=True)
class HeadKind:
    """What one head type is."""

    layered: bool
    """Each head is head_layers transformer layers (else one D x D linear map, no layer)."""
    chained: bool
    """Head k runs on head k-1's state (head 1 on the trunk's); else every head on the trunk's."""


HEAD_TYPES = {"transformer": HeadKind(layered=True, chained=False),
              "linear": HeadKind(layered=False, chained=False),
              "causal": HeadKind(layered=True, chained=True)}
UNEMBED_TYPES = ("shared", "replicated")
MLP_TYPES = ("swiglu", "gelu")


class ByteMTPConfig(PretrainedConfig):
    """Shape of the byte transformer: a shared trunk and n_future future-byte heads."""

    model_type = "bytemtp"
    attribute_map = {"hidden_size": "d_model", "num_attention_heads": "n_attn_heads",
                     "max_position_embeddings": "seq_len"}

    n_layers: int = 12
    """Total transformer layers, trunk and heads together."""
    d_model: int = 256
    """Width of the residual stream."""
    n_attn_heads: int = 4
    """Attention heads per layer."""
    n_future: int = 8
    """Number of output heads; head k predicts the byte k positions ahead (1 = next byte)."""
    head_type: str = "transformer"
    """transformer (independent layers), linear, or causal (head k runs on head k-1's state)."""
    head_layers: int = 1
    """Transformer layers in each transformer or causal head."""
    unembed: str = "replicated"
    """One unembedding matrix per head (replicated) or one shared by all."""
    draft: str = "none"
    """Draft heads in the weights (none, medusa, hydra): bytemtp's decoder drafts with them; not loaded here."""
    param_match: bool = True
    """The heads' layers were taken out of the trunk (the trunk has n_layers - n_future * head_layers)."""
    doc_mask: bool = False
    """Always false: bytemtp does not export a model trained with attention within documents."""
    seq_len: int = 512
    """Context length in bytes: positions past it have no rotary angle, so longer inputs are refused."""
    mlp: str = "swiglu"
    """Feed-forward block: swiglu or gelu."""
    ffn_hidden: int = 0
    """Feed-forward hidden width; 0 picks 8/3 d_model (swiglu) or 4 d_model (gelu), rounded up to 64."""
    rope_theta: float = 10000.0
    """Base of the rotary position embedding."""
    dropout: float = 0.0
    """Dropout on attention weights and residual branches in training mode."""
    norm_eps: float = 1e-5
    """Epsilon of the RMSNorm layers."""
    init_std: float = 0.02
    """Standard deviation of the normal weight initialisation of a new model."""
    value_embeds: int = 0
    """Trunk layers, the first ones, whose attention values add an embedding of each position's own id."""
    ngram_embeds: int = 0
    """Largest n of the hashed n-gram tables added to each position's embedding (one for each n of 2..ngram_embeds)."""
    ngram_rows: int = 8192
    """Rows of each hashed n-gram table."""
    vocab_size: int = 264
    """Ids 0..255 are bytes, 256 BOS, 257 EOS, 258 PAD; the table is padded to a multiple of 8."""
    bos_token_id: int = 256
    eos_token_id: int = 257
    pad_token_id: int = 258
    use_cache: bool = True
    """Keep keys and values between forward passes (generate's KV cache)."""
    tie_word_embeddings: bool = False
    bytemtp: dict | None = None
    """The bytemtp checkpoint's config.json, so bytemtp loads the folder back."""

    def __post_init__(self, **kwargs):
        for name, value, allowed in (("head_type", self.head_type, HEAD_TYPES),
                                     ("unembed", self.unembed, UNEMBED_TYPES), ("mlp", self.mlp, MLP_TYPES)):
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not allowed; choose one of {', '.join(allowed)}")
        if self.doc_mask:
            raise ValueError("doc_mask=True is not supported here: this code attends across documents")
        if self.d_model % self.n_attn_heads or self.head_dim % 2:
            raise ValueError(f"d_model={self.d_model} must split into n_attn_heads={self.n_attn_heads} "
                             "heads of even size")
        if self.trunk_layers < 1:
            raise ValueError(f"n_layers={self.n_layers} leaves no trunk layer for n_future={self.n_future} heads")
        super().__post_init__(**kwargs)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_attn_heads

    @property
    def head(self) -> HeadKind:
        """What the heads are (`HEAD_TYPES`)."""
        return HEAD_TYPES[self.head_type]

    @property
    def layers_per_head(self) -> int:
        """Transformer layers inside one head (0 for linear heads)."""
        return self.head_layers if self.head.layered else 0

    @property
    def trunk_layers(self) -> int:
        """n_layers less the layers of every head (param_match) or of the next-byte model's one head."""
        heads = self.n_future if self.param_match else 1
        return self.n_layers - heads * self.layers_per_head

    @property
    def total_layers(self) -> int:
        """Transformer layers in the built model (trunk plus all heads)."""
        return self.trunk_layers + self.n_future * self.layers_per_head

    @property
    def num_hidden_layers(self) -> int:
        """The layers a KV cache holds: every attention layer, trunk and heads (head k's layer i is
        layer trunk_layers + k * layers_per_head + i, as in bytemtp)."""
        return self.total_layers

    @property
    def ffn_dim(self) -> int:
        if self.ffn_hidden:
            return self.ffn_hidden
        width = 8 * self.d_model / 3 if self.mlp == "swiglu" else 4 * self.d_model
        return 64 * math.ceil(width / 64)
