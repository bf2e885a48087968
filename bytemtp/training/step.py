"""Forward and backward of one training batch: the memory-efficient head loop and its reference.

`forward_backward` is the paper's Figure 2 and the default: forward the trunk once, detach its
output z, then for each head in turn run forward, loss and backward, which accumulates the
head's gradient into z.grad and frees that head's activations and logits before the next head
starts; at the end, one backward through the trunk with the accumulated gradient. Peak memory
holds the trunk's activations plus one head's, instead of all n heads' (and their n logit
tensors); the price is n + 1 backward calls instead of one.

Causal heads (head k runs on head k-1's state) need the gradient from head k+1 before head k's
backward, so their loop first runs the heads forward without a graph, keeping only each head's
output state, then walks the heads backward from the last, recomputing each head's forward
(activation checkpointing of one head at a time) with the RNG replayed so dropout matches.

`plain_forward_backward` is the all-heads reference: one graph, one backward. Tests hold the two
to the same gradients for every head type.

Both take a window ids_BW of T + n_future ids and return the detached `LossOutput`; `scale`
multiplies the loss before backward (1 / accumulation steps) and `weights` are the heads' loss
weights this step (default: loss.head_weights's; a head schedule changes them as training goes,
`bytemtp.training.schedule.head_weights`). Each builds the batch's layout once
(`bytemtp.model.layout.build_layout`) and hands it to the trunk and to every head.

A head whose weight is 0 has nothing to learn this step, so the memory-efficient step does not run
it: an independent head is skipped, a causal one is when no later head has weight (its state feeds
the next head). Its own parameters get no gradient, in the reference too (its zeros are dropped),
so the optimizer leaves them as they are: given zeros, Muon would go on moving a faded head by its
orthogonalised momentum at full size, step after step, and AdamW would decay its weights. Its
figures this step are NaN, as nothing measured them. With dropout, a skipped head draws no random numbers,
so the later heads' dropout masks are not the reference's (the gradients are equal without dropout).

Head 1 runs first (in the causal loop, its logits come from the graph-free forward), so its
greedy bytes and, with the teacher term on, its detached distribution are at hand when each later
head makes its loss (`bytemtp.model.loss.Teacher`). Parameters that do not require gradients are frozen:
with the trunk and head 1 frozen (`tune-heads`) the trunk runs without a graph, head 1 only
teaches, and only the draft heads run backward.
"""

from __future__ import annotations

import torch

from bytemtp.config import LossConfig
from bytemtp.model.draft import forced_logits
from bytemtp.model.layout import Layout, build_layout
from bytemtp.model.loss import (HeadLoss, LossOutput, Teacher, future_targets, head_loss, mtp_loss, reference,
                                summarize, total_of)
from bytemtp.model.model import ByteMTP
from bytemtp.runtime.devices import rng_state, set_rng_state


def _targets(model: ByteMTP, ids_BW: torch.Tensor, loss_cfg: LossConfig) -> tuple[torch.Tensor, int]:
    """The targets (B, T, K) of a window and T, the inputs' length, which the window's shape gives."""
    targets_BTK = future_targets(ids_BW, n_future=model.config.n_future, mask_after_eos=loss_cfg.mask_after_eos)
    return targets_BTK, targets_BTK.shape[1]


def teacher_of(loss_cfg: LossConfig) -> Teacher:
    return Teacher(weight=loss_cfg.teacher_weight, temperature=loss_cfg.teacher_temperature,
                   data_weight=loss_cfg.draft_data_weight, divergence=loss_cfg.teacher_divergence)


def _detached(h: HeadLoss) -> HeadLoss:
    def d(t):
        return None if t is None else t.detach()
    return HeadLoss(loss=d(h.loss), nats=d(h.nats), correct=h.correct, count=h.count, objective=d(h.objective),
                    kl=d(h.kl), agree=h.agree, pairs=h.pairs)


def _backward(outputs: list[torch.Tensor], grads: list[torch.Tensor | None]) -> None:
    """Backward from the outputs that have a graph (none has one where everything before is frozen)."""
    pairs = [(o, g) for o, g in zip(outputs, grads) if o.requires_grad]
    if pairs:
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])


def _weights(model: ByteMTP, loss_cfg: LossConfig, weights: list[float] | None) -> list[float]:
    n = model.config.n_future
    weights = loss_cfg.weights(n) if weights is None else list(weights)
    if len(weights) != n or weights[0] <= 0:
        raise ValueError(f"expected {n} head weights, the first above 0; got {weights}")
    return weights


def skipped_heads(model: ByteMTP, weights: list[float]) -> frozenset[int]:
    """The heads that a step does not run for their weight of 0: every such independent head, and
    the causal heads after the last one with weight (a causal head's state feeds the next)."""
    return model.config.head.skipped(weights)


def _release(model: ByteMTP, skip: frozenset[int]) -> None:
    """No gradient for what only the skipped heads use (the reference's zeros become None, as the
    memory-efficient step leaves them): their layers and norms, and their own unembeddings."""
    own = len(model.unembed) > 1
    for k in skip:
        for module in (model.heads[k], *([model.unembed[k]] if own else [])):
            for p in module.parameters():
                p.grad = None


def _skipped(k: int, device: torch.device) -> HeadLoss:
    """Head k, skipped for its weight of 0: no gradient for its own parameters, NaN figures."""
    nan, zero = torch.tensor(float("nan"), device=device), torch.zeros((), device=device, dtype=torch.long)
    return HeadLoss(loss=nan, nats=nan, correct=zero, count=zero, kl=nan, agree=nan,
                    pairs=torch.ones_like(zero), ran=False)


def forward_backward(model: ByteMTP, ids_BW: torch.Tensor, *, loss_cfg: LossConfig,
                     scale: float = 1.0, weights: list[float] | None = None) -> LossOutput:
    """Memory-efficient multi-head forward and backward (paper Fig. 2)."""
    targets_BTK, T = _targets(model, ids_BW, loss_cfg)
    weights, teacher = _weights(model, loss_cfg, weights), teacher_of(loss_cfg)
    ids_BT = ids_BW[:, :T]
    layout = build_layout(model, ids_BT)
    z_BTD = model(ids_BT, layout=layout)
    z_leaf = z_BTD.detach().requires_grad_(z_BTD.requires_grad)
    if model.config.head.chained:
        heads = _causal_heads_backward(model, z_leaf, targets_BTK, weights, teacher, scale, layout=layout)
    else:
        skip = skipped_heads(model, weights)
        heads, ref = {}, None
        # each head's graph freed before the next is made
        for k, h_BTD in model.head_states(z_leaf, layout=layout, skip=skip):
            logits_BTV = model.head_logits(k, h_BTD)
            ref = ref or reference(logits_BTV, teacher)
            h = head_loss(logits_BTV, targets_BTK[:, :, k], k=k, ref=ref, teacher=teacher)
            _backward([h.trained * (weights[k] * scale)], [None])
            heads[k] = _detached(h)
        heads = [heads[k] if k in heads else _skipped(k, z_leaf.device) for k in range(len(weights))]
    if z_BTD.requires_grad and z_leaf.grad is not None:
        z_BTD.backward(z_leaf.grad)
    return summarize(heads, weights, total_of(heads, weights))


def _causal_heads_backward(model: ByteMTP, z_leaf: torch.Tensor, targets_BTK: torch.Tensor,
                           weights: list[float], teacher: Teacher, scale: float, *,
                           layout: Layout) -> list[HeadLoss]:
    device = z_leaf.device
    runs = min(skipped_heads(model, weights), default=len(weights))  # the heads after the last with weight are skipped
    states, rng = [], [rng_state(device)]  # rng[k]: the state before head k runs
    with torch.no_grad():
        for _, h_BTD in model.head_states(z_leaf, layout=layout, heads=runs):
            states.append(h_BTD)
            rng.append(rng_state(device))
        ref = reference(model.head_logits(0, states[0]), teacher)  # what head 1 says, before any head's backward
    rng_after = rng.pop()
    heads: list[HeadLoss] = [_skipped(k, device) for k in range(len(weights))]
    grad_out = None  # gradient reaching head k's output state from head k+1
    for k in reversed(range(runs)):
        set_rng_state(rng[k], device)
        x_BTD = z_leaf if k == 0 else states[k - 1].requires_grad_()
        h_BTD = model.head_state(k, model.head_input(k, z_leaf, x_BTD), layout=layout)
        h = head_loss(model.head_logits(k, h_BTD), targets_BTK[:, :, k], k=k, ref=ref, teacher=teacher)
        outputs, grads = [h.trained * (weights[k] * scale)], [None]
        if grad_out is not None:
            outputs.append(h_BTD)
            grads.append(grad_out)
        _backward(outputs, grads)
        grad_out = x_BTD.grad if k > 0 else None
        states[k] = None  # head k's state is no longer needed
        heads[k] = _detached(h)
    set_rng_state(rng_after, device)
    return heads


def plain_forward_backward(model: ByteMTP, ids_BW: torch.Tensor, *, loss_cfg: LossConfig,
                           scale: float = 1.0, weights: list[float] | None = None) -> LossOutput:
    """All heads in one graph and one backward: the reference (and the memory-hungry path)."""
    targets_BTK, T = _targets(model, ids_BW, loss_cfg)
    ids_BT = ids_BW[:, :T]
    logits_BTKV = model.logits(ids_BT, layout=build_layout(model, ids_BT))
    weights = _weights(model, loss_cfg, weights)
    out = mtp_loss(logits_BTKV, targets_BTK, weights, teacher_of(loss_cfg))
    if out.total.requires_grad:
        (out.total * scale).backward()
        _release(model, skipped_heads(model, weights))
    out.total = out.total.detach()
    return out


def draft_forward_backward(model: ByteMTP, ids_BW: torch.Tensor, *, loss_cfg: LossConfig,
                           scale: float = 1.0, weights: list[float] | None = None) -> LossOutput:
    """Forward and backward of a model's draft heads (`model.draft`, `bytemtp.model.draft`), the
    trunk and head 1 frozen: head 1's loss is reported, and draft depth d learns the byte d + 1
    ahead as training head d + 1 would, from the data and from head 1 as teacher. The draft heads
    are small, so all depths run in one graph."""
    targets_BTK, T = _targets(model, ids_BW, loss_cfg)
    weights, teacher = _weights(model, loss_cfg, weights), teacher_of(loss_cfg)
    layout = build_layout(model, ids_BW[:, :T])
    with torch.no_grad():
        z_BTD = model(ids_BW[:, :T], layout=layout)
    first_BTV, drafts_BTKV = forced_logits(model, ids_BW, T, layout=layout, z_BTD=z_BTD)
    ref = reference(first_BTV, teacher)
    heads = [head_loss(first_BTV.detach(), targets_BTK[:, :, 0], ref=ref)]
    heads += [head_loss(drafts_BTKV[:, :, d - 1], targets_BTK[:, :, d], k=d, ref=ref, teacher=teacher)
              for d in range(1, model.config.n_future)]
    drafted = sum(w * h.trained for w, h in zip(weights[1:], heads[1:]))
    _backward([drafted * scale], [None])
    return summarize([_detached(h) for h in heads], weights, total_of(heads, weights).detach())