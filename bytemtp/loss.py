"""The multi-token loss. The future shift lives here and nowhere else.

A training window holds W = T + n_future ids. Position t (t < T) of the input is the model's
view of ids[:, :T]; head k (0-based) predicts ids[:, t + k + 1]. A target is ignored when it
lies past the window's end, when it is PAD, and (by default) when an EOS stands strictly
between t and the target, that is when the target belongs to a later document than the one
the prediction is made in. The EOS itself stays a target: the model learns where documents end.

Each head's cross-entropy is the mean over its valid targets; the total is their weighted sum
(uniform weights of 1 = the paper's plain sum). Sums and counts are returned too, so callers
can add them across micro-batches and ranks before dividing (bits per byte).

Legend: B batch, T time, W window (T + n_future), K heads, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bytemtp.vocab import EOS, PAD

IGNORE = -100
LN2 = math.log(2)  # nats per bit: bits per byte = nats per byte / LN2


def future_targets(ids_BW: torch.Tensor, *, n_future: int, mask_after_eos: bool = True) -> torch.Tensor:
    """Targets (B, T, K) for the inputs ids_BW[:, :T], T = W - n_future (the window the model
    config states: seq_len + n_future); ignored entries are IGNORE (-100)."""
    B, W = ids_BW.shape
    T = W - n_future
    if T < 1:
        raise ValueError(f"a window of {W} ids holds no input for n_future={n_future}")
    targets_BTK = torch.stack([ids_BW[:, k + 1:k + 1 + T] for k in range(n_future)], dim=2)
    ignore = targets_BTK == PAD
    if mask_after_eos:
        # EOS count in ids[:, :j+1]; the EOS's strictly between t and t+k+1 number cum[t+k] - cum[t]
        cum = (ids_BW == EOS).cumsum(dim=1)
        between = torch.stack([cum[:, k:k + T] - cum[:, :T] for k in range(n_future)], dim=2)
        ignore |= between > 0
    return targets_BTK.masked_fill(ignore, IGNORE).long()


@dataclass
class HeadLoss:
    """One head's loss over one batch."""

    loss: torch.Tensor  # mean cross-entropy over valid targets, nats (0 when there are none)
    nats: torch.Tensor  # summed cross-entropy, nats
    correct: torch.Tensor  # valid targets whose argmax is right
    count: torch.Tensor  # valid targets


def head_loss(logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> HeadLoss:
    logits = logits_BTV.float().flatten(0, 1)
    targets = targets_BT.flatten()
    nats = F.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="sum")
    valid = targets != IGNORE
    count = valid.sum()
    with torch.no_grad():
        correct = ((logits.argmax(dim=-1) == targets) & valid).sum()
    return HeadLoss(loss=nats / count.clamp(min=1), nats=nats, correct=correct, count=count)


@dataclass
class LossOutput:
    """The weighted total and per-head figures (each (K,), detached) of one batch."""

    total: torch.Tensor
    head_loss: torch.Tensor
    head_accuracy: torch.Tensor
    head_nats: torch.Tensor
    head_count: torch.Tensor


def summarize(heads: list[HeadLoss], weights: list[float], total: torch.Tensor) -> LossOutput:
    count = torch.stack([h.count for h in heads]).detach()
    return LossOutput(
        total=total,
        head_loss=torch.stack([h.loss for h in heads]).detach(),
        head_accuracy=torch.stack([h.correct for h in heads]).float() / count.clamp(min=1),
        head_nats=torch.stack([h.nats for h in heads]).detach(),
        head_count=count,
    )


def mtp_loss(logits_BTKV: torch.Tensor, targets_BTK: torch.Tensor, weights: list[float]) -> LossOutput:
    """All heads at once: the plain reference for the memory-efficient step."""
    K = logits_BTKV.shape[2]
    assert len(weights) == K, (len(weights), K)
    heads = [head_loss(logits_BTKV[:, :, k], targets_BTK[:, :, k]) for k in range(K)]
    total = sum(w * h.loss for w, h in zip(weights, heads))
    return summarize(heads, weights, total)
