"""Run by torchrun from tests/test_distributed.py: `train` on two ranks where rank 1's third
step has a non-finite loss (the others' are finite); each rank then saves a digest of its weights."""

import dataclasses
import hashlib
import json
import os
import sys

import torch

from bytemtp import config_io
from bytemtp.training import train as train_lib


def main() -> None:
    corpus, run_dir, out = sys.argv[1:4]
    rank = int(os.environ["RANK"])
    real = train_lib.forward_backward
    calls = []

    def forward_backward(model, batch, **kw):
        result = real(model, batch, **kw)
        calls.append(1)
        if rank == 1 and len(calls) == 3:
            result = dataclasses.replace(result, total=torch.tensor(float("nan")))
        return result

    train_lib.forward_backward = forward_backward
    cfg = config_io.tiny()
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=corpus, batch_size=2),
                              train=dataclasses.replace(cfg.train, steps=5, log_every=1, eval_every=0,
                                                        eval_batches=1))
    captured = {}
    original_wrap = train_lib.dist_lib.wrap_model

    def wrap(model, d, parallel):
        captured["model"] = model
        return original_wrap(model, d, parallel)

    train_lib.dist_lib.wrap_model = wrap
    train_lib.train(cfg, run_dir, show_progress=False)
    digest = hashlib.sha256(b"".join(p.detach().double().numpy().tobytes()
                                     for p in captured["model"].parameters())).hexdigest()
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"digest": digest, "calls": len(calls)}, f)


if __name__ == "__main__":
    main()
