"""Benchmarks, measured as ratios within one run (shared machines are noisy).

`train_step` compares one optimizer step (forward, backward, AdamW) of three parameter-matched
variants of a preset: the next-byte baseline (n_future=1), the memory-efficient multi-token step
with n_future=8, and the plain all-heads step with n_future=8. Time: the three take steps in
turn in one process, so a change in the machine's speed hits all of them alike, and each reports
its median step. Memory: each variant builds and steps in a fresh subprocess, so its peak is its
own: on the CPU the peak resident set (VmHWM) minus the resident set before the model was built,
on CUDA `torch.cuda.max_memory_allocated`. Both count weights, gradients, optimizer state and
activations.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bytemtp.config import DataConfig, LossConfig, preset
from bytemtp import decode
from bytemtp.checkpoint import load_model
from bytemtp.corpus import CorpusError, corpus_files, decompressed_size, iter_documents
from bytemtp.evaluate import evaluate
from bytemtp.flops import peak_gpu_flops, step_flops
from bytemtp.loader import ByteLoader
from bytemtp.model import ByteMTP, KVCache
from bytemtp.step import forward_backward, plain_forward_backward
from bytemtp.vocab import EOS

TRAIN_STEP_VARIANTS = {  # name: (n_future, memory-efficient step)
    "ntp": (1, True),
    "mtp": (8, True),
    "mtp_plain": (8, False),
}

def _memory_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


class _Variant:
    """One parameter-matched variant of a preset, ready to step."""

    def __init__(self, preset_name: str, variant: str, *, batch_size: int, device: torch.device):
        n_future, efficient = TRAIN_STEP_VARIANTS[variant]
        self.cfg = cfg = dataclasses.replace(preset(preset_name).model, n_future=n_future)
        gen = torch.Generator().manual_seed(0)
        self.model = ByteMTP(cfg).to(device)
        self.model.init_weights(generator=gen)  # the same weights in every process
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, betas=(0.9, 0.95),
                                           weight_decay=0.1)
        ids = torch.randint(0, 256, (batch_size, cfg.seq_len + cfg.n_future), generator=gen)
        ids[:, ::97] = EOS  # a few document ends, as in packed data
        self.ids = ids.to(device)
        self.step_fn = forward_backward if efficient else plain_forward_backward
        self.device = device
        self.bytes_per_step = batch_size * cfg.seq_len

    def step(self) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            self.step_fn(self.model, self.ids, loss_cfg=LossConfig())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def peak_memory_mb(preset_name: str, variant: str, *, batch_size: int, device: str) -> float:
    """Peak memory of building one variant and taking two steps (run in a fresh process)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    base_kib = _memory_kib("VmRSS") if dev.type == "cpu" else 0
    v = _Variant(preset_name, variant, batch_size=batch_size, device=dev)
    for _ in range(2):
        v.step()
    v.sync()
    if dev.type == "cuda":
        return torch.cuda.max_memory_allocated(dev) / 2**20
    return (_memory_kib("VmHWM") - base_kib) / 1024


def _peak_memory_in_subprocess(args: dict) -> float:
    # glibc's mmap threshold pinned low, so freed activations go back to the system at once and
    # the resident set follows the live tensors (it slows allocation: never timed)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    proc = subprocess.run([sys.executable, "-m", "bytemtp.bench", json.dumps(args)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"memory run of {args['variant']} failed:\n{proc.stderr.strip()}")
    return float(proc.stdout.strip().splitlines()[-1])


def train_step(preset_name: str = "small", *, batch_size: int = 8, steps: int = 6, warmup: int = 2,
               device: str | None = None, progress=None) -> dict:
    """Time the three variants step by step in turn in this process (the median step of each),
    then measure each one's peak memory in a fresh subprocess; report the ratios."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    variants = {name: _Variant(preset_name, name, batch_size=batch_size, device=dev)
                for name in TRAIN_STEP_VARIANTS}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(warmup + steps):
        for name, v in variants.items():  # interleaved, so drifts in machine speed hit all alike
            v.sync()
            t0 = time.perf_counter()
            v.step()
            v.sync()
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
        if progress is not None:
            progress("warm-up" if i < warmup else "timing")
    result = {"preset": preset_name, "device": device, "batch_size": batch_size,
              "seq_len": variants["ntp"].cfg.seq_len, "steps": steps}
    peak_flops = peak_gpu_flops(dev)
    for name, v in variants.items():
        step_s = statistics.median(times[name])
        result[f"{name}_step_s"] = step_s
        result[f"{name}_bytes_s"] = v.bytes_per_step / step_s
        result[f"{name}_params"] = v.model.num_params()
        if peak_flops:
            flops = step_flops(v.model, v.bytes_per_step, v.cfg.seq_len)
            result[f"{name}_mfu"] = flops / step_s / peak_flops
    del variants
    for name in TRAIN_STEP_VARIANTS:
        args = {"preset_name": preset_name, "variant": name, "batch_size": batch_size, "device": device}
        result[f"{name}_peak_mb"] = _peak_memory_in_subprocess(args)
        if progress is not None:
            progress(f"memory {name}")
    result["time_ratio"] = result["mtp_step_s"] / result["ntp_step_s"]
    result["memory_ratio"] = result["mtp_peak_mb"] / result["ntp_peak_mb"]
    result["plain_memory_ratio"] = result["mtp_plain_peak_mb"] / result["ntp_peak_mb"]
    return result


def loader_throughput(path: str, *, seq_len: int = 2048, n_future: int = 8, batch_size: int = 8,
                      repeats: int = 3, progress=None) -> dict:
    """Decompressed MB/s that one process delivers as packed batches from one prepared shard,
    beside `zstd -dc` of the same file to /dev/null in the same run. Both divide the shard's
    decompressed size by their time, the best of `repeats` runs each: the loader's for one whole
    pass (read, split, parse, pack, shuffle, batch), zstd's for decompressing it."""
    files = [f for f in corpus_files(path, split="train") if str(f).endswith(".zst")]
    if not files:
        raise CorpusError(f"{path} holds no .zst shard; prepare one with `bytemtp prep`")
    shard = max(files, key=lambda f: f.stat().st_size)
    size = decompressed_size(shard)
    zstd = shutil.which("zstd")
    if zstd is None:
        raise CorpusError("the zstd command is not installed (apt-get install zstd); "
                          "the benchmark compares the loader against it")
    zstd_s, loader_s = [], []
    for _ in range(repeats):  # interleaved, so that a busy moment hits both
        with open(os.devnull, "wb") as sink:
            t0 = time.perf_counter()
            subprocess.run([zstd, "-dcq", str(shard)], stdout=sink, check=True)
            zstd_s.append(time.perf_counter() - t0)
        loader = ByteLoader(DataConfig(path=str(shard), batch_size=batch_size), seq_len=seq_len,
                            n_future=n_future)
        batches, t0 = 0, time.perf_counter()
        while loader.epoch == 0:
            next(loader)
            batches += 1
        loader_s.append(time.perf_counter() - t0)
        if progress is not None:
            progress()
    loader_mb_s, zstd_mb_s = size / min(loader_s) / 1e6, size / min(zstd_s) / 1e6
    return {"shard": str(shard), "decompressed_bytes": size, "compressed_bytes": shard.stat().st_size,
            "seq_len": seq_len, "batch_size": batch_size, "batches": batches, "repeats": repeats,
            "loader_s": min(loader_s), "zstd_s": min(zstd_s),
            "loader_mb_s": loader_mb_s, "zstd_mb_s": zstd_mb_s, "ratio": loader_mb_s / zstd_mb_s}


def quality(preset_name: str = "small", *, data: str = "data/corpus/stdlib", steps: int = 300,
            eval_batches: int = 100, out_dir: str | None = None, show_progress: bool = True) -> dict:
    """Train the preset with n_future=8 and the parameter-matched next-byte baseline on the same
    bytes (same steps, batch and data order), and compare validation bits per byte."""
    from bytemtp.train import train, val_data

    base = preset(preset_name)
    if val_data(dataclasses.replace(base.data, path=data)) is None:
        raise CorpusError(f"{data} has no val split; prepare it with `make corpus` or `bytemtp prep`")
    root = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="bytemtp-quality-"))
    results = {}
    for name, n_future in (("ntp", 1), ("mtp", 8)):
        cfg = dataclasses.replace(
            base, model=dataclasses.replace(base.model, n_future=n_future),
            data=dataclasses.replace(base.data, path=data),
            train=dataclasses.replace(base.train, steps=steps, max_bytes=0, max_time=0.0,
                                      eval_every=0, eval_batches=eval_batches))
        results[name] = train(cfg, root / name, show_progress=show_progress)
    bytes_seen = results["mtp"].bytes_seen
    return {"preset": preset_name, "data": data, "steps": steps, "bytes": bytes_seen,
            "eval_batches": eval_batches, "runs": str(root),
            "ntp_bpb": results["ntp"].val_bpb[0], "mtp_bpb": results["mtp"].val_bpb[0],
            "mtp_head_bpb": results["mtp"].val_bpb,
            "bpb_gap": results["mtp"].val_bpb[0] - results["ntp"].val_bpb[0]}


def val_prompts(data_path: str, *, n: int, prompt_bytes: int) -> list[bytes]:
    """The first `prompt_bytes` bytes of the first n documents of a corpus's val split that are
    at least that long: held-out prompts."""
    files = corpus_files(data_path, split="val")
    prompts = []
    for path in files:
        for doc in iter_documents(path):
            if len(doc) >= prompt_bytes:
                prompts.append(doc[:prompt_bytes])
                if len(prompts) == n:
                    return prompts
    if not prompts:
        raise CorpusError(f"the val split of {data_path} has no document of {prompt_bytes} bytes or more")
    return prompts


def _forward_cost_ratio(model: ByteMTP, k: int, *, repeats: int = 20) -> float:
    """Time of one speculative forward pass (k ids, k stacked heads) over one plain pass (one id,
    the next-byte head), both at the middle of the context with a cache: what a pass costs more."""
    cache = KVCache.for_model(model, batch_size=1)
    device = model.embed.weight.device
    stacked = model.stack_heads(k)
    with torch.inference_mode():
        model.logits(torch.full((1, model.config.seq_len // 2), EOS, device=device), cache, n_heads=k,
                     stacked=stacked)
        ids_1, ids_k = torch.zeros(1, 1, dtype=torch.long, device=device), torch.zeros(1, k, dtype=torch.long,
                                                                                     device=device)

        def plain() -> None:
            model.logits(ids_1, cache, n_heads=1)
            cache.rewind(1)

        def spec() -> None:
            model.logits(ids_k, cache, n_heads=k, stacked=stacked)
            cache.rewind(k)

        times = {plain: [], spec: []}
        for _ in range(3):
            plain(), spec()
        for _ in range(repeats):  # interleaved, so that a busy moment hits both
            for f in (plain, spec):
                _sync(device)
                t0 = time.perf_counter()
                f()
                _sync(device)
                times[f].append(time.perf_counter() - t0)
    return statistics.median(times[spec]) / statistics.median(times[plain])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode_speed(ckpt: str, *, prompts_path: str | None = None, n_prompts: int = 32, prompt_bytes: int = 128,
                 max_bytes: int = 512, batch_sizes=(1, 8), heads=(2, 4, None), device: str = "cpu",
                 dtype: str = "float32", progress=None) -> dict:
    """Plain greedy against self-speculative greedy on the same model and prompts, in one run.

    For each batch size, plain greedy (the one-row reference at batch 1, the batched loop with
    one byte a pass above) and speculative greedy with 2, 4 and all heads decode every prompt;
    the outputs must be identical. Bytes/s count generated bytes over wall time. The top-level
    keys describe the all-heads, batch-1 case: speedup = spec_bytes_s / greedy_bytes_s, and
    efficiency = speedup / bytes_per_forward, the share of the ideal speedup that is kept;
    forward_cost_ratio is what one speculative pass (k ids through the trunk and k heads) costs
    over a plain one (one id through the trunk and the next-byte head), which bounds efficiency
    from above at 1 / forward_cost_ratio.
    """
    dev = torch.device(device)
    model, cfg = load_model(ckpt, device=dev)
    model = model.to(getattr(torch, dtype))
    if prompts_path is not None:
        prompts = decode.load_prompts(prompts_path)[:n_prompts]
    else:
        prompts = val_prompts(cfg.data.path, n=n_prompts, prompt_bytes=min(prompt_bytes, model.config.seq_len // 2))
    longest = max(len(p) for p in prompts)
    out_bytes = min(max_bytes, model.config.seq_len - longest - 1)
    if out_bytes < 1:
        raise ValueError(f"prompts of {longest} bytes leave no room in the context of {model.config.seq_len}")
    n_future = model.config.n_future
    ks = sorted({n_future if k is None else min(k, n_future) for k in heads})
    cases = []
    for B in batch_sizes:
        batches = [prompts[i:i + B] for i in range(0, len(prompts), B)]

        def run(k: int | None):
            t0, outs, passes, row_passes = time.perf_counter(), [], 0, 0
            for batch in batches:
                if k is None and B == 1:
                    got = [decode.generate(model, batch[0], max_bytes=out_bytes)]
                else:
                    got = decode.generate_batch(model, batch, max_bytes=out_bytes, heads=k,
                                                speculative=k is not None)
                outs += [g.output for g in got]
                passes += max(g.stats.forward_passes for g in got)  # the batch's passes
                row_passes += sum(g.stats.forward_passes for g in got)  # ... that each row took part in
                if progress is not None:
                    progress()
            _sync(dev)
            wall = time.perf_counter() - t0
            return outs, sum(len(o) for o in outs) / wall, passes, row_passes

        plain, plain_bps, plain_passes, _ = run(None)
        for k in ks:
            spec, spec_bps, spec_passes, spec_row_passes = run(k)
            cases.append({"batch_size": B, "heads": k, "greedy_bytes_s": plain_bps, "spec_bytes_s": spec_bps,
                          "speedup": spec_bps / plain_bps,
                          "bytes_per_forward": sum(len(o) for o in spec) / max(1, spec_row_passes),
                          "forward_passes": spec_passes, "plain_forward_passes": plain_passes,
                          "identical": spec == plain})
            cases[-1]["efficiency"] = cases[-1]["speedup"] / cases[-1]["bytes_per_forward"]
    top = next(c for c in cases if c["batch_size"] == batch_sizes[0] and c["heads"] == n_future)
    return {"ckpt": str(ckpt), "device": str(dev), "dtype": dtype, "prompts": len(prompts),
            "prompt_bytes": longest, "max_bytes": out_bytes,
            **{key: top[key] for key in ("greedy_bytes_s", "spec_bytes_s", "speedup", "bytes_per_forward",
                                          "efficiency", "identical")},
            "forward_cost_ratio": _forward_cost_ratio(model, n_future),
            "all_identical": all(c["identical"] for c in cases), "cases": cases}


def all_benchmarks(*, ckpt: str, data: str = "data/corpus/stdlib", preset_name: str = "small",
                   device: str = "cpu", n_prompts: int = 32, eval_batches: int = 20, progress=None) -> dict:
    """The training step, the loader, decoding and evaluation in one run (under two minutes on
    two CPU cores with the `small` preset and the `make demo` run): each one's result under its
    name, and `summary`, the figures that BENCHMARKS.md tracks."""
    say = progress or (lambda name: None)
    say("train-step")
    step = train_step(preset_name, device=device)
    say("loader")
    loader = loader_throughput(data)
    say("decode")
    dec = decode_speed(ckpt, n_prompts=n_prompts, device=device)
    say("eval")
    model, cfg = load_model(ckpt, device=torch.device(device))
    ev = evaluate(model, cfg.data.path, batches=eval_batches, device=torch.device(device))
    k = model.config.n_future
    summary = {
        "train_step.time_ratio": step["time_ratio"], "train_step.memory_ratio": step["memory_ratio"],
        "loader.ratio": loader["ratio"], "loader.loader_mb_s": loader["loader_mb_s"],
        "decode.speedup": dec["speedup"], "decode.bytes_per_forward": dec["bytes_per_forward"],
        "decode.efficiency": dec["efficiency"], "decode.identical": dec["all_identical"],
        "eval.bpb_head1": ev["bpb"][0], f"eval.bytes_per_forward_{k}": ev["bytes_per_forward"][k],
    }
    return {"summary": summary, "train_step": step, "loader": loader, "decode": dec, "eval": ev}


if __name__ == "__main__":
    print(peak_memory_mb(**json.loads(sys.argv[1])))
