"""The training-step benchmark (`bench train-step`), measured as ratios within one run (shared
machines are noisy).

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
`Spread` (min, median, max). A result whose pair ratios spread over more than `NOISY_SPREAD` of
their median, or that has fewer than `MIN_ROUNDS` of them, is flagged as too noisy to mean anything
(`time_ratio_noisy` and a note, `noise_note`): the targets in BENCHMARKS.md need the ratio to about
10%.

On CUDA the step runs as `bytemtp train` takes it there: bf16 autocast (train.precision=auto),
fused AdamW skipping a non-finite step on the device, TF32 for what stays in float32, compiled
blocks with `--compile on` (auto) and eager ones with `--compile off`; its MFU is over the GPU's dense
bf16 peak (`bytemtp.model.flops`). The step reads nothing back from the GPU, so the timing's
`synchronize` before and after each sample is the only wait.

Memory: each variant builds and steps in a fresh subprocess, so its peak is its own: on the CPU the
peak resident set (VmHWM) minus the resident set before the model was built, on CUDA
`torch.cuda.max_memory_allocated`. Both count weights, gradients, optimizer state and activations.

The same timing serves experiments that train runs one after the other (`bench tokens`), where
the machine's load during one run's slot changes how many steps it gets: `check_steps` times the
step of each run's whole configuration (its model, batch, micro-batches, optimizer, precision and
compile choice) turn about, after the runs, and gives a `StepCheck`: each one's step on an equal
machine, and the spread of their ratio round by round.

`TrainStepResult` is a frozen dataclass whose JSON form (`to_json`, read back by `from_json`) is
what `bench train-step --json` writes, key for key and in order; `table` is what the command prints.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch

from bytemtp.config import Config
from bytemtp.config_io import preset
from bytemtp.model.flops import peak_flops, step_flops, utilisation
from bytemtp.model.model import ByteMTP
from bytemtp.runtime.devices import autocast, fast_fp32_matmuls, resolve_device, synchronize
from bytemtp.spread import Spread
from bytemtp.tables import table
from bytemtp.training.step import (compile_blocks, compile_choice, compiler_missing, draft_forward_backward,
                                   forward_backward, plain_forward_backward)
from bytemtp.training.optimizer import build_optimizer, skips_on_device, step_unless
from bytemtp.training.schedule import HeadPhase, head_phases
from bytemtp.vocab import EOS, FIRST_MERGE

TRAIN_STEP_VARIANTS = {  # name: (n_future, memory-efficient step)
    "ntp": (1, True),
    "mtp": (8, True),
    "mtp_plain": (8, False),
}
NOISY_SPREAD = 0.2  # (max - min) / median of the pair ratios above this: the time ratio is noise
MIN_ROUNDS = 3  # fewer pair ratios than this say nothing about their spread


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
    ratios and `time_ratio_{min,median,max,runs,spread,noisy,note}` (the spread of the pair ratios,
    its width, and whether it is noise)."""
    preset: str
    device: str
    batch_size: int
    seq_len: int
    steps: int  # timed rounds
    warmup: int  # untimed rounds
    steps_per_sample: int  # steps a timed sample repeats
    variants: dict[str, VariantStep]  # by TRAIN_STEP_VARIANTS name, in its order
    # the memory-efficient 8-head step over the next-byte one, round by round: the median, the range,
    # the ratios sorted
    time_ratio_rounds: Spread
    compiled: bool = False  # whether the steps ran compiled (train.compile)
    time_ratio_note: str | None = None  # why the pair ratios say nothing (`noise_note`); None when they do

    @property
    def time_ratio_noisy(self) -> bool:
        """Too few rounds to judge the time ratio, or a spread over NOISY_SPREAD."""
        return self.time_ratio_note is not None

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
        rounds = self.time_ratio_rounds
        out.update(time_ratio=self.time_ratio, time_ratio_min=rounds.low, time_ratio_median=rounds.mid,
                   time_ratio_max=rounds.high, time_ratio_runs=list(rounds.runs), time_ratio_spread=rounds.width,
                   time_ratio_noisy=self.time_ratio_noisy, time_ratio_note=self.time_ratio_note)
        out.update(memory_ratio=self.memory_ratio, plain_memory_ratio=self.plain_memory_ratio, compiled=self.compiled)
        return out

    @classmethod
    def from_json(cls, data: dict) -> TrainStepResult:
        names = [key.removesuffix("_step_s") for key in data if key.endswith("_step_s")]
        variants = {n: VariantStep(step_s=data[f"{n}_step_s"], bytes_s=data[f"{n}_bytes_s"], params=data[f"{n}_params"],
                                   peak_mb=data[f"{n}_peak_mb"], mfu=data.get(f"{n}_mfu")) for n in names}
        rounds = Spread(mid=data["time_ratio_median"], low=data["time_ratio_min"], high=data["time_ratio_max"],
                        runs=tuple(data["time_ratio_runs"]))
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)[:7]}, variants=variants,
                   time_ratio_rounds=rounds, compiled=data.get("compiled", False),
                   time_ratio_note=data["time_ratio_note"])

    def table(self) -> str:
        """What `bench train-step` prints: each variant's median step, its bytes a second and peak
        memory (and MFU where known), then the ratios and their spread, and the note where it is noise."""
        rows = []
        for name, label in (("ntp", "next-byte (n=1)"), ("mtp", "multi-token n=8, memory-efficient"),
                            ("mtp_plain", "multi-token n=8, plain")):
            v = self.variants[name]
            row = [label, f"{v.step_s:.3f}", f"{v.bytes_s:,.0f}", f"{v.peak_mb:,.0f}"]
            if v.mfu is not None:
                row.append(f"{100 * v.mfu:.1f}%")
            rows.append(tuple(row))
        header = ("variant", "step s", "bytes/s", "peak MiB") + (("MFU",) if len(rows[0]) > 4 else ())
        rounds = self.time_ratio_rounds
        lines = [f"preset {self.preset}, batch {self.batch_size} x {self.seq_len} bytes, {self.device}, "
                 f"{'compiled' if self.compiled else 'eager'}; "
                 f"{self.steps} interleaved rounds after {self.warmup} warm-up, "
                 f"{self.steps_per_sample} step(s) a sample; median step",
                 table(rows, header),
                 f"time_ratio {self.time_ratio:.3f} (round by round: min {rounds.low:.3f}, "
                 f"median {rounds.mid:.3f}, max {rounds.high:.3f})  "
                 f"memory_ratio {self.memory_ratio:.3f}  plain_memory_ratio {self.plain_memory_ratio:.3f}"]
        if self.time_ratio_noisy:
            lines.append(f"note: {self.time_ratio_note}")
        return "\n".join(lines)


def _memory_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


class _Variant:
    """One configuration's training step, ready to take: its model (weights drawn from seed 0 on the
    CPU, the same in every process), its optimizer, and one batch of ids of its vocabulary (the
    bytes, or a BPE's bytes and merges) with a few document ends, as in packed data. `compiled`:
    the blocks compiled or not; None compiles them where train.compile compiled the run."""

    def __init__(self, cfg: Config, *, device: torch.device, compiled: bool | None):
        mc, tc = cfg.model, cfg.train
        self.cfg = mc
        self.loss_cfg, self.grad_clip, self.accum = cfg.loss, tc.grad_clip, tc.grad_accum
        gen = torch.Generator(device="cpu").manual_seed(0)  # weights and ids drawn on the CPU, then moved
        self.model = ByteMTP.build(mc, device, generator=gen)  # the same weights in every process
        self.optimizer = build_optimizer(self.model, tc, device)
        merges = max(0, mc.vocab_size - FIRST_MERGE)
        ids = torch.randint(0, 256 + merges, (cfg.data.batch_size, mc.seq_len + mc.n_future), generator=gen,
                            device="cpu")
        ids[ids >= 256] += FIRST_MERGE - 256  # merges start after the special ids
        ids[:, ::97] = EOS  # a few document ends, as in packed data
        self.ids = ids.to(device)
        self.bytes_per_step = cfg.data.batch_size * mc.seq_len * tc.grad_accum
        if compiled is None:  # as train.compile chose for the run
            flops = step_flops(self.model, self.bytes_per_step, mc.seq_len)
            compiled, _ = compile_choice(tc, device, flops_per_step=flops, bytes_per_step=self.bytes_per_step)
        self.compiled = compiled
        step_fn = (draft_forward_backward if self.model.drafter is not None else  # as the training loop chooses
                   forward_backward if tc.memory_efficient else plain_forward_backward)
        self.step_fn = functools.partial(step_fn, compiled=compiled)
        if compiled:
            compile_blocks(self.model)
        self.device, self.precision = device, tc.precision

    @classmethod
    def of_preset(cls, preset_name: str, variant: str, *, batch_size: int, device: torch.device,
                  compiled: bool) -> _Variant:
        """One of `TRAIN_STEP_VARIANTS` of a preset, at `batch_size` windows and one micro-batch a step."""
        n_future, efficient = TRAIN_STEP_VARIANTS[variant]
        base = preset(preset_name)
        cfg = dataclasses.replace(base, model=dataclasses.replace(base.model, n_future=n_future),
                                  data=dataclasses.replace(base.data, batch_size=batch_size),
                                  train=dataclasses.replace(base.train, memory_efficient=efficient, grad_accum=1))
        return cls(cfg, device=device, compiled=compiled)

    def step(self, weights: list[float] | None = None) -> None:
        """One training step, as the training loop takes it (its micro-batches, each the same ids),
        with the heads' loss `weights` (None: loss.head_weights's; a head of weight 0 is skipped):
        where the optimizer can (fused AdamW on CUDA), a non-finite step is skipped on the device,
        with no host read."""
        with autocast(self.device, self.precision):
            for _ in range(self.accum):
                out = self.step_fn(self.model, self.ids, loss_cfg=self.loss_cfg, scale=1 / self.accum,
                                   weights=weights)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip or float("inf"))
        if skips_on_device(self.optimizer):
            step_unless(self.optimizer, ~(torch.isfinite(out.total) & torch.isfinite(norm)))
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def sync(self) -> None:
        synchronize(self.device)


class _Phase:
    """A variant's step in one phase of its head schedule (`schedule.HeadPhase`): its model and
    optimizer, shared with the variant's other phases, stepping with that phase's weights."""

    def __init__(self, variant: _Variant, phase: HeadPhase):
        self.variant, self.phase = variant, phase

    def step(self) -> None:
        self.variant.step(list(self.phase.weights))

    def sync(self) -> None:
        self.variant.sync()


def peak_memory_mb(preset_name: str, variant: str, *, batch_size: int, device: str, compiled: bool = False) -> float:
    """Peak memory of building one variant and taking two steps (run in a fresh process)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    base_kib = _memory_kib("VmRSS") if dev.type == "cpu" else 0
    v = _Variant.of_preset(preset_name, variant, batch_size=batch_size, device=dev, compiled=compiled)
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
    proc = subprocess.run([sys.executable, "-m", "bytemtp.experiments.step_bench", json.dumps(args)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"memory run of {args['variant']} failed:\n{proc.stderr.strip()}")
    return float(proc.stdout.strip().splitlines()[-1])


def _timed_rounds(variants: dict, *, rounds: int, warmup: int, min_sample_s: float,
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


def noise_note(rounds: Spread) -> str | None:
    """Why the pair ratios (one a round, `rounds.runs`) say nothing about the time ratio: too few
    rounds to judge, or a spread over `NOISY_SPREAD` of their median; None when they say something."""
    if len(rounds.runs) < MIN_ROUNDS:
        return (f"{len(rounds.runs)} timed round(s) cannot show how noisy the time ratio is; "
                f"take {MIN_ROUNDS} or more (`bytemtp bench train-step --steps`)")
    if rounds.width > NOISY_SPREAD:
        return (f"the time ratio is noise: its pair ratios run from {rounds.low:.3f} to {rounds.high:.3f}, "
                f"{100 * rounds.width:.0f}% of their median (more than {100 * NOISY_SPREAD:.0f}%); rerun on a "
                "quieter machine or with more rounds (`bytemtp bench train-step --steps`)")
    return None


def train_step(preset_name: str = "small", *, batch_size: int = 8, steps: int = 6, warmup: int = 2,
               min_sample_s: float = 0.2, device: str | None = None, compile: str = "auto", peak: float = 0.0,
               progress=None) -> TrainStepResult:
    """Time the three variants in `steps` interleaved rounds after `warmup` rounds (the module doc
    says how), then measure each one's peak memory in a fresh subprocess; report the ratios and the
    spread of the time ratio. `compile` as train.compile (auto: compiled where torch.compile runs,
    as a run long enough to pay for it is); `peak` the device's FLOP/s for MFU (0: known GPUs)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    missing = compiler_missing(dev)
    if compile == "on" and missing:
        raise ValueError(f"--compile on cannot compile here: {missing}")
    compiled = compile == "on" or (compile == "auto" and missing is None)
    variants = {name: _Variant.of_preset(preset_name, name, batch_size=batch_size, device=dev, compiled=compiled)
                for name in TRAIN_STEP_VARIANTS}
    with fast_fp32_matmuls(dev, preset(preset_name).train.precision):  # as a training run on CUDA
        times, repeats = _timed_rounds(variants, rounds=steps, warmup=warmup, min_sample_s=min_sample_s,
                                       progress=progress)
    seq_len, peak, timed = variants["ntp"].cfg.seq_len, peak_flops(dev, peak), {}
    for name, v in variants.items():
        step_s = statistics.median(times[name])
        mfu = utilisation(step_flops(v.model, v.bytes_per_step, v.cfg.seq_len), step_s, peak)
        timed[name] = (step_s, v.bytes_per_step / step_s, v.model.num_params(), mfu)
    del variants
    steps_of = {}
    for name in TRAIN_STEP_VARIANTS:
        args = {"preset_name": preset_name, "variant": name, "batch_size": batch_size, "device": device,
                "compiled": compiled}
        step_s, bytes_s, params, mfu = timed[name]
        steps_of[name] = VariantStep(step_s=step_s, bytes_s=bytes_s, params=params, mfu=mfu,
                                     peak_mb=_peak_memory_in_subprocess(args))
        if progress is not None:
            progress(f"memory {name}")
    rounds = Spread.of(sorted(m / n for m, n in zip(times["mtp"], times["ntp"])), keep_runs=True)
    return TrainStepResult(preset=preset_name, device=device, batch_size=batch_size, seq_len=seq_len, steps=steps,
                           warmup=warmup, steps_per_sample=repeats, variants=steps_of, time_ratio_rounds=rounds,
                           compiled=compiled, time_ratio_note=noise_note(rounds))


@dataclasses.dataclass(frozen=True)
class StepCheck:
    """Training steps of runs that trained one after the other, timed afterwards turn about in one
    process (`check_steps`): what a step of each costs on an equal machine, to set beside the steps
    each run got in its own slot of the sitting."""
    rounds: int  # timed rounds, after the warm-up
    steps_per_sample: int  # steps a timed sample repeats
    compiled: dict[str, bool]  # by run: whether its step ran compiled (as train.compile compiled the run)
    times: dict[str, list[float]]  # by run: seconds a step, round by round (over its head schedule's phases)
    # by run: each phase of its head schedule, the heads it runs, its share of the steps and its median
    # step; `times` weighs the phases' steps round by round by their shares ({}: JSON before phases)
    phases: dict[str, list[dict]] = dataclasses.field(default_factory=dict)

    def step_s(self, name: str) -> float:
        """The run's median seconds a step."""
        return statistics.median(self.times[name])

    def ratio(self, top: str, bottom: str) -> Spread:
        """`top`'s step over `bottom`'s, round by round (the same round's samples): median and range."""
        return Spread.ratios(self.times[top], self.times[bottom], keep_runs=True)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> StepCheck:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


def check_steps(configs: dict[str, Config], *, rounds: int = 5, warmup: int = 2, min_sample_s: float = 0.2,
                progress=None, trained: dict[str, tuple[int, int]] | None = None) -> StepCheck:
    """Time the training step of each configuration (on its train.device, in its precision, its
    micro-batches, compiled where train.compile compiled its run; random ids, so reading data is
    not timed) as its run took it: in each phase of its head schedule (`schedule.head_phases`),
    the phases' steps weighed by their shares of the schedule, or of the steps the run took where
    `trained` gives them (by name: its head schedule's length and its steps, from its train state).
    Every phase of every configuration takes its turn in `rounds` interleaved rounds after `warmup`,
    the order rotating (`_timed_rounds`)."""
    trained = trained or {}
    variants = {name: _Variant(cfg, device=resolve_device(cfg.train.device), compiled=None)
                for name, cfg in configs.items()}
    phases = {}
    for name, cfg in configs.items():
        if variants[name].model.drafter is not None:  # a tune's step: the draft heads, whatever the schedule
            phases[name] = [HeadPhase(weights=tuple(cfg.loss.weights(cfg.model.n_future)), share=1.0,
                                      skipped=frozenset())]
        else:
            length, steps = trained.get(name, (0, 0))
            phases[name] = head_phases(cfg.loss, cfg.model, length=length, steps=steps)
    steps = {(name, i): _Phase(variants[name], phase) for name in configs for i, phase in enumerate(phases[name])}
    first = next(iter(configs.values())).train
    with fast_fp32_matmuls(resolve_device(first.device), first.precision):  # as a training run on CUDA
        times, repeats = _timed_rounds(steps, rounds=rounds, warmup=warmup, min_sample_s=min_sample_s,
                                       progress=progress)
    weighed = {name: [sum(phase.share * times[name, i][r] for i, phase in enumerate(phases[name]))
                      for r in range(rounds)] for name in configs}
    shown = {name: [{"heads_run": phase.heads_run, "share": phase.share, "step_s": statistics.median(times[name, i])}
                    for i, phase in enumerate(phases[name])] for name in configs}
    return StepCheck(rounds=rounds, steps_per_sample=repeats, times=weighed, phases=shown,
                     compiled={name: v.compiled for name, v in variants.items()})


if __name__ == "__main__":
    print(peak_memory_mb(**json.loads(sys.argv[1])))
