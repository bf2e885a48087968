"""Benchmarks, measured as ratios within one run (shared machines are noisy).

`train_step` compares one training step as `bytemtp train` takes it (forward, backward, gradient
clipping, and the optimizer that `optimizer.build_optimizer` builds from the preset) of three
parameter-matched variants of a preset: the next-byte baseline (n_future=1), the memory-efficient
multi-token step with n_future=8, and the plain all-heads step with n_future=8.

Time: after warm-up steps, the three take turns in one process for a number of rounds, the order
rotating from round to round, so a change in the machine's speed hits all of them alike. A round's
sample of a variant repeats its step until the sample lasts `min_sample_s` (judged in the warm-up),
so that a fast preset is not timed below the machine's scheduling jitter. Each variant reports its
median step; `time_ratio` is the memory-efficient multi-token median over the next-byte one. Its
spread is the pair ratios, one a round (multi-token over next-byte time in the same round): their
min, median and max. A result whose pair ratios spread over more than `NOISY_SPREAD` of their
median, or that has fewer than `MIN_ROUNDS` of them, is flagged as too noisy to mean anything
(`time_ratio_noisy` and a note): the targets in BENCHMARKS.md need the ratio to about 10%.

Memory: each variant builds and steps in a fresh subprocess, so its peak is its own: on the CPU the
peak resident set (VmHWM) minus the resident set before the model was built, on CUDA
`torch.cuda.max_memory_allocated`. Both count weights, gradients, optimizer state and activations.

Each benchmark returns a frozen dataclass (`TrainStepResult`, `LoaderThroughput`, `DecodeSpeed`,
`ServeSpeed`, `AllBenchmarks`) whose JSON form (`to_json`, read back by `from_json`) is what its
command's `--json` writes, key for key and in order.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

import torch

from bytemtp.config import DataConfig, ModelConfig, preset
from bytemtp.data.compression import decompressed_size
from bytemtp.data.corpus import corpus_files
from bytemtp.data.loader import ByteLoader
from bytemtp.data.shards import CorpusError
from bytemtp.decoding import decode
from bytemtp.decoding.generation import load_prompts
from bytemtp.decoding.repetition import Repetition, RepetitionFigures
from bytemtp.decoding.speed import SpeedFigures, interleaved_decodes, speed_figures
from bytemtp.decoding.strategy import DECODE_MODES, Draft
from bytemtp.evaluation.evaluate import EvalResult, evaluate, held_out_split, val_continuations
from bytemtp.model.flops import peak_gpu_flops, step_flops
from bytemtp.model.model import ByteMTP
from bytemtp.runtime.checkpoint import load_model
from bytemtp.runtime.devices import autocast, synchronize
from bytemtp.training.step import forward_backward, plain_forward_backward
from bytemtp.training.optimizer import build_optimizer
from bytemtp.vocab import EOS

TRAIN_STEP_VARIANTS = {  # name: (n_future, memory-efficient step)
    "ntp": (1, True),
    "mtp": (8, True),
    "mtp_plain": (8, False),
}
NOISY_SPREAD = 0.2  # (max - min) / median of the pair ratios above this: the time ratio is noise
MIN_ROUNDS = 3  # fewer pair ratios than this say nothing about their spread


@dataclasses.dataclass(frozen=True)
class RatioSpread:
    """Pair ratios, one a round (`ratio_spread`): their range, and whether they mean anything."""
    min: float
    median: float
    max: float
    runs: list[float]  # the ratios in order
    spread: float  # (max - min) / median
    noisy: bool  # too few rounds to judge, or a spread over NOISY_SPREAD
    note: str | None  # why it is noisy; None when it is not

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> RatioSpread:
        return cls(**{**data, "runs": list(data["runs"])})


@dataclasses.dataclass(frozen=True)
class VariantStep:
    """One variant's training step (`train_step`)."""
    step_s: float  # the median seconds a step
    bytes_s: float  # bytes a second at that median
    params: int
    peak_mb: float  # peak memory of building it and taking two steps, in a fresh process
    mfu: float | None = None  # model FLOPs utilisation, where the device's peak is known


@dataclasses.dataclass(frozen=True)
class TrainStepResult:
    """The variants' steps and their ratios (`train_step`). Its JSON form is flat, as `bench
    train-step --json` has always written it: the settings, `{variant}_{figure}` keys, then the
    ratios and `time_ratio_{min,median,max,runs,spread,noisy,note}`."""
    preset: str
    device: str
    batch_size: int
    seq_len: int
    steps: int  # timed rounds
    warmup: int  # untimed rounds
    steps_per_sample: int  # steps a timed sample repeats
    variants: dict[str, VariantStep]  # by TRAIN_STEP_VARIANTS name, in its order
    time_ratio_rounds: RatioSpread  # the memory-efficient 8-head step over the next-byte one, round by round

    @property
    def time_ratio(self) -> float:
        """The memory-efficient 8-head median step over the next-byte one."""
        return self.variants["mtp"].step_s / self.variants["ntp"].step_s

    @property
    def memory_ratio(self) -> float:
        return self.variants["mtp"].peak_mb / self.variants["ntp"].peak_mb

    @property
    def plain_memory_ratio(self) -> float:
        """The plain (all heads at once) 8-head step's peak over the next-byte one's."""
        return self.variants["mtp_plain"].peak_mb / self.variants["ntp"].peak_mb

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)[:7]}
        for name, v in self.variants.items():
            out.update({f"{name}_step_s": v.step_s, f"{name}_bytes_s": v.bytes_s, f"{name}_params": v.params})
            if v.mfu is not None:
                out[f"{name}_mfu"] = v.mfu
        out.update({f"{name}_peak_mb": v.peak_mb for name, v in self.variants.items()})
        out["time_ratio"] = self.time_ratio
        out.update({f"time_ratio_{key}": value for key, value in self.time_ratio_rounds.to_json().items()})
        out.update(memory_ratio=self.memory_ratio, plain_memory_ratio=self.plain_memory_ratio)
        return out

    @classmethod
    def from_json(cls, data: dict) -> TrainStepResult:
        names = [key.removesuffix("_step_s") for key in data if key.endswith("_step_s")]
        variants = {n: VariantStep(step_s=data[f"{n}_step_s"], bytes_s=data[f"{n}_bytes_s"], params=data[f"{n}_params"],
                                   peak_mb=data[f"{n}_peak_mb"], mfu=data.get(f"{n}_mfu")) for n in names}
        rounds = {f.name: data[f"time_ratio_{f.name}"] for f in dataclasses.fields(RatioSpread)}
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)[:7]}, variants=variants,
                   time_ratio_rounds=RatioSpread.from_json(rounds))


@dataclasses.dataclass(frozen=True)
class VsThroughput:
    """The loader's epochs of another corpus with the same documents, beside it on the shard."""
    path: str
    files: int
    document_bytes: int  # an epoch's document bytes, as the loader counts them
    s: float  # the fastest epoch's seconds
    mb_s: float  # document MB a second in that epoch
    ratio: float  # mb_s over the loader's on the shard, best against best
    pair_ratios: list[float]  # run by run (its time as if it had the shard's bytes), sorted


@dataclasses.dataclass(frozen=True)
class LoaderThroughput:
    """The loader on one prepared shard beside `zstd -dc` of it (`loader_throughput`)."""
    shard: str
    decompressed_bytes: int
    compressed_bytes: int
    seq_len: int
    batch_size: int
    batches: int  # batches of the last epoch timed (the vs corpus's, where there is one)
    repeats: int
    loader_s: float  # the fastest epoch
    zstd_s: float  # the fastest `zstd -dc`
    loader_mb_s: float  # decompressed MB a second
    zstd_mb_s: float
    ratio: float  # loader_mb_s / zstd_mb_s
    pair_ratios: list[float]  # zstd's time over the loader's, run by run, sorted
    vs: VsThroughput | None = None

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        if self.vs is None:
            del out["vs"]
        return out

    @classmethod
    def from_json(cls, data: dict) -> LoaderThroughput:
        vs = data.get("vs")
        return cls(**{**data, "pair_ratios": list(data["pair_ratios"]),
                      "vs": None if vs is None else VsThroughput(**{**vs, "pair_ratios": list(vs["pair_ratios"])})})


def repetition_from_json(data: dict) -> Repetition:
    """A `Repetition` in its JSON form (`dataclasses.asdict`) read back."""
    def figures(f: dict | None) -> RepetitionFigures | None:
        return None if f is None else RepetitionFigures(**f)
    return Repetition(decoded=figures(data["decoded"]), real=figures(data.get("real")),
                      zstd_ratio_over_real=data.get("zstd_ratio_over_real"))


def _speed_figures_from_json(data: dict) -> SpeedFigures:
    """`SpeedFigures.to_json` read back (its other keys ignored; JSON's string keys of `heads_used` as ints)."""
    fields = {f.name: data[f.name] for f in dataclasses.fields(SpeedFigures)}
    return SpeedFigures(**{**fields, "speedup_runs": list(data["speedup_runs"]),
                           "heads_used": {int(k): n for k, n in data["heads_used"].items()},
                           "shapes": dict(data["shapes"]), "repetition": repetition_from_json(data["repetition"])})


@dataclasses.dataclass(frozen=True)
class DecodeCase:
    """One mode at one batch size (`decode_speed`): its figures against plain decoding on the
    decoder's step, and where that step is the compiled one, against eager plain decoding too."""
    batch_size: int
    figures: SpeedFigures  # compiled: `identical` holds only if compiled plain's output is eager plain's too
    eager_plain_bytes_s: float | None = None  # compiled only: eager plain decoding, the baseline
    eager_speedup: float | None = None  # compiled only: the mode over eager plain
    compiled_plain_speedup: float | None = None  # compiled only: compiled plain over eager plain

    def to_json(self) -> dict:
        out = {"batch_size": self.batch_size, **self.figures.to_json()}
        if self.eager_plain_bytes_s is not None:
            out.update(eager_plain_bytes_s=self.eager_plain_bytes_s, eager_speedup=self.eager_speedup,
                       compiled_plain_speedup=self.compiled_plain_speedup)
        return out

    @classmethod
    def from_json(cls, data: dict) -> DecodeCase:
        return cls(batch_size=data["batch_size"], figures=_speed_figures_from_json(data),
                   eager_plain_bytes_s=data.get("eager_plain_bytes_s"), eager_speedup=data.get("eager_speedup"),
                   compiled_plain_speedup=data.get("compiled_plain_speedup"))


@dataclasses.dataclass(frozen=True)
class DecodeSpeed:
    """Plain against self-speculative greedy decoding in several modes (`decode_speed`). Its JSON
    form (`bench decode --json`) also carries the `top` case's figures at the top level."""
    ckpt: str
    device: str
    dtype: str
    prompts: int
    prompt_bytes: int  # the longest prompt's
    max_bytes: int  # output bytes a prompt
    rounds: int
    val_bpb: float | None  # the model's held-out bits per byte, next-byte head (None: not evaluated)
    compile: str  # "on" or "off": whether the passes ran the compiled static step
    compile_stats: dict | None  # what compiling cost (`StaticStep.stats`); None: no static step made
    pass_costs_ms: dict[str, float]  # the pass costs at the first batch size (`PassCosts.to_dict`)
    cases: list[DecodeCase]  # batch size by batch size, mode by mode

    @property
    def top(self) -> DecodeCase:
        """The case that the top-level figures describe: auto at the first batch size, or the first
        mode measured there."""
        first = [c for c in self.cases if c.batch_size == self.cases[0].batch_size]
        return next((c for c in first if c.figures.mode == "auto"), first[0])

    @property
    def all_identical(self) -> bool:
        return all(c.figures.identical for c in self.cases)

    def to_json(self) -> dict:
        top = self.top.to_json()
        keys = ("speedup", "speedup_min", "speedup_max", "bytes_per_forward", "pass_cost", "identical",
                "plain_bytes_s", "spec_bytes_s", "repetition")
        if self.compile == "on":
            keys += ("eager_plain_bytes_s", "eager_speedup", "compiled_plain_speedup")
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)[:9]}, **{k: top[k] for k in keys},
                "compile_stats": self.compile_stats, "pass_costs_ms": self.pass_costs_ms,
                "all_identical": self.all_identical, "cases": [c.to_json() for c in self.cases]}

    @classmethod
    def from_json(cls, data: dict) -> DecodeSpeed:
        """A `bench decode --json` file read back (the top case's figures come from its case)."""
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)[:11]},
                   cases=[DecodeCase.from_json(c) for c in data["cases"]])

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
        base = preset(preset_name)
        self.cfg = cfg = dataclasses.replace(base.model, n_future=n_future)
        self.loss_cfg, self.grad_clip = base.loss, base.train.grad_clip
        gen = torch.Generator().manual_seed(0)
        self.model = ByteMTP(cfg).to(device)
        self.model.init_weights(generator=gen)  # the same weights in every process
        self.optimizer = build_optimizer(self.model, base.train, device)
        ids = torch.randint(0, 256, (batch_size, cfg.seq_len + cfg.n_future), generator=gen)
        ids[:, ::97] = EOS  # a few document ends, as in packed data
        self.ids = ids.to(device)
        self.step_fn = forward_backward if efficient else plain_forward_backward
        self.device, self.precision = device, base.train.precision
        self.bytes_per_step = batch_size * cfg.seq_len

    def step(self) -> None:
        """One training step, as the training loop takes it (one micro-batch)."""
        with autocast(self.device, self.precision):
            self.step_fn(self.model, self.ids, loss_cfg=self.loss_cfg)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip or float("inf"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def sync(self) -> None:
        synchronize(self.device)


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
    proc = subprocess.run([sys.executable, "-m", "bytemtp.experiments.bench", json.dumps(args)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"memory run of {args['variant']} failed:\n{proc.stderr.strip()}")
    return float(proc.stdout.strip().splitlines()[-1])


def _timed_rounds(variants: dict[str, _Variant], *, rounds: int, warmup: int, min_sample_s: float,
                  progress=None) -> tuple[dict[str, list[float]], int]:
    """Seconds per step of each variant in each round, and the steps a sample repeated. The
    variants take turns, the order rotating each round; the warm-up rounds take one step each and
    decide how many steps a sample repeats (enough for the fastest variant to last min_sample_s)."""
    names = list(variants)
    warm: dict[str, float] = {}
    for _ in range(warmup):
        for name in names:
            warm[name] = _time_steps(variants[name], 1)
        if progress is not None:
            progress("warm-up")
    repeats = max(1, math.ceil(min_sample_s / min(warm.values()))) if warm else 1
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(_time_steps(variants[name], repeats) / repeats)
        if progress is not None:
            progress("timing")
    return times, repeats


def _time_steps(v: _Variant, n: int) -> float:
    v.sync()
    t0 = time.perf_counter()
    for _ in range(n):
        v.step()
    v.sync()
    return time.perf_counter() - t0


def ratio_spread(ratios: list[float]) -> RatioSpread:
    """The spread of pair ratios (one a round): min, median, max, the ratios in order, (max - min)
    / median, and whether the result is too noisy to mean anything, with a note that says why."""
    ratios = sorted(ratios)
    median = statistics.median(ratios)
    spread = (ratios[-1] - ratios[0]) / median
    note = None
    if len(ratios) < MIN_ROUNDS:
        note = (f"{len(ratios)} timed round(s) cannot show how noisy the time ratio is; "
                f"take {MIN_ROUNDS} or more (`bytemtp bench train-step --steps`)")
    elif spread > NOISY_SPREAD:
        note = (f"the time ratio is noise: its pair ratios run from {ratios[0]:.3f} to {ratios[-1]:.3f}, "
                f"{100 * spread:.0f}% of their median (more than {100 * NOISY_SPREAD:.0f}%); rerun on a "
                "quieter machine or with more rounds (`bytemtp bench train-step --steps`)")
    return RatioSpread(min=ratios[0], median=median, max=ratios[-1], runs=ratios, spread=spread,
                       noisy=note is not None, note=note)


def train_step(preset_name: str = "small", *, batch_size: int = 8, steps: int = 6, warmup: int = 2,
               min_sample_s: float = 0.2, device: str | None = None, progress=None) -> TrainStepResult:
    """Time the three variants in `steps` interleaved rounds after `warmup` rounds (the module doc
    says how), then measure each one's peak memory in a fresh subprocess; report the ratios and the
    spread of the time ratio."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    variants = {name: _Variant(preset_name, name, batch_size=batch_size, device=dev)
                for name in TRAIN_STEP_VARIANTS}
    times, repeats = _timed_rounds(variants, rounds=steps, warmup=warmup, min_sample_s=min_sample_s,
                                   progress=progress)
    seq_len, peak_flops, timed = variants["ntp"].cfg.seq_len, peak_gpu_flops(dev), {}
    for name, v in variants.items():
        step_s = statistics.median(times[name])
        mfu = step_flops(v.model, v.bytes_per_step, v.cfg.seq_len) / step_s / peak_flops if peak_flops else None
        timed[name] = (step_s, v.bytes_per_step / step_s, v.model.num_params(), mfu)
    del variants
    steps_of = {}
    for name in TRAIN_STEP_VARIANTS:
        args = {"preset_name": preset_name, "variant": name, "batch_size": batch_size, "device": device}
        step_s, bytes_s, params, mfu = timed[name]
        steps_of[name] = VariantStep(step_s=step_s, bytes_s=bytes_s, params=params, mfu=mfu,
                                     peak_mb=_peak_memory_in_subprocess(args))
        if progress is not None:
            progress(f"memory {name}")
    return TrainStepResult(preset=preset_name, device=device, batch_size=batch_size, seq_len=seq_len, steps=steps,
                           warmup=warmup, steps_per_sample=repeats, variants=steps_of,
                           time_ratio_rounds=ratio_spread([m / n for m, n in zip(times["mtp"], times["ntp"])]))


def loader_throughput(path: str, *, seq_len: int = 2048, n_future: int = 8, batch_size: int = 8,
                      repeats: int = 3, vs: str | None = None, progress=None) -> LoaderThroughput:
    """Decompressed MB/s that one process delivers as packed batches from one prepared shard,
    beside `zstd -dc` of the same file to /dev/null in the same run. Both divide the shard's
    decompressed size by their time, the best of `repeats` runs each, interleaved: the loader's for
    one whole epoch of the shard (read, decode, place EOS, pack, shuffle, batch) after a first
    epoch that warms it up (threads started, buffers allocated), zstd's for decompressing it.

    With `vs` (any corpus spec: a Parquet file with the same documents, say), the loader also runs
    whole epochs of it, interleaved with the others, and `vs` reports its document bytes a second
    (counted by the loader) and its ratio to the loader on the shard, best against best and run by
    run (the spread)."""
    files = [f for f in corpus_files(path, split="train") if str(f).endswith(".zst")]
    if not files:
        raise CorpusError(f"{path} holds no .zst shard; prepare one with `bytemtp prep`")
    shard = max(files, key=lambda f: f.stat().st_size)
    size = decompressed_size(shard)
    zstd = shutil.which("zstd")
    if zstd is None:
        raise CorpusError("the zstd command is not installed (apt-get install zstd); "
                          "the benchmark compares the loader against it")
    model = ModelConfig(seq_len=seq_len, n_future=n_future)  # the windows of such a model
    loaders = {"loader": ByteLoader(DataConfig(path=str(shard), batch_size=batch_size), model)}
    if vs is not None:
        loaders["vs"] = ByteLoader(DataConfig(path=vs, batch_size=batch_size), model)
    for loader in loaders.values():
        while loader.epoch == 0:  # the warm-up epoch
            next(loader)
    zstd_s, took, nbytes = [], {name: [] for name in loaders}, {}
    for _ in range(repeats):  # interleaved, so that a busy moment hits all of them
        with open(os.devnull, "wb") as sink:
            t0 = time.perf_counter()
            subprocess.run([zstd, "-dcq", str(shard)], stdout=sink, check=True)
            zstd_s.append(time.perf_counter() - t0)
        for name, loader in loaders.items():
            epoch, batches, before, t0 = loader.epoch, 0, loader.stats()["bytes"], time.perf_counter()
            while loader.epoch == epoch:
                next(loader)
                batches += 1
            took[name].append(time.perf_counter() - t0)
            # the document bytes of the epoch (the last batch may hold a few of the next one's)
            nbytes[name] = loader.stats()["bytes"] - before
        if progress is not None:
            progress()
    loader_s = took["loader"]
    loader_mb_s, zstd_mb_s = size / min(loader_s) / 1e6, size / min(zstd_s) / 1e6
    vs_figures = None
    if vs is not None:
        per_byte = size / nbytes["vs"]  # a vs run's time as if it had the shard's bytes
        vs_mb_s = nbytes["vs"] / min(took["vs"]) / 1e6
        vs_figures = VsThroughput(path=vs, files=len(corpus_files(vs, split="train")), document_bytes=nbytes["vs"],
                                  s=min(took["vs"]), mb_s=vs_mb_s, ratio=vs_mb_s / loader_mb_s,
                                  pair_ratios=sorted(t / (v * per_byte) for t, v in zip(loader_s, took["vs"])))
    return LoaderThroughput(shard=str(shard), decompressed_bytes=size, compressed_bytes=shard.stat().st_size,
                            seq_len=seq_len, batch_size=batch_size, batches=batches, repeats=repeats,
                            loader_s=min(loader_s), zstd_s=min(zstd_s), loader_mb_s=loader_mb_s, zstd_mb_s=zstd_mb_s,
                            ratio=loader_mb_s / zstd_mb_s,
                            pair_ratios=sorted(z / t for z, t in zip(zstd_s, loader_s)),  # run by run: the spread
                            vs=vs_figures)


def decode_speed(ckpt: str, *, prompts_path: str | None = None, n_prompts: int = 16, prompt_bytes: int = 128,
                 max_bytes: int = 256, batch_sizes=(1, 8), modes=DECODE_MODES, rounds: int = 2,
                 device: str = "cpu", dtype: str = "float32", eval_batches: int = 10, compile: str = "auto",
                 progress=None) -> DecodeSpeed:
    """Plain greedy against self-speculative greedy in several drafting modes, on the same model
    and held-out prompts, in one run.

    Every mode decodes with one `Decoder` (heads stacked once, pass costs measured once per batch
    size, the acceptance profile kept across calls), by `interleaved_decodes`; the outputs must be
    identical. Per batch size and mode, the figures of `speed_figures`, with `repetition`: how
    repetitive the decoded text is, and, for prompts cut from val documents, the same figures of
    the bytes that follow each prompt there (the real continuation, cut to the decoded length) and
    the ratio of the zstd ratios (a prompts file has no continuation: `real` is then None). The
    `top` case is auto at the first batch size (or the first mode measured), whose figures the
    JSON form also puts at its top level; `compile` says on or off (whether the passes ran the
    compiled static step); `val_bpb` is the model's held-out bits per byte (next-byte head). When
    compiled, eager plain decoding runs in the same rounds as the baseline: each case's
    `eager_plain_bytes_s`, `compiled_plain_speedup` (compiled plain over eager plain) and
    `eager_speedup` (the mode over eager plain).
    """
    dev = torch.device(device)
    model, cfg = load_model(ckpt, device=dev)
    model = model.to(getattr(torch, dtype))
    real = None  # the real continuations, where the prompts come from documents
    if prompts_path is not None:
        prompts = load_prompts(prompts_path)[:n_prompts]
    else:
        pairs = val_continuations(cfg.data.path, n=n_prompts, prompt_bytes=prompt_bytes, continuation_bytes=max_bytes)
        prompts, real = [p for p, _ in pairs], [c for _, c in pairs]
    n_future = model.config.n_future
    modes = ["plain", *[m for m in modes if n_future > 1 or m == "auto"]]
    decoder = decode.Decoder(model, compile=compile)
    compiled = decoder.policy.settle(batch_size=batch_sizes[0],
                                     work_bytes=len(prompts) * max_bytes * len(modes) * rounds * len(batch_sizes))
    runs = {m: (decoder, {"draft": Draft.parse(m).capped(n_future)}) for m in modes}
    if compiled:
        runs["eager plain"] = (decode.Decoder(model, compile="off"), {"draft": Draft.plain()})
    cases = []
    for B in batch_sizes:
        batches = [prompts[i:i + B] for i in range(0, len(prompts), B)]
        took, outs = interleaved_decodes(runs, batches, max_bytes=max_bytes, rounds=rounds, progress=progress)
        for mode in modes[1:]:
            try:
                figures = speed_figures(took, outs, mode, real=real)
            except RuntimeError as e:
                raise RuntimeError(f"{e} (batch {B})") from None
            case = DecodeCase(batch_size=B, figures=figures)
            if compiled:
                eager = speed_figures(took, outs, mode, base="eager plain", same_step=False)
                plain = speed_figures(took, outs, "plain", base="eager plain", same_step=False)
                case = DecodeCase(batch_size=B,
                                  figures=dataclasses.replace(figures, identical=figures.identical and plain.identical),
                                  eager_plain_bytes_s=eager.plain_bytes_s, eager_speedup=eager.speedup,
                                  compiled_plain_speedup=plain.speedup)
            cases.append(case)
    ev = (evaluate(model, cfg.data.path, split=held_out_split(cfg.data.path), batches=eval_batches, device=dev)
          if eval_batches else None)
    costs = decoder.pass_costs(batch_sizes[0], static=compiled)
    static = decoder.policy.static
    return DecodeSpeed(ckpt=str(ckpt), device=str(dev), dtype=dtype, prompts=len(prompts),
                       prompt_bytes=max(len(p) for p in prompts), max_bytes=max_bytes, rounds=rounds,
                       val_bpb=ev.bpb[0] if ev else None, compile="on" if compiled else "off",
                       compile_stats=static.stats() if static is not None else None, pass_costs_ms=costs.to_dict(),
                       cases=cases)


@dataclasses.dataclass(frozen=True)
class LoadFigures:
    """One load of streaming clients, in the figures of `serving.load.LoadReport.to_json`."""
    clients: int
    wall_s: float
    completions: int
    bytes_out: int
    bytes_per_s: float  # over all clients
    ttfb_p50_s: float  # time to the first byte
    ttfb_p95_s: float
    mismatches: int  # completions that differ from the prompt decoded alone
    errors: int


@dataclasses.dataclass(frozen=True)
class ServeCase:
    """One count of clients over the rounds (`serve_speed`)."""
    runs: list[LoadFigures]  # one a round
    bytes_per_s: float  # median over the rounds
    ratio: float  # bytes a second over the first count's in the same round: median, min, max
    ratio_min: float
    ratio_max: float
    ttfb_p50_s: float  # medians over the rounds
    ttfb_p95_s: float
    mismatches: int  # summed over the rounds
    errors: int

    @classmethod
    def from_json(cls, data: dict) -> ServeCase:
        return cls(**{**data, "runs": [LoadFigures(**r) for r in data["runs"]]})


@dataclasses.dataclass(frozen=True)
class ServeLoad(LoadFigures):
    """The timed load after the rounds, and the process's memory around it (MB)."""
    rss_mb_before: float
    rss_mb_after: float
    rss_mb_settled_min_max: list[float]  # after the first quarter of the load
    rss_mb_samples: list[list[float]]  # [seconds, MB] every few seconds
    engine_requests: int
    engine_errors: int


@dataclasses.dataclass(frozen=True)
class ServeSpeed:
    """Streaming clients against `bytemtp serve` on loopback (`serve_speed`)."""
    ckpt: str
    device: str
    prompts: int
    max_bytes: int
    rounds: int
    draft: str  # the server's draft, by its name
    max_batch: int  # the engine's
    cases: dict[int, ServeCase]  # by count of clients, the first the baseline
    load: ServeLoad | None  # None: no timed load asked for
    mean_batch: float  # the engine's rows a pass, over the whole run
    bytes_per_row_pass: float
    val_bpb: float | None  # the model's held-out bits per byte, next-byte head (None: not evaluated)

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        if self.load is None:
            del out["load"]
        return out

    @classmethod
    def from_json(cls, data: dict) -> ServeSpeed:
        load = data.get("load")
        return cls(**{**data, "cases": {int(n): ServeCase.from_json(c) for n, c in data["cases"].items()},
                      "load": None if load is None else ServeLoad(**load)})


def _rss_mb() -> float:
    """This process's resident memory, MB (Linux; NaN elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration, ValueError):
        return float("nan")


def serve_speed(ckpt: str, *, clients=(1, 8), n_prompts: int = 16, prompt_bytes: int = 128, max_bytes: int = 256,
                rounds: int = 3, load_s: float = 0.0, load_clients: int = 16, draft: Draft = Draft(lookup=True),
                device: str = "cpu", eval_batches: int = 10, progress=None) -> ServeSpeed:
    """Streaming clients against `bytemtp serve` on loopback, in this process: for each count of
    clients, every held-out prompt streamed once (the prompts shared out among the clients, each
    client's in turn), in interleaved rounds; bytes a second over all clients, the ratio to the
    first count in the same round, time to first byte, and every completion checked against that
    prompt decoded alone (plain greedy). With `load_s`, then `load_clients` clients stream for
    that long, and the process's memory is read before and after."""
    from bytemtp.serving.app import Running, Server
    from bytemtp.serving.engine import Engine
    from bytemtp.serving.load import run_load

    say = progress or (lambda line: None)
    dev = torch.device(device)
    model, cfg = load_model(ckpt, device=dev)
    pairs = val_continuations(cfg.data.path, n=n_prompts, prompt_bytes=prompt_bytes, continuation_bytes=max_bytes)
    prompts = [p for p, _ in pairs]
    say(f"decoding {len(prompts)} prompts alone (plain greedy), the reference")
    expected = [decode.generate(model, p, max_bytes=max_bytes).output.decode("utf-8", "replace") for p in prompts]
    engine = Engine(model, max_batch=max(*clients, load_clients if load_s else 1), max_queue=4 * load_clients,
                    draft=draft)
    engine.start(progress=say)
    cases, figures = {}, None
    with Running(Server(engine, model_name="bench")) as server:
        def load(n, **kw):
            return run_load(server.url, model="bench", prompts=prompts, expected=expected, clients=n,
                            max_tokens=max_bytes, **kw)

        say("warm-up")
        load(max(clients), per_client=1)
        by_count: dict[int, list[LoadFigures]] = {n: [] for n in clients}
        for r in range(rounds):
            for n in clients:
                say(f"round {r + 1}: {n} clients")
                by_count[n].append(LoadFigures(**load(n, per_client=-(-len(prompts) // n)).to_json()))
        for n, runs in by_count.items():
            ratios = [a.bytes_per_s / b.bytes_per_s for a, b in zip(runs, by_count[clients[0]])]
            cases[n] = ServeCase(runs=runs, bytes_per_s=statistics.median(x.bytes_per_s for x in runs),
                                 ratio=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios),
                                 ttfb_p50_s=statistics.median(x.ttfb_p50_s for x in runs),
                                 ttfb_p95_s=statistics.median(x.ttfb_p95_s for x in runs),
                                 mismatches=sum(x.mismatches for x in runs), errors=sum(x.errors for x in runs))
        if load_s:
            say(f"load: {load_clients} clients for {load_s:.0f} s")
            rss, done = [(0.0, _rss_mb())], threading.Event()
            t0 = time.perf_counter()

            def sample() -> None:  # the memory every few seconds while the load runs
                while not done.wait(min(5.0, load_s / 10)):
                    rss.append((time.perf_counter() - t0, _rss_mb()))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            report = load(load_clients, duration_s=load_s)
            done.set()
            sampler.join()
            rss.append((time.perf_counter() - t0, _rss_mb()))
            settled = [mb for t, mb in rss if t >= load_s / 4] or [rss[-1][1]]  # after the first quarter
            figures = ServeLoad(**report.to_json(), rss_mb_before=round(rss[0][1], 1),
                                rss_mb_after=round(rss[-1][1], 1),
                                rss_mb_settled_min_max=[round(min(settled), 1), round(max(settled), 1)],
                                rss_mb_samples=[[round(t, 1), round(mb, 1)] for t, mb in rss],
                                engine_requests=engine.stats.requests, engine_errors=engine.stats.errors)
        mean_batch = round(engine.stats.mean_batch, 2)
        bytes_per_row_pass = round(engine.stats.bytes_out / max(1, engine.stats.rows_in_passes), 3)
    ev = (evaluate(model, cfg.data.path, split=held_out_split(cfg.data.path), batches=eval_batches, device=dev)
          if eval_batches else None)
    return ServeSpeed(ckpt=str(ckpt), device=str(dev), prompts=len(prompts), max_bytes=max_bytes, rounds=rounds,
                      draft=str(draft), max_batch=engine.max_batch, cases=cases, load=figures, mean_batch=mean_batch,
                      bytes_per_row_pass=bytes_per_row_pass, val_bpb=ev.bpb[0] if ev else None)


@dataclasses.dataclass(frozen=True)
class AllBenchmarks:
    """The training step, the loader, decoding and evaluation of one run (`all_benchmarks`); its
    JSON form puts `summary`, the figures that BENCHMARKS.md tracks, first."""
    train_step: TrainStepResult
    loader: LoaderThroughput
    decode: DecodeSpeed
    eval: EvalResult

    @property
    def summary(self) -> dict[str, float | bool | None]:
        """The tracked figures by their names in BENCHMARKS.md (`part.figure`)."""
        step, loader, dec, ev = self.train_step, self.loader, self.decode, self.eval
        top, k = dec.top.figures, len(ev.bpb)  # k: the model's heads
        return {
            "train_step.time_ratio": step.time_ratio, "train_step.time_ratio_min": step.time_ratio_rounds.min,
            "train_step.time_ratio_max": step.time_ratio_rounds.max,
            "train_step.time_ratio_noisy": step.time_ratio_rounds.noisy, "train_step.memory_ratio": step.memory_ratio,
            "loader.ratio": loader.ratio, "loader.loader_mb_s": loader.loader_mb_s,
            "decode.speedup": top.speedup, "decode.bytes_per_forward": top.bytes_per_forward,
            "decode.speedup_min": top.speedup_min, "decode.pass_cost": top.pass_cost,
            "decode.identical": dec.all_identical,
            "decode.distinct_8grams": top.repetition.decoded.distinct_8grams,
            "decode.zstd_ratio": top.repetition.decoded.zstd_ratio,
            "decode.zstd_ratio_over_real": top.repetition.zstd_ratio_over_real,
            "eval.bpb_head1": ev.bpb[0], f"eval.bytes_per_forward_{k}": ev.bytes_per_forward[k],
        }

    def to_json(self) -> dict:
        return {"summary": self.summary, "train_step": self.train_step.to_json(), "loader": self.loader.to_json(),
                "decode": self.decode.to_json(), "eval": self.eval.to_json()}

    @classmethod
    def from_json(cls, data: dict) -> AllBenchmarks:
        return cls(train_step=TrainStepResult.from_json(data["train_step"]),
                   loader=LoaderThroughput.from_json(data["loader"]), decode=DecodeSpeed.from_json(data["decode"]),
                   eval=EvalResult.from_json(data["eval"]))


def all_benchmarks(*, ckpt: str, data: str = "data/corpus/stdlib", preset_name: str = "small",
                   device: str = "cpu", n_prompts: int = 16, eval_batches: int = 20, progress=None) -> AllBenchmarks:
    """The training step, the loader, decoding and evaluation in one run (under two minutes on
    two CPU cores with the `small` preset and the `make demo` run)."""
    say = progress or (lambda name: None)
    say("train-step")
    step = train_step(preset_name, device=device)
    say("loader")
    loader = loader_throughput(data)
    say("decode")
    dec = decode_speed(ckpt, n_prompts=n_prompts, device=device, eval_batches=0, max_bytes=128, rounds=1,
                       modes=("auto", "chain-2", "chain-all", "tree-4"))
    say("eval")
    model, cfg = load_model(ckpt, device=torch.device(device))
    ev = evaluate(model, cfg.data.path, split=held_out_split(cfg.data.path), batches=eval_batches,
                  device=torch.device(device))
    return AllBenchmarks(train_step=step, loader=loader, decode=dec, eval=ev)


if __name__ == "__main__":
    print(peak_memory_mb(**json.loads(sys.argv[1])))
