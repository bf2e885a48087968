"""The optimizer, and which weights train from where: what a run's loop steps with (its
schedule is `bytemtp.training.schedule`'s).

`build_optimizer` builds, over the parameters that train, AdamW (fused on CUDA) with decoupled
weight decay on matrices only, or for train.optimizer=muon a `Mixed` optimizer: Muon (`BatchedMuon`,
torch's Muon with the matrices of a shape orthogonalised together) on the 2-D matrices of the trunk and the heads (attention and feed-forward; Newton-Schulz orthogonalises
each whole update, so FSDP2's sharded matrices are refused in the configuration) and AdamW on the
rest (the embedding, the norms and the unembeddings, which are not hidden matrices), each at its
own peak learning rate; `set_lr` sets each at the schedule's fraction of its peak.
`step_unless` takes a step that a device flag may cancel without the host reading it (fused
AdamW's `found_inf`, as torch's GradScaler uses it, and `BatchedMuon`'s own), where
`skips_on_device` says the optimizer can; the training loop's `StepGuard` uses it.
`set_trainable` freezes all but the draft heads for
train.trainable=draft-heads, and `start_from` loads train.init's weights into a new run's model
(the same model settings or an error naming those that differ).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from bytemtp.config import TrainConfig
from bytemtp.model.model import ByteMTP
from bytemtp.runtime.checkpoint import load_model, resolve_checkpoint


class BatchedMuon(torch.optim.Muon):
    """torch's Muon with the matrices of one shape orthogonalised together: their updates are
    stacked and the Newton-Schulz iteration runs as batched products (`baddbmm`), one set of
    calls a shape instead of one a matrix. The arithmetic is Muon's (the same bf16 iteration, the
    same learning-rate adjustment, decoupled weight decay and Nesterov momentum); its state is
    torch's Muon's, key for key, so checkpoints load into either. A model of small matrices (the
    `small` preset's are 64 wide) spends most of torch's Muon step in the calls' overhead: on two
    CPU cores this one takes about a fifth of its time. `torch.optim.Muon` is its reference.

    A `found_inf` attribute (a 0-dim float on the device, 1 to skip; `step_unless` sets it) cancels
    the step on the device: the momentum is lerped towards itself and the update masked to 0, so
    parameters and state stay bit for bit (non-finite gradients included), and with 0 the step is
    the unmasked one's, bit for bit."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, bufs = [], [], []
            self._init_group(group, params, grads, bufs)
            if not params:
                continue
            lr, wd, mu = float(group["lr"]), group["weight_decay"], group["momentum"]
            by_shape: dict[tuple, list[int]] = {}
            for i, p in enumerate(params):
                if p.grad.ndim != 2:
                    raise ValueError("Muon takes 2-D matrices only")
                by_shape.setdefault((tuple(p.shape), p.dtype, p.device), []).append(i)
            found = getattr(self, "found_inf", None)
            skip = None if found is None else found.to(device=params[0].device, dtype=torch.bool)
            if skip is not None:  # a skipped step's momentum moves towards itself: it stays
                grads = [torch.where(skip, b, g) for b, g in zip(bufs, grads)]
            torch._foreach_lerp_(bufs, grads, 1 - mu)
            updates = torch._foreach_lerp(grads, bufs, mu) if group["nesterov"] else bufs
            decay = 1 - lr * wd if skip is None else torch.where(skip, 1.0, 1 - lr * wd)
            for (shape, _, _), members in by_shape.items():
                stacked = torch.stack([updates[i] for i in members])
                ortho = _newton_schulz(stacked, group["ns_coefficients"], group["ns_steps"], group["eps"])
                if skip is not None:
                    ortho = torch.where(skip, 0, ortho)
                adjusted = lr * math.sqrt(max(1, shape[0] / shape[1])) if group["adjust_lr_fn"] in (None, "original") \
                    else lr * 0.2 * math.sqrt(max(shape))
                for j, i in enumerate(members):
                    params[i].mul_(decay)
                    params[i].add_(ortho[j], alpha=-adjusted)
        return loss


def _newton_schulz(G: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float) -> torch.Tensor:
    """torch's Muon's quintic Newton-Schulz iteration (`_zeropower_via_newtonschulz`) over a stack
    of matrices (N, rows, cols) at once, in bf16."""
    a, b, c = coefficients
    X = G.bfloat16()
    tall = G.size(1) > G.size(2)
    if tall:
        X = X.transpose(1, 2)
    X = X / X.flatten(1).norm(dim=1).clamp(min=eps)[:, None, None]
    for _ in range(steps):
        gram = X @ X.transpose(1, 2)
        update = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        X = torch.baddbmm(X, update, X, beta=a)
    return X.transpose(1, 2) if tall else X


def set_trainable(model: ByteMTP, trainable: str) -> None:
    """train.trainable: everything, or only what heads 2..n use (the embedding, the trunk and
    head 1 frozen, so the next-byte predictions stay exactly as they were)."""
    if trainable == "all":
        return
    if model.config.n_future < 2:
        raise ValueError("train.trainable=draft-heads needs draft heads: this model has model.n_future=1")
    model.requires_grad_(False)
    for module in model.draft_heads():
        module.requires_grad_(True)


def start_from(model: ByteMTP, init: str, device: torch.device) -> Path:
    """Load the weights of train.init (a checkpoint, or a run's newest) into a new run's model."""
    ckpt = resolve_checkpoint(init)
    source, cfg = load_model(ckpt, device=device)
    differ = [f"{k}={getattr(cfg.model, k)!r}" for k in vars(cfg.model)
              if getattr(cfg.model, k) != getattr(model.config, k) and k != "draft"]
    if differ:
        raise ValueError(f"train.init {ckpt} is a model of other settings (its {', '.join(differ)}); "
                         "a run starts from a checkpoint of the same model.* settings")
    if cfg.model.draft == model.config.draft:
        model.load_state_dict(source.state_dict())
    else:  # draft heads added (or others in their place): everything else the source's, the drafts head 1's copies
        state = {k: v for k, v in source.state_dict().items() if not k.startswith("drafter.")}
        missing, _ = model.load_state_dict(state, strict=False)
        assert all(k.startswith("drafter.") for k in missing), missing
        model.init_drafts()
    return ckpt


def build_optimizer(model: ByteMTP, cfg: TrainConfig, device: torch.device, *,
                    fused: bool | None = None) -> torch.optim.Optimizer | Mixed:
    """train.optimizer over the parameters that train: AdamW with weight decay on matrices only
    (fused on CUDA: one kernel for all parameters and a step that a device flag can skip; the CPU
    keeps the foreach form, the reference; `fused` overrides), or `Mixed` Muon on the trunk's and
    heads' matrices and AdamW on the rest."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    hidden = [p for n, p in named if cfg.optimizer == "muon" and p.dim() == 2 and n.startswith(("trunk.", "heads."))
              and not n.endswith("value_embed.weight")]  # a table looked up, like the embedding: AdamW's
    chosen = {id(p) for p in hidden}
    rest = [p for _, p in named if id(p) not in chosen]
    groups = [{"params": [p for p in rest if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}]
    adamw = torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                              fused=adamw_fused(device) if fused is None else fused)
    if not hidden:
        return adamw
    muon = BatchedMuon(hidden, lr=cfg.muon_lr, momentum=cfg.muon_momentum,
                            weight_decay=cfg.muon_weight_decay)
    return Mixed(adamw=adamw, muon=muon)


def adamw_fused(device: torch.device) -> bool:
    """Whether AdamW runs fused on `device`: on an accelerator (the CPU keeps the foreach reference)."""
    return device.type != "cpu"


def _parts(optimizer: torch.optim.Optimizer | Mixed) -> list[torch.optim.Optimizer]:
    return list(optimizer.optimizers.values()) if isinstance(optimizer, Mixed) else [optimizer]


def skips_on_device(optimizer: torch.optim.Optimizer | Mixed) -> bool:
    """Whether every part of the optimizer can cancel a step on a device flag (`step_unless`):
    fused AdamW and `BatchedMuon` can; foreach AdamW and torch's Muon cannot."""
    return all(isinstance(o, BatchedMuon) or (isinstance(o, torch.optim.Adam) and o.defaults.get("fused"))
               for o in _parts(optimizer))


def step_unless(optimizer: torch.optim.Optimizer | Mixed, skip: torch.Tensor) -> None:
    """One optimizer step, cancelled on the device where `skip` (a 0-dim bool tensor) is true:
    no parameter, moment or step count changes, and the host reads nothing. Needs
    `skips_on_device(optimizer)`."""
    assert skips_on_device(optimizer), "this optimizer cannot skip a step on the device"
    parts, found_inf = _parts(optimizer), skip.float()
    for o in parts:
        o.found_inf = found_inf
    try:
        optimizer.step()
    finally:
        for o in parts:
            del o.found_inf


def set_lr(optimizer: torch.optim.Optimizer | Mixed, scale: float, cfg: TrainConfig) -> None:
    """Every parameter group at `scale` times its optimizer's peak (train.lr, train.muon_lr)."""
    parts = optimizer.optimizers if isinstance(optimizer, Mixed) else {"adamw": optimizer}
    peaks = {"adamw": cfg.lr, "muon": cfg.muon_lr}
    for name, opt in parts.items():
        for group in opt.param_groups:
            group["lr"] = peaks[name] * scale


class Mixed:
    """Two optimizers over disjoint parameters that step as one: the loop, the checkpoint and
    the DDP wrapper see one optimizer (its param_groups are both's, AdamW's first). Its state dict
    holds each one's under its name, so a checkpoint of one kind does not load into the other."""

    def __init__(self, **optimizers: torch.optim.Optimizer):
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.optimizers.values() for g in opt.param_groups]

    def step(self) -> None:
        for opt in self.optimizers.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != set(self.optimizers):
            raise ValueError(f"it holds the state of {', '.join(sorted(state))}, and this run steps with "
                             f"{', '.join(sorted(self.optimizers))}")
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state[name])
