"""Benchmarks, measured as ratios within one run (shared machines are noisy).

`train_step` times one optimizer step (forward, backward, AdamW) and its peak memory for three
parameter-matched variants of a preset: the next-byte baseline (n_future=1), the memory-efficient
multi-token step with n_future=8, and the plain all-heads step with n_future=8. Each variant runs
in a fresh subprocess so that its peak memory is its own: on the CPU the peak resident set of the
process (VmHWM) minus the resident set before the model was built, with glibc's mmap threshold
pinned so that freed activations go back to the system and the resident set tracks live tensors;
on CUDA `torch.cuda.max_memory_allocated`. Both count weights, gradients, optimizer state and
activations. Timing runs are separate from the memory runs, interleaved in rounds, and each
variant keeps its fastest round.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import torch

from bytemtp.config import LossConfig, preset
from bytemtp.model import ByteMTP
from bytemtp.step import forward_backward, plain_forward_backward
from bytemtp.vocab import EOS

TRAIN_STEP_VARIANTS = {  # name: (n_future, memory-efficient step)
    "ntp": (1, True),
    "mtp": (8, True),
    "mtp_plain": (8, False),
}

# dense bf16 peak of GPUs we know, for model FLOP utilisation
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}


def step_flops(model: ByteMTP, tokens: int, seq_len: int) -> float:
    """FLOPs of forward + backward: 6 per matmul parameter per token, plus causal attention."""
    cfg = model.config
    matmul_params = model.num_params() - model.num_params("embed")
    attention = 6 * cfg.total_layers * seq_len * cfg.d_model  # QK^T and AV, causal half, fwd + bwd
    return tokens * (6 * matmul_params + attention)


def _memory_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _peak_gpu_flops(device: torch.device) -> float | None:
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def run_train_step_variant(preset_name: str, variant: str, *, batch_size: int, steps: int,
                           warmup: int, device: str) -> dict:
    """Build one variant, warm it up, and time `steps` optimizer steps (runs in the subprocess)."""
    dev = torch.device(device)
    base_kib = _memory_kib("VmRSS") if dev.type == "cpu" else 0
    n_future, efficient = TRAIN_STEP_VARIANTS[variant]
    cfg = dataclasses.replace(preset(preset_name).model, n_future=n_future)
    gen = torch.Generator().manual_seed(0)
    model = ByteMTP(cfg).to(dev)
    model.init_weights(generator=gen)  # same weights for every run of this variant
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    window = cfg.seq_len + cfg.n_future
    ids = torch.randint(0, 256, (batch_size, window), generator=gen)
    ids[:, ::97] = EOS  # a few document ends, as in packed data
    ids = ids.to(dev)
    step_fn = forward_backward if efficient else plain_forward_backward
    loss_cfg = LossConfig()
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda")

    def one_step() -> None:
        with autocast:
            step_fn(model, ids, loss_cfg=loss_cfg)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        one_step()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        one_step()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    step_s = (time.perf_counter() - t0) / steps
    if dev.type == "cuda":
        peak_mb = torch.cuda.max_memory_allocated(dev) / 2**20
    else:
        peak_mb = (_memory_kib("VmHWM") - base_kib) / 1024
    result = {"variant": variant, "step_s": step_s, "peak_mb": peak_mb,
              "bytes_s": batch_size * cfg.seq_len / step_s, "params": model.num_params()}
    if dev.type == "cuda":
        peak = _peak_gpu_flops(dev)
        flops = step_flops(model, batch_size * cfg.seq_len, cfg.seq_len)
        result["mfu"] = flops / step_s / peak if peak else None
    return result


def _run_variant(args: dict, env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-m", "bytemtp.bench", json.dumps(args)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"train-step variant {args['variant']} failed:\n{proc.stderr.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def train_step(preset_name: str = "small", *, batch_size: int = 8, steps: int = 4, warmup: int = 1,
               rounds: int = 2, device: str | None = None, progress=None) -> dict:
    """Run the three variants in fresh subprocesses and report their ratios.

    Timing runs use the default allocator, `rounds` interleaved times, keeping each variant's
    fastest. On the CPU one more run per variant measures memory, with glibc's mmap threshold
    pinned low (that slows allocation, so it is never timed).
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    preset(preset_name)  # fail early on a bad name
    base = {"preset_name": preset_name, "batch_size": batch_size, "device": device}
    best: dict[str, dict] = {}
    for _ in range(rounds):
        for variant in TRAIN_STEP_VARIANTS:
            res = _run_variant({**base, "variant": variant, "steps": steps, "warmup": warmup},
                               dict(os.environ))
            if variant not in best or res["step_s"] < best[variant]["step_s"]:
                best[variant] = res
            if progress is not None:
                progress(variant, res)
    if device == "cpu":
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
        for variant in TRAIN_STEP_VARIANTS:
            res = _run_variant({**base, "variant": variant, "steps": 1, "warmup": 1}, env)
            best[variant]["peak_mb"] = res["peak_mb"]
            if progress is not None:
                progress(variant + " memory", res)
    ntp, mtp, plain = best["ntp"], best["mtp"], best["mtp_plain"]
    result = {
        "preset": preset_name, "device": device, "batch_size": batch_size,
        "seq_len": preset(preset_name).model.seq_len, "steps": steps, "rounds": rounds,
        "ntp_step_s": ntp["step_s"], "mtp_step_s": mtp["step_s"], "mtp_plain_step_s": plain["step_s"],
        "ntp_peak_mb": ntp["peak_mb"], "mtp_peak_mb": mtp["peak_mb"],
        "mtp_plain_peak_mb": plain["peak_mb"],
        "time_ratio": mtp["step_s"] / ntp["step_s"],
        "memory_ratio": mtp["peak_mb"] / ntp["peak_mb"],
        "plain_memory_ratio": plain["peak_mb"] / ntp["peak_mb"],
        "ntp_params": ntp["params"], "mtp_params": mtp["params"],
    }
    for name, res in (("ntp", ntp), ("mtp", mtp), ("mtp_plain", plain)):
        result[f"{name}_bytes_s"] = res["bytes_s"]
        if "mfu" in res:
            result[f"{name}_mfu"] = res["mfu"]
    return result


if __name__ == "__main__":
    print(json.dumps(run_train_step_variant(**json.loads(sys.argv[1]))))
