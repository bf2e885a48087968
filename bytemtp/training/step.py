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
from bytemtp.model.loss import (HeadLoss, LossOutput, Teacher, compiled_nats_and_greedy, future_targets, head_loss,
                                mtp_loss, nats_and_greedy, reference, summarize, total_of)
from bytemtp.model.model import Block, ByteMTP
from bytemtp.runtime.devices import rng_state, set_rng_state


def _targets(model: ByteMTP, ids_BW: torch.Tensor, loss_cfg: LossConfig) -> tuple[torch.Tensor, int]:
    """The targets (B, T, K) of a window and T, the inputs' length, which the window's shape gives."""
    targets_BTK = future_targets(ids_BW, n_future=model.config.n_future, mask_after_eos=loss_cfg.mask_after_eos)
    return targets_BTK, targets_BTK.shape[1]


def teacher_of(loss_cfg: LossConfig) -> Teacher:
    return Teacher(weight=loss_cfg.teacher_weight, temperature=loss_cfg.teacher_temperature,
                   data_weight=loss_cfg.draft_data_weight, divergence=loss_cfg.teacher_divergence)


def _core(compiled: bool):
    """What each head's loss computes its cross-entropy and greedy ids with: eager, or compiled."""
    return compiled_nats_and_greedy if compiled else nats_and_greedy


# train.compile=auto compiles a run expected to last at least this long (a time budget, or no limit)
# or to do at least this much arithmetic: compiling costs 5-15 s on two CPU cores (less from
# inductor's disk cache) and tens of seconds on a GPU, and saves a quarter of a CPU step
AUTO_COMPILE_S = 60.0
AUTO_COMPILE_FLOPS = {"cpu": 2e12, "cuda": 1e16}


def compiler_missing(device: torch.device) -> str | None:
    """Why torch.compile cannot train on `device` here (None: it can): inductor needs a C++
    compiler for the CPU."""
    import shutil

    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile does not run on this Python"
    if device.type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return "no C++ compiler (g++ or clang++) for inductor"
    return None


def compile_choice(tc, device: torch.device, *, flops_per_step: float, bytes_per_step: int) -> tuple[bool, str]:
    """Whether a run of settings `tc` (train.compile, its limits) trains compiled on `device`,
    and why, in words for the run's header. `on` where torch.compile cannot run is a ValueError."""
    if tc.compile == "off":
        return False, "off (eager)"
    missing = compiler_missing(device)
    if tc.compile == "on":
        if missing:
            raise ValueError(f"train.compile=on cannot compile here: {missing}; set train.compile=off or auto")
        return True, "on"
    if missing:
        return False, f"auto: off ({missing})"
    if device.type not in AUTO_COMPILE_FLOPS:
        return False, f"auto: off (not on {device.type})"
    steps = tc.steps or (-(-tc.max_bytes // bytes_per_step) if tc.max_bytes else 0)
    if tc.max_time >= AUTO_COMPILE_S or not (steps or tc.max_time):
        return True, "auto: on (" + (f"a time budget of {tc.max_time:g} s" if tc.max_time else "no step limit") + ")"
    work, least = steps * flops_per_step, AUTO_COMPILE_FLOPS[device.type]
    if work >= least:
        return True, f"auto: on ({steps:,} steps, {work:.1e} FLOP)"
    return False, f"auto: off (a short run: {steps:,} steps, {work:.1e} FLOP, under {least:.0e})"


def compile_blocks(model: ByteMTP) -> None:
    """Compiled training (train.compile): every transformer block of the trunk and the heads
    through torch.compile (one graph serves every block of a shape; inductor's disk cache keeps
    it between runs). The step functions take `compiled=True` to compile each head's loss too."""
    for module in model.modules():
        if isinstance(module, Block):
            module.compile()


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
    nan, zero = torch.full((), float("nan"), device=device), torch.zeros((), device=device, dtype=torch.long)
    return HeadLoss(loss=nan, nats=nan, correct=zero, count=zero, kl=nan, agree=nan,
                    pairs=torch.ones_like(zero), ran=False)


def forward_backward(model: ByteMTP, ids_BW: torch.Tensor, *, loss_cfg: LossConfig,
                     scale: float = 1.0, weights: list[float] | None = None, compiled: bool = False) -> LossOutput:
    """Memory-efficient multi-head forward and backward (paper Fig. 2)."""
    targets_BTK, T = _targets(model, ids_BW, loss_cfg)
    weights, teacher, core = _weights(model, loss_cfg, weights), teacher_of(loss_cfg), _core(compiled)
    ids_BT = ids_BW[:, :T]
    layout = build_layout(model, ids_BT)
    z_BTD = model(ids_BT, layout=layout)
    z_leaf = z_BTD.detach().requires_grad_(z_BTD.requires_grad)
    if model.config.head.chained:
        heads = _causal_heads_backward(model, z_leaf, targets_BTK, weights, teacher, scale, layout=layout, core=core)
    else:
        skip = skipped_heads(model, weights)
        heads, ref = {}, None
        # each head's graph freed before the next is made
        for k, h_BTD in model.head_states(z_leaf, layout=layout, skip=skip):
            logits_BTV = model.head_logits(k, h_BTD)
            ref = ref or reference(logits_BTV, teacher)
            h = head_loss(logits_BTV, targets_BTK[:, :, k], k=k, ref=ref, teacher=teacher, core=core)
            _backward([h.trained * (weights[k] * scale)], [None])
            heads[k] = _detached(h)
        heads = [heads[k] if k in heads else _skipped(k, z_leaf.device) for k in range(len(weights))]
    if z_BTD.requires_grad and z_leaf.grad is not None:
        z_BTD.backward(z_leaf.grad)
    return summarize(heads, weights, total_of(heads, weights))


def _causal_heads_backward(model: ByteMTP, z_leaf: torch.Tensor, targets_BTK: torch.Tensor,
                           weights: list[float], teacher: Teacher, scale: float, *,
                           layout: Layout, core=nats_and_greedy) -> list[HeadLoss]:
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
        h = head_loss(model.head_logits(k, h_BTD), targets_BTK[:, :, k], k=k, ref=ref, teacher=teacher, core=core)
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
                           scale: float = 1.0, weights: list[float] | None = None, compiled: bool = False) -> LossOutput:
    """All heads in one graph and one backward: the reference (and the memory-hungry path)."""
    targets_BTK, T = _targets(model, ids_BW, loss_cfg)
    ids_BT = ids_BW[:, :T]
    logits_BTKV = model.logits(ids_BT, layout=build_layout(model, ids_BT))
    weights = _weights(model, loss_cfg, weights)
    out = mtp_loss(logits_BTKV, targets_BTK, weights, teacher_of(loss_cfg), core=_core(compiled))
    if out.total.requires_grad:
        (out.total * scale).backward()
        _release(model, skipped_heads(model, weights))
    out.total = out.total.detach()
    return out


def draft_forward_backward(model: ByteMTP, ids_BW: torch.Tensor, *, loss_cfg: LossConfig,
                           scale: float = 1.0, weights: list[float] | None = None, compiled: bool = False) -> LossOutput:
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
    core = _core(compiled)
    heads = [head_loss(first_BTV.detach(), targets_BTK[:, :, 0], ref=ref, core=core)]
    heads += [head_loss(drafts_BTKV[:, :, d - 1], targets_BTK[:, :, d], k=d, ref=ref, teacher=teacher, core=core)
              for d in range(1, model.config.n_future)]
    drafted = sum(w * h.trained for w, h in zip(weights[1:], heads[1:]))
    _backward([drafted * scale], [None])
    return summarize([_detached(h) for h in heads], weights, total_of(heads, weights).detach())