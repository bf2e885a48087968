"""What the tests of training runs share: the tiny preset's run on a corpus (`tiny_cfg`), reading a
run's metrics and checkpoints back, and `bytemtp train` through click's runner. The corpus and a
short run with its checkpoint are fixtures in conftest.py (`corpus_dir`, `short_run`). Imported as a
plain module (`from train_runs import ...`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
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


# --- a `bytemtp train` process, watched and signalled ----------------------------------------------


def cli_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "bytemtp_cli", "train", *args]


def start_cli(args: list[str], log: Path) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(cli_cmd(*args), stdout=f, stderr=subprocess.STDOUT)


def signal_at_step(proc: subprocess.Popen, run_dir: Path, step: int, log: Path, sig: int) -> None:
    """Send `sig` once the run has logged `step`, and wait for it to end (killed if it hangs)."""
    try:
        wait_for_step(proc, run_dir, step, log)
        assert proc.poll() is None, "the run finished before the signal could be sent"
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def wait_for_step(proc: subprocess.Popen, run_dir: Path, step: int, log: Path, timeout: float = 120) -> int:
    """Poll metrics.jsonl until a complete line with a step >= `step` appears; return that step."""
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the run ended (status {proc.returncode}) before step {step}:\n"
                        f"{log.read_text()[-3000:]}")
        if metrics.exists():
            for line in reversed(metrics.read_text().splitlines()):
                try:
                    reached = json.loads(line)["step"]
                except ValueError:  # the line being written
                    continue
                if reached >= step:
                    return reached
                break
        time.sleep(0.005)
    proc.kill()
    pytest.fail(f"no step {step} in {metrics} after {timeout} s")
