"""Run by torchrun from tests/test_distributed.py: a run planned on two ranks, whose lock rank 0
itself holds (as another training would) when the ranks start it; each rank writes the error it
got, so that the test sees every rank stop with the holder's name."""

import contextlib
import dataclasses
import os
import sys

import torch

from bytemtp import config_io
from bytemtp.runtime import distributed as dist_lib
from bytemtp.training import runs
from bytemtp.training import train as train_lib


def main() -> None:
    corpus, run_dir, out = sys.argv[1:4]
    rank = int(os.environ["RANK"])
    cfg = config_io.tiny()
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=corpus, batch_size=2),
                              train=dataclasses.replace(cfg.train, steps=2, eval_batches=1))
    plan = runs.plan_config(cfg, run_dir)  # free when planned
    dist_lib.barrier(dist_lib.setup(torch.device("cpu")))  # on every rank
    with runs.run_lock(run_dir) if rank == 0 else contextlib.nullcontext():
        try:
            train_lib.run_plan(plan, show_progress=False)
            error = "no error"
        except runs.RunLocked as e:
            error = str(e)
    with open(f"{out}.{rank}", "w") as f:
        f.write(error)


if __name__ == "__main__":
    main()
