"""What the tests of training runs share: the tiny preset's run on a corpus (`tiny_cfg`), reading a
run's metrics and checkpoints back, and `bytemtp train` through click's runner. The corpus and a
short run with its checkpoint are fixtures in conftest.py (`corpus_dir`, `short_run`). Imported as a
plain module (`from train_runs import ...`)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from bytemtp import config as config_lib
from bytemtp import config_io
from bytemtp_cli.main import main

BATCH = 4
SEQ_LEN = 64  # the tiny preset's
BYTES_PER_STEP = BATCH * SEQ_LEN


def tiny_cfg(corpus_dir: Path, *sets: str) -> config_lib.Config:
    return config_io.resolve("tiny", overrides=[f"data.path={corpus_dir}", f"data.batch_size={BATCH}",
                                                 "train.log_every=1", *sets])


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def loss_lines(records: list[dict]) -> list[dict]:
    return [r for r in records if "loss" in r]


def ckpt_step(path: Path) -> int:
    return json.loads((path / "train_state.json").read_text())["step"]


def cli(*args: str):
    return CliRunner().invoke(main, ["train", *map(str, args)])
