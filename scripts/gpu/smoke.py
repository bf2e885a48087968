"""GPU check, part (a): every bytemtp command that takes --device, run on it for a few seconds each.

    python3 scripts/gpu/smoke.py [--out DIR] [--carry .gpu] [--dry-run]

A tiny model trained here on the checkout's own source (prep, then train, then tune-heads) is
what the other commands load; each command is PASS or FAIL (with its last error line) or SKIP
(with why), with its seconds, in one table, $OUT/smoke.json and $OUT/smoke.log. The gpu-marked
tests run last. Under 5 minutes on an H200 (an estimate until measured); `--dry-run` runs every
command on the CPU, eager, in about two minutes on two busy cores.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from part import ROOT, Outcome, Part, arguments, last_error_line

# the commands' sizes: seconds each on a GPU, tiny on the CPU
SIZES = {"gpu": dict(steps=20, tune_steps=10, batches=4, bytes=128, prompts=4, per_count=8, problems=4, decoded=2),
         "dry": dict(steps=2, tune_steps=2, batches=1, bytes=8, prompts=1, per_count=1, problems=2, decoded=0)}


def train_commands(p: Part, s: dict, dtype: str) -> Path:
    """prep, train (eager, and compiled briefly), tune-heads; returns the tuned run."""
    w, dev = p.work, p.device
    p.bytemtp("prep", "prep", str(ROOT / "bytemtp"), "--include", "*.py", "--out", str(w / "corpus"), "--val-fraction", "0.05")
    common = ["--preset", "tiny", "--data", str(w / "corpus"), "--device", dev, "--set", "train.eval_every=0",
              "--set", "train.eval_batches=1"]
    if dev != "cpu":
        common += ["--set", "train.precision=bf16"]
    p.bytemtp("train", "train", *common, "--out", str(w / "run"), "--steps", str(s["steps"]),
              "--set", "train.compile=off")
    if p.args.dry_run:
        p.skip("train compile=on", "dry run: compiling takes minutes on a CPU (the eager train above ran)")
    else:
        p.bytemtp("train compile=on", "train", *common, "--out", str(w / "run-compiled"), "--steps", "3",
                  "--set", "train.compile=on", timeout=300)
    p.bytemtp("tune-heads", "tune-heads", "--ckpt", str(w / "run"), "--out", str(w / "tuned"),
              "--steps", str(s["tune_steps"]), "--report-prompts", str(s["decoded"]), "--device", dev,
              "--json", str(w / "tune.json"))
    return w / "tuned"


def decode_commands(p: Part, s: dict, run: Path, dtype: str) -> None:
    """eval, generate (greedy, sampled), bench decode / train-step / serve."""
    dev, r, n = p.device, str(run), str(s["bytes"])
    p.bytemtp("eval", "eval", "--ckpt", r, "--batches", str(s["batches"]), "--decode-prompts", str(s["decoded"]),
              "--device", dev, "--dtype", dtype, "--json", str(p.work / "eval.json"))
    p.bytemtp("generate greedy", "generate", "--ckpt", r, "--prompt", "def main(", "--max-bytes", n, "--compare",
              "--device", dev, "--dtype", dtype, "--compile", "off")
    p.bytemtp("generate sampled", "generate", "--ckpt", r, "--prompt", "import os\n", "--max-bytes", n,
              "--temperature", "0.8", "--top-p", "0.95", "--seed", "1", "--stats", "--device", dev,
              "--dtype", dtype, "--compile", "off")
    p.bytemtp("bench decode", "bench", "decode", "--ckpt", r, "--n-prompts", str(s["prompts"]), "--max-bytes", n,
              "--batch-sizes", "1,2", "--draft", "auto,auto+lookup", "--rounds", "1", "--compile", "off",
              "--eval-batches", str(s["batches"]),
              "--device", dev, "--dtype", dtype, "--json", str(p.work / "decode.json"))
    p.bytemtp("bench train-step", "bench", "train-step", "--preset", "tiny", "--steps", "1", "--warmup", "1",
              "--min-sample-s", "0", "--batch-size", "2", "--compile", "off", "--device", dev,
              "--json", str(p.work / "train-step.json"))
    p.bytemtp("bench serve", "bench", "serve", "--ckpt", r, "--clients", "1,2", "--n-prompts", "2",
              "--max-bytes", n, "--rounds", "1", "--compile", "off", "--device", dev,
              "--json", str(p.work / "serve-bench.json"), timeout=180)


def experiment_commands(p: Part, s: dict) -> None:
    """bench tokens, quality and sweep, each shrunk to a few steps of the tiny preset."""
    w, dev, corpus = p.work, p.device, str(p.work / "corpus")
    p.bytemtp("bench tokens", "bench", "tokens", "--preset", "tiny", "--data", corpus, "--steps", "2",
              "--vocab", "300", "--n-prompts", "2", "--max-bytes", "16", "--batch-sizes", "1", "--rounds", "1",
              "--check-rounds", "1",
              "--compile", "off", "--out", str(w / "tokens"), "--device", dev, "--json", str(w / "tokens.json"))
    p.bytemtp("bench quality", "bench", "quality", "--preset", "tiny", "--data", corpus, "--steps", "2",
              "--seeds", "1", "--arms", "mtp", "--tune-time", "0s", "--eval-bytes", "2048", "--n-prompts", "2",
              "--out", str(w / "quality"), "--device", dev, "--json", str(w / "quality.json"))
    grid = w / "grid.toml"  # bench sweep has no --device: the grid's settings name it
    grid.write_text(f'preset = "tiny"\nsets = ["data.path={corpus}", "train.device={dev}", "train.eval_every=0", '
                    '"train.compile=off"]\n\n[[candidate]]\nname = "tiny"\nsets = []\n')
    p.bytemtp("bench sweep", "bench", "sweep", str(grid), "--out", str(w / "sweep"), "--time", "3s",
              "--eval-bytes", "2048", "--n-prompts", "2", "--json", str(w / "sweep.json"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(p: Part, run: Path, dtype: str) -> None:
    """`serve` started, one completion request over HTTP, stopped with SIGTERM."""
    port, t0 = free_port(), time.perf_counter()
    cmd = [sys.executable, "-m", "bytemtp_cli", "serve", "--ckpt", str(run), "--port", str(port), "--device",
           p.device, "--dtype", dtype, "--compile", "off"]
    p.log(f"\n## serve: {' '.join(cmd)}")
    log = open(p.work / "serve.log", "w+")
    server = subprocess.Popen(cmd, env=p.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url, note = f"http://127.0.0.1:{port}", ""
    try:
        note = _complete(url, server, deadline=t0 + 120)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            rc = server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            rc = "killed after 30 s"
        log.seek(0)
        output = log.read()
        log.close()
    p.log(output)
    if not note and rc not in (0, 130):
        note = f"the server exited with {rc} after SIGINT"
    status = "FAIL" if note else "PASS"
    if note and "exited" in note:
        note = f"{note}: {last_error_line(output)}"
    p.record(Outcome("serve", status, time.perf_counter() - t0, note=note, command=cmd))


def _complete(url: str, server: subprocess.Popen, *, deadline: float) -> str:
    """'' when /health answers and one completion comes back with text, else what went wrong."""
    while True:
        if server.poll() is not None:
            return f"the server exited with {server.returncode} before answering"
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5):
                break
        except OSError:
            if time.perf_counter() > deadline:
                return "no answer from /health in 120 s"
            time.sleep(0.5)
    body = json.dumps({"prompt": "def main(", "max_tokens": 16, "temperature": 0}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as answer:
            got = json.loads(answer.read())
    except OSError as e:
        return f"/v1/completions: {e}"
    text = got.get("choices", [{}])[0].get("text")
    return "" if isinstance(text, str) and got["usage"]["completion_tokens"] > 0 else f"odd answer: {got}"


if __name__ == "__main__":
    from smoke_tasks import task_commands

    args = arguments(__doc__.splitlines()[0])
    p = Part("smoke", args)
    sizes = SIZES["dry" if args.dry_run else "gpu"]
    dtype = "float32" if p.device == "cpu" else "bfloat16"
    if p.install_wheels().status == "FAIL":
        sys.exit(p.finish())
    tuned = train_commands(p, sizes, dtype)
    if not (tuned / "checkpoints").is_dir():  # what the rest loads: one FAIL above, not fifteen below
        for name in ("the commands that load the tuned run",):
            p.skip(name, f"{tuned} was not written (see prep, train and tune-heads above)")
        sys.exit(p.finish())
    decode_commands(p, sizes, tuned, dtype)
    experiment_commands(p, sizes)
    serve_command(p, tuned, dtype)
    task_commands(p, sizes, tuned, dtype)
    sys.exit(p.finish())
