"""The multi-token loss. The future shift lives here and nowhere else.

A training window holds W = T + n_future ids. Position t (t < T) of the input is the model's
view of ids[:, :T]; head k (0-based) predicts ids[:, t + k + 1]. A target is ignored when it
lies past the window's end, when it is PAD, and (by default) when an EOS stands strictly
between t and the target, that is when the target belongs to a later document than the one
the prediction is made in. The EOS itself stays a target: the model learns where documents end.

Each head's cross-entropy is the mean over its valid targets; the total is their weighted sum
(uniform weights of 1 = the paper's plain sum). Sums and counts are returned too, so callers
can add them across micro-batches and ranks before dividing (bits per byte).

Head 1 as the teacher of the draft heads. Greedy self-speculative decoding keeps head k's byte
only when it equals head 1's choice where that byte is next, so what a draft head should learn is
head 1's distribution there, not just the data's byte. Head k at position t (0-based k) predicts
ids[t + k + 1], which head 1 predicts at position t + k. The teacher term of head k is the KL from
head 1's distribution at t + k (detached, at `Teacher.temperature`) to head k's at t, averaged
over the positions where both exist and the data target is valid (same document); its weight is
`Teacher.weight` (Hydra's "teacher loss", DeepSeek-V3's MTP fine-tuning, Medusa's
self-distillation). With `Teacher.divergence` "tv" the term is the total variation between the two
distributions instead, one minus the probability that speculative sampling accepts the head's draft
(Leviathan et al.): the acceptance objective. Each head also counts its agreement with head 1: its greedy byte equals head
1's at the shifted position, the event a greedy draft is accepted on.

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


@dataclass(frozen=True)
class Teacher:
    """Head 1 as the teacher of heads 2..n: the weight of the term (0: agreement is only counted),
    the temperature of head 1's distribution, and the weight left to the draft heads' data term."""

    weight: float = 0.0
    temperature: float = 1.0
    data_weight: float = 1.0
    divergence: str = "kl"  # or "tv": total variation, one minus the acceptance of speculative sampling


@dataclass
class Reference:
    """Head 1's detached view of a batch: its greedy bytes (B, T) and, when the teacher term is on,
    its log-probabilities at the teacher's temperature (B, T, V)."""

    greedy_BT: torch.Tensor
    logq_BTV: torch.Tensor | None


def reference(logits_BTV: torch.Tensor, teacher: Teacher) -> Reference:
    with torch.no_grad():
        logits = logits_BTV.detach().float()
        logq = F.log_softmax(logits / teacher.temperature, dim=-1) if teacher.weight else None
        return Reference(greedy_BT=logits.argmax(dim=-1), logq_BTV=logq)


@dataclass
class HeadLoss:
    """One head's loss over one batch."""

    loss: torch.Tensor  # mean cross-entropy over valid targets, nats (0 when there are none)
    nats: torch.Tensor  # summed cross-entropy, nats
    correct: torch.Tensor  # valid targets whose argmax is right
    count: torch.Tensor  # valid targets
    objective: torch.Tensor | None = None  # what the head trains on, before its head weight (None: loss)
    kl: torch.Tensor | None = None  # summed teacher divergence: KL in nats, or TV (heads 2..n with the teacher on)
    agree: torch.Tensor | None = None  # positions whose greedy byte equals head 1's there (heads 2..n)
    pairs: torch.Tensor | None = None  # positions where head 1 is there to compare with
    ran: bool = True  # False: the head did not run this step (its weight was 0); its figures are NaN

    @property
    def trained(self) -> torch.Tensor:
        return self.loss if self.objective is None else self.objective


def nats_and_greedy(logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The summed cross-entropy (nats, in float32) of logits against targets (IGNORE skipped),
    and the logits' greedy ids (B, T): what every head's loss needs of its logits. The eager
    reference of `compiled_nats_and_greedy`."""
    nats = F.cross_entropy(logits_BTV.float().flatten(0, 1), targets_BT.flatten(), ignore_index=IGNORE,
                           reduction="sum")
    return nats, logits_BTV.detach().argmax(dim=-1)


_compiled_core = None


def compiled_nats_and_greedy(logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`nats_and_greedy` through torch.compile (compiled training): the softmax, the loss, its
    backward and the argmax become a few fused loops instead of a dozen passes over the logits
    (on two CPU cores, forward and backward of 4,096 x 264 logits: about half the time)."""
    global _compiled_core
    if _compiled_core is None:
        _compiled_core = torch.compile(nats_and_greedy, dynamic=False)
    return _compiled_core(logits_BTV, targets_BT)


def head_loss(logits_BTV: torch.Tensor, targets_BT: torch.Tensor, *, k: int = 0, ref: Reference | None = None,
              teacher: Teacher = Teacher(), core=nats_and_greedy) -> HeadLoss:
    """Head k's (0-based) cross-entropy on the data and, given head 1's reference, its agreement
    with head 1 and its teacher term. Head 1's own loss (k = 0) is its cross-entropy alone.
    `core` computes the loss and greedy ids (`nats_and_greedy`, or its compiled form)."""
    nats, greedy_BT = core(logits_BTV, targets_BT)
    valid = targets_BT != IGNORE
    count = valid.sum()
    correct = ((greedy_BT == targets_BT) & valid).sum()
    h = HeadLoss(loss=nats / count.clamp(min=1), nats=nats, correct=correct, count=count)
    if k == 0 or ref is None:
        return h
    T = logits_BTV.shape[1]
    paired_BT = valid[:, :T - k]
    h.pairs = paired_BT.sum()
    h.agree = ((greedy_BT[:, :T - k] == ref.greedy_BT[:, k:]) & paired_BT).sum()
    objective = h.loss if teacher.data_weight == 1 else teacher.data_weight * h.loss
    if teacher.weight:
        mine_BTV = logits_BTV[:, :T - k].float()
        logq_BTV = ref.logq_BTV[:, k:]
        if teacher.divergence == "tv":
            kl_BT = 0.5 * (logq_BTV.exp() - F.softmax(mine_BTV, dim=-1)).abs().sum(dim=-1)
        else:
            kl_BT = (logq_BTV.exp() * (logq_BTV - F.log_softmax(mine_BTV, dim=-1))).sum(dim=-1)
        h.kl = (kl_BT * paired_BT).sum()
        objective = objective + teacher.weight * h.kl / h.pairs.clamp(min=1)
    h.objective = objective
    return h


@dataclass
class LossOutput:
    """The weighted total and per-head figures (each (K,), detached) of one batch. Agreement with
    head 1 and the teacher KL (nats) are 1 and 0 for head 1 itself."""

    total: torch.Tensor
    head_loss: torch.Tensor
    head_accuracy: torch.Tensor
    head_nats: torch.Tensor
    head_count: torch.Tensor
    head_agreement: torch.Tensor | None = None
    head_kl: torch.Tensor | None = None


def summarize(heads: list[HeadLoss], weights: list[float], total: torch.Tensor) -> LossOutput:
    count = torch.stack([h.count for h in heads]).detach()
    accuracy = torch.stack([h.correct for h in heads]).float() / count.clamp(min=1)
    for k in (k for k, h in enumerate(heads) if not h.ran):  # a fill each: no host list copied to the device
        accuracy[k] = float("nan")
    out = LossOutput(
        total=total,
        head_loss=torch.stack([h.loss for h in heads]).detach(),
        head_accuracy=accuracy,
        head_nats=torch.stack([h.nats for h in heads]).detach(),
        head_count=count,
    )
    if len(heads) > 1 and heads[1].pairs is not None:
        one, zero = torch.ones_like(out.head_loss), torch.zeros_like(out.head_loss)
        out.head_agreement = torch.stack([one[0]] + [h.agree.float() / h.pairs.clamp(min=1) for h in heads[1:]])
        out.head_kl = torch.stack([zero[0]] + [(h.kl.detach() if h.kl is not None else zero[0]) /
                                               h.pairs.clamp(min=1) for h in heads[1:]])
    return out


def total_of(heads: list[HeadLoss], weights: list[float]) -> torch.Tensor:
    """The weighted sum of what each head trains on (a head that did not run has weight 0)."""
    return sum(w * h.trained for w, h in zip(weights, heads) if h.ran)


def mtp_loss(logits_BTKV: torch.Tensor, targets_BTK: torch.Tensor, weights: list[float],
             teacher: Teacher = Teacher(), core=nats_and_greedy) -> LossOutput:
    """All heads at once: the plain reference for the memory-efficient step."""
    K = logits_BTKV.shape[2]
    assert len(weights) == K, (len(weights), K)
    ref = reference(logits_BTKV[:, :, 0], teacher)
    heads = [head_loss(logits_BTKV[:, :, k], targets_BTK[:, :, k], k=k, ref=ref, teacher=teacher, core=core)
             for k in range(K)]
    return summarize(heads, weights, total_of(heads, weights))
