"""Self-generated targets: the end of a training window replaced by the model's own greedy
continuation of the bytes before it.

Greedy self-speculative decoding keeps head k's byte when it equals the byte head 1 would choose
there, and the bytes before that one are head 1's own choices too. On text the model wrote
greedily, a draft head's data targets are exactly those choices, each a function of the context:
nothing is left to chance, where on the corpus the bytes between t and t + k are. `greedy_rollout`
makes such text from each window's own beginning, under no gradient, in eval mode (no dropout),
with a KV cache and only the next-byte head running, each byte chosen as plain greedy decoding
chooses it (`sampling.greedy_ids`: the bytes and EOS, never BOS or PAD); the trunk and head 1
must be frozen for it to mean the same thing from step to step (`train.trainable=draft-heads`),
and it is deterministic, so a run that uses it resumes exactly. A document-masked model's rollout
stays inside each document, an EOS in the prefix or one the model writes starting a new one: the
cache's passes get their document mask from `build_layout`, as every pass does.

The rollout runs eagerly, also where training compiles its blocks (train.compile): its passes
go through those blocks with a cache, which a block reads by its layer index, a constant to
torch.compile, so every layer and every pass shape (the prefix, the one-byte passes) would be a
graph of its own. A tune's training already compiles each block a few times (the frozen trunk
without gradients, the heads with them, validation in inference mode); the rollout's graphs on top
passed dynamo's recompile limit (8), which warned in ten lines and left the blocks uncompiled from
there on, training's shapes included. Run eagerly (`torch.compiler.set_stance("force_eager")`),
the rollout compiles nothing and the training step keeps its graphs; its passes are one-byte
decoding passes, where compiling the blocks alone saves little.

Legend: B batch, W window (T + n_future ids), T inputs.
"""

from __future__ import annotations

import torch

from bytemtp.decoding.sampling import greedy_ids
from bytemtp.model.kvcache import KVCache
from bytemtp.model.layout import build_layout
from bytemtp.model.model import ByteMTP
from bytemtp.vocab import PAD


@torch.no_grad()
def greedy_rollout(model: ByteMTP, ids_BW: torch.Tensor, n_bytes: int) -> torch.Tensor:
    """A copy of the windows whose inputs end in `n_bytes` greedy bytes (positions T - n_bytes + 1
    .. T, each head 1's choice after the ids before it) and whose last n_future - 1 ids, past the
    model's context, are PAD (no target). The model's train/eval mode is kept."""
    B, W = ids_BW.shape
    T = W - model.config.n_future
    if not 1 <= n_bytes <= T:
        raise ValueError(f"loss.rollout_bytes={n_bytes} does not fit a window of {T} inputs; use 1..{T}")
    start = T + 1 - n_bytes  # the first position the model writes
    ids = ids_BW.clone()
    ids[:, T + 1:] = PAD
    was_training = model.training
    model.eval()
    cache = KVCache.for_model(model, B, max_len=T)
    prefix_BT = ids[:, :start]
    with torch.compiler.set_stance("force_eager"):  # compiled blocks run uncompiled here (above)
        logits = model.logits(prefix_BT, cache, heads=1, layout=build_layout(model, prefix_BT, cache),
                              last=[start - 1] * B)
        for j in range(start, T + 1):
            ids[:, j] = greedy_ids(logits[:, -1, 0], vocab_size=model.config.vocab_size)
            if j < T:
                byte_B1 = ids[:, j:j + 1]
                logits = model.logits(byte_B1, cache, heads=1, layout=build_layout(model, byte_B1, cache))
    model.train(was_training)
    return ids
