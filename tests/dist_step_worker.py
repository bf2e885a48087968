"""Run by torchrun from tests/test_distributed.py: for each case, a few optimizer steps of a tiny
float64 model on this rank's rows of fixed global batches, under DDP or FSDP2; rank 0 saves the
losses and the full final weights so that the test can hold them against one process on the
whole batches (`train_steps` with world=1 is that reference)."""

import dataclasses
import json
import sys

import torch

from bytemtp import config_io
from bytemtp.model.model import ByteMTP
from bytemtp.runtime import distributed as dist_lib
from bytemtp.training.optimizer import build_optimizer
from bytemtp.training.step import forward_backward, plain_forward_backward
from bytemtp.training.figures import accumulate_gradients

CASES = [  # parallel, head_type, unembed, memory_efficient, grad_accum
    ("ddp", "transformer", "replicated", True, 2),
    ("ddp", "causal", "shared", True, 1),
    ("ddp", "linear", "replicated", False, 2),
    ("fsdp", "transformer", "replicated", True, 2),
    ("fsdp", "transformer", "shared", True, 1),
    ("fsdp", "causal", "replicated", True, 2),
    ("fsdp", "linear", "shared", False, 1),
]


def batches(cfg, steps: int, accum: int, global_batch: int = 4) -> list[list[torch.Tensor]]:
    """Fixed windows of byte ids without EOS or PAD, so that every row has as many targets (the
    average of the ranks' mean losses is then the mean loss of the whole batch)."""
    g = torch.Generator().manual_seed(11)
    W = cfg.model.seq_len + cfg.model.n_future
    return [[torch.randint(0, 256, (global_batch, W), generator=g) for _ in range(accum)] for _ in range(steps)]


def build(head_type: str, unembed: str):
    cfg = config_io.tiny()
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, head_type=head_type, unembed=unembed,
                                                             n_future=4, dropout=0.0, seq_len=32),
                              train=dataclasses.replace(cfg.train, lr=1e-2, weight_decay=0.1))
    model = ByteMTP(cfg.model).double()
    model.init_weights(generator=torch.Generator().manual_seed(3))
    return cfg, model


def train_steps(model, wrapped, cfg, data, *, memory_efficient: bool, d: dist_lib.Dist) -> list[float]:
    """The training loop's step (`accumulate_gradients` on this rank's rows), clip, AdamW."""
    step_fn = forward_backward if memory_efficient else plain_forward_backward
    optimizer = build_optimizer(model, cfg.train, torch.device("cpu"))
    params = list(model.parameters())
    losses = []
    for micro_batches in data:
        rows = (batch.chunk(d.world_size)[d.rank] for batch in micro_batches)
        figures = accumulate_gradients(model, wrapped, rows, step_fn=step_fn, loss_cfg=cfg.loss,
                                       accum=len(micro_batches), d=d)
        losses.append(float(figures.total))
        dist_lib.local(torch.nn.utils.clip_grad_norm_(params, 1.0))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return losses


def main() -> None:
    out = sys.argv[1]
    d = dist_lib.setup(torch.device("cpu"))
    results = []
    for parallel, head_type, unembed, memory_efficient, accum in CASES:
        cfg, model = build(head_type, unembed)
        wrapped = dist_lib.wrap_model(model, d, parallel)
        losses = train_steps(model, wrapped, cfg, batches(cfg, 3, accum), memory_efficient=memory_efficient, d=d)
        weights, _ = dist_lib.full_state(wrapped, None)
        results.append({"losses": losses, "weights": {k: v.detach().cpu().clone() for k, v in weights.items()}})
    if d.is_main:
        torch.save(results, out)
    print(json.dumps({"rank": d.rank, "cases": len(results)}))
    dist_lib.teardown()


if __name__ == "__main__":
    main()
