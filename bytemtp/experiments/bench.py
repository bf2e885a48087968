"""Benchmarks, measured as ratios within one run (shared machines are noisy): decoding modes against
plain decoding on held-out prompts, greedy or sampled (`decode_speed`, timing its arms with
`time_arms`, which `bench tokens` times with too), and the loader (`loader_bench`), decoding, the
training step (`step_bench.train_step`) and evaluation in one run (`all_benchmarks`); the server's
benchmark is `serve_bench`.

Each benchmark returns a frozen dataclass (`DecodeSpeed`, `AllBenchmarks`) whose JSON form
(`to_json`, read back by `from_json`) is what its command's `--json` writes, key for key and in
order, and whose `table` is what the command prints.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses

import torch

from bytemtp.data.corpus import corpus_files
from bytemtp.data.shards import CorpusError
from bytemtp.data.splits import held_out_split, val_continuations
from bytemtp.decoding import decode
from bytemtp.decoding.generation import load_prompts
from bytemtp.decoding.repetition import Repetition
from bytemtp.decoding.sampling import Sampling
from bytemtp.decoding.speed import SpeedFigures, compile_line, interleaved_decodes, speed_figures
from bytemtp.decoding.strategy import DECODE_MODES, Draft
from bytemtp.evaluation.evaluate import EvalResult, evaluate
from bytemtp.experiments.loader_bench import LoaderThroughput, loader_throughput
from bytemtp.experiments.step_bench import TrainStepResult, train_step
from bytemtp.runtime.checkpoint import load_model
from bytemtp.tables import table


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
        return cls(batch_size=data["batch_size"], figures=SpeedFigures.from_json(data),
                   eager_plain_bytes_s=data.get("eager_plain_bytes_s"), eager_speedup=data.get("eager_speedup"),
                   compiled_plain_speedup=data.get("compiled_plain_speedup"))


@dataclasses.dataclass(frozen=True)
class DecodeSpeed:
    """Plain against self-speculative decoding in several modes, greedy or sampled
    (`decode_speed`). Its JSON form (`bench decode --json`) also carries the `top` case's figures at
    the top level."""
    ckpt: str
    device: str
    dtype: str
    prompts: int
    prompt_bytes: int  # the longest prompt's
    max_bytes: int  # output bytes a prompt
    rounds: int
    val_bpb: float | None  # head 1's held-out bits per byte on `bytemtp eval`'s bytes (None: not measured)
    compile: str  # "on" or "off": whether the passes ran the compiled static step
    compile_stats: dict | None  # what compiling cost (`StaticStep.stats`); None: no static step made
    pass_costs_ms: dict[str, float]  # the pass costs at the first batch size (`PassCosts.to_dict`)
    cases: list[DecodeCase]  # batch size by batch size, mode by mode
    temperature: float = 0.0  # 0: greedy; above: every mode sampled (`sampling.Sampling`)
    top_p: float = 1.0
    top_k: int = 0  # 0: all bytes (written only where set)
    seed: int = 0  # each mode's sampler's seed, the same for all (unused when greedy)
    confidence: float = 0.0  # the decoder's draft confidence (`Decoder.confidence`; 0: off)
    val_split: str | None = None  # the split val_bpb is of: "val", or "all" for a corpus without splits
    val_bytes: int | None = None  # the bytes val_bpb is of (None: not measured, or JSON written before)
    val_note: str | None = None  # why val_bpb was not measured where it was asked for (the corpus is not here)

    @property
    def sampled(self) -> bool:
        return self.temperature > 0

    @property
    def top(self) -> DecodeCase:
        """The case that the top-level figures describe: auto at the first batch size, or the first
        mode measured there."""
        first = [c for c in self.cases if c.batch_size == self.cases[0].batch_size]
        return next((c for c in first if c.figures.mode == "auto"), first[0])

    @property
    def all_identical(self) -> bool | None:
        """Whether every mode's outputs are plain's; None when sampled, where they are recorded
        (each case's `identical`) but not judged."""
        return None if self.sampled else all(c.figures.identical for c in self.cases)

    def to_json(self) -> dict:
        top = self.top.to_json()
        keys = ("speedup", "speedup_min", "speedup_max", "bytes_per_forward", "pass_cost", "identical",
                "plain_bytes_s", "spec_bytes_s", "repetition")
        if self.compile == "on":
            keys += ("eager_plain_bytes_s", "eager_speedup", "compiled_plain_speedup")
        head = [k for k in _DECODE_HEAD if k not in _DECODE_WHERE_SET or getattr(self, k)]
        return {**{k: getattr(self, k) for k in head}, **{k: top[k] for k in keys},
                "compile_stats": self.compile_stats, "pass_costs_ms": self.pass_costs_ms,
                "all_identical": self.all_identical, "cases": [c.to_json() for c in self.cases]}

    @property
    def sampling_text(self) -> str:
        """How it decoded: greedy, or sampled at its temperature, top-p (and top-k)."""
        if not self.sampled:
            return "greedy"
        top_k = f", top-k {self.top_k}" if self.top_k else ""
        return f"sampled at temperature {self.temperature:g}, top-p {self.top_p:g}{top_k} (seed {self.seed})"

    def table(self) -> str:
        """What `bench decode` prints: why the bits/byte is missing (where it is), the setting, the
        cases' table, the real continuation's repetition, and what sampling and compiling mean here."""
        lines = []
        if self.val_note:
            lines.append(f"note: held-out bits/byte not measured: {self.val_note}; the decoding figures do not "
                         "need the corpus")
        bpb = held_out_clause(self.val_bpb, nbytes=self.val_bytes, split=self.val_split, note=self.val_note)
        lines += [f"{self.prompts} held-out prompts of up to {self.prompt_bytes} bytes, {self.max_bytes} output "
                  f"bytes each, {self.sampling_text}, {self.rounds} interleaved rounds, {self.device} {self.dtype}, "
                  f"compiled step {self.compile}{bpb}", self.cases_table(), self.real_continuation_line()]
        lines += [f"NOISY, batch {c.batch_size}: {c.figures.noise}" for c in self.cases if c.figures.noise]
        if self.sampled:
            lines.append("sampled: every mode draws each byte by its position from the same seed, so its bytes are "
                         "plain decoding's; they are compared but not judged")
        if self.compile_stats:
            lines.append(compile_line(self.compile_stats))
        return "\n".join(lines)

    def cases_table(self) -> str:
        """One row a batch size and mode, with how repetitive that mode's decoded text is (distinct
        8-grams; zstd ratio, over the real continuation's) and what its passes cost the host."""
        def identical(f: SpeedFigures) -> str:
            return "n/a (sampled)" if self.sampled else "yes" if f.identical else "NO"

        def distinct(f: SpeedFigures) -> str:
            share = f.repetition.decoded.distinct_8grams
            return "-" if share is None else f"{share:.2f}"

        rows = [(c.batch_size, f.mode, f"{f.plain_bytes_s:,.0f}", f"{f.spec_bytes_s:,.0f}", f.speedup.format(),
                 f"{f.bytes_per_forward:.2f}", f"{f.pass_cost:.2f}", identical(f),
                 ", ".join(f"{k}:{n}" for k, n in sorted(f.heads_used.items())), distinct(f),
                 _zstd_cell(f.repetition), _host_cells(f))
                for c in self.cases for f in [c.figures]]
        return table(rows, ("batch", "mode", "plain B/s", "spec B/s", "speedup (spread)", "bytes/pass",
                            "pass cost", "identical", "heads:passes", "distinct 8-grams", "zstd x (over real)",
                            "D2H/pass, outside step"))

    def real_continuation_line(self) -> str:
        """Under the cases' table: the real continuation's own repetition, once (each row's is cut
        to that row's decoded lengths, the same in every row unless rows stopped early apart), or
        that the prompts had none."""
        reals = [c.figures.repetition.real for c in self.cases]
        if any(r is None for r in reals):
            return "no real continuation (prompts from a file): the zstd ratios are of the decoded text alone"
        distinct = sorted({r.distinct_8grams for r in reals if r.distinct_8grams is not None})
        ratios = sorted({r.zstd_ratio for r in reals if r.zstd_ratio is not None})
        sizes = sorted({r.bytes for r in reals})

        def span(values: list, form: str) -> str:
            if not values:
                return "-"
            low, high = format(values[0], form), format(values[-1], form)
            return low if low == high else f"{low} to {high}"
        return (f"real continuation ({span(sizes, ',')} bytes, cut to the decoded lengths): distinct 8-grams "
                f"{span(distinct, '.2f')}, zstd ratio {span(ratios, '.2f')}x")

    @classmethod
    def from_json(cls, data: dict) -> DecodeSpeed:
        """A `bench decode --json` file read back (the top case's figures come from its case); one
        written before sampled runs, without `temperature`, `top_p` and `seed`, is greedy."""
        optional = ("temperature", "top_p", "seed", "top_k", *_DECODE_WHERE_SET)
        return cls(**{k: data[k] for k in _DECODE_HEAD if k not in optional},
                   **{k: data[k] for k in optional if k in data},
                   compile_stats=data["compile_stats"], pass_costs_ms=data["pass_costs_ms"],
                   cases=[DecodeCase.from_json(c) for c in data["cases"]])


# the keys that open `DecodeSpeed`'s JSON form, in order; those of _DECODE_WHERE_SET only where set
_DECODE_HEAD = ("ckpt", "device", "dtype", "prompts", "prompt_bytes", "max_bytes", "rounds", "temperature", "top_k",
                "top_p", "seed", "confidence", "val_bpb", "val_split", "val_bytes", "val_note", "compile")
_DECODE_WHERE_SET = ("top_k", "confidence", "val_split", "val_bytes", "val_note")


def _zstd_cell(rep: Repetition) -> str:
    """A mode's zstd ratio, and over the real continuation's where there is one."""
    if rep.decoded.zstd_ratio is None:
        return "-"
    over = "" if rep.zstd_ratio_over_real is None else f" ({rep.zstd_ratio_over_real:.2f})"
    return f"{rep.decoded.zstd_ratio:.2f}x{over}"


def _host_cells(f: SpeedFigures) -> str:
    """A mode's device-to-host transfers a pass and the share of its time outside the step."""
    if f.host_transfers_per_pass is None:
        return "-"
    return f"{f.host_transfers_per_pass:.2f}, {f.outside_step_share:.0%}"


EVAL_BATCHES = 50  # `bytemtp eval --batches`'s default: the bytes of every held-out bits/byte beside speed figures


@dataclasses.dataclass(frozen=True)
class HeldOutBpb:
    """Head 1's bits per byte on the held-out split of a run's corpus, as `bytemtp eval` measures
    it by default (`held_out_bpb`), or why it was not measured."""
    bpb: float | None  # None: not measured
    split: str | None = None  # the split scored: "val", or "all" for a corpus without splits
    bytes: int | None = None  # the bytes scored (head 1's targets)
    note: str | None = None  # why it was not measured where it was asked for


def held_out_clause(bpb: float | None, *, nbytes: int | None, split: str | None = "val",
                    note: str | None = None) -> str:
    """The header's clause on the model's held-out bits/byte (`bench decode`, `bench serve`): head
    1's figure with the bytes it is of (`bytemtp eval`'s by default), "not measured (corpus absent)"
    where the run's corpus is not here (`note`), or nothing where it was not asked for."""
    if bpb is None:
        return "; model val bits/byte not measured (corpus absent)" if note else ""
    if nbytes is None:  # JSON written before the bytes were recorded
        return f"; model val bits/byte {bpb:.3f}"
    of = "every file" if split == "all" else f"the {split} split"
    return f"; model held-out bits/byte {bpb:.3f} (head 1 on {nbytes:,} bytes of {of}, as `bytemtp eval`)"


def held_out_bpb(model, data, *, batches: int = EVAL_BATCHES, device: torch.device) -> HeldOutBpb:
    """Head 1's bits per byte on the first `batches` batches of 8 windows of the held-out split of
    `data` (val, or every file of a corpus without splits): with the default, the bytes and the
    figure of `bytemtp eval` on the same model. The benchmarks call it before they decode, so that
    a failure here costs no decoding, and where the corpus is not on this machine (a run copied
    without it) the figure is not measured and `note` says why, while the speed figures, which do
    not need the corpus, still stand. 0 batches: not measured, no note."""
    if not batches:
        return HeldOutBpb(bpb=None)
    split = held_out_split(data)
    try:
        corpus_files(data, split=split)
    except CorpusError as e:
        return HeldOutBpb(bpb=None, note=f"the run's corpus is not here ({e})")
    ev = evaluate(model, data, split=split, batches=batches, device=device)
    return HeldOutBpb(bpb=ev.bpb[0], split=split or "all", bytes=ev.bytes)


@dataclasses.dataclass(frozen=True)
class TimedArms:
    """Decoding arms timed on the same batches at one batch size (`time_arms`): the seconds and
    the last round's generations of each arm (`speed.interleaved_decodes`)."""
    batch_size: int
    took: dict  # arm: [round][batch] seconds
    outs: dict  # arm: [batch] generations of the last round
    real: list[bytes] | None  # the real continuation of each prompt, where the prompts have one

    def figures(self, arm: str, *, base: str = "plain", same_step: bool = True) -> SpeedFigures:
        """`arm` against `base` (`speed.speed_figures`: speedup and its spread, bytes per pass,
        whether the outputs are the base's, repetition); an impossible speedup names the batch size."""
        try:
            return speed_figures(self.took, self.outs, arm, base=base, same_step=same_step, real=self.real)
        except RuntimeError as e:
            raise RuntimeError(f"{e} (batch {self.batch_size})") from None


def seeded_sampling(model, *, temperature: float, top_k: int, top_p: float, seed: int) -> Sampling | None:
    """None for greedy decoding, else the sampling settings with a generator on the model's device
    seeded with `seed`."""
    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p)
    if sampling.greedy:
        return None
    sampling.generator = torch.Generator(device=model.embed.weight.device).manual_seed(seed)
    return sampling


def time_arms(arms: dict[str, tuple[decode.Decoder, Draft]], prompts: list[bytes], *, batch_sizes, max_bytes: int,
              rounds: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
              real: list[bytes] | None = None, progress=None) -> list[TimedArms]:
    """Decoding arms (name: a decoder and its draft) timed against each other, the one function
    `bench decode` and `bench tokens` time with: at each batch size, the prompts in batches of that
    size, every arm decoding every batch in interleaved rounds (`speed.interleaved_decodes`, after a
    warm-up). Greedy at `temperature` 0, else every arm samples (`top_k`, `top_p`) with a generator
    of its own seeded with `seed` afresh at every batch size, so that each arm draws the same bytes
    (draws go by position) and their outputs can be checked against plain's as greedy ones are
    (`TimedArms.figures`)."""
    Sampling(temperature=temperature, top_k=top_k, top_p=top_p)  # a bad value stops here

    def args(decoder: decode.Decoder, draft: Draft) -> dict:
        sampling = seeded_sampling(decoder.model, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        return {"draft": draft} if sampling is None else {"draft": draft, "sampling": sampling}

    timed = []
    for B in batch_sizes:
        batches = [prompts[i:i + B] for i in range(0, len(prompts), B)]
        runs = {name: (decoder, args(decoder, draft)) for name, (decoder, draft) in arms.items()}
        took, outs = interleaved_decodes(runs, batches, max_bytes=max_bytes, rounds=rounds, progress=progress)
        timed.append(TimedArms(batch_size=B, took=took, outs=outs, real=real))
    return timed


COUNTED_BYTES = 16  # bytes a row decodes while its transfers are counted (`counted_transfers`)


def counted_transfers(model, prompts: list[bytes], *, draft: Draft, static: bool, costs, temperature: float = 0.0,
                      top_k: int = 0, top_p: float = 1.0, seed: int = 0) -> float:
    """What a pass makes the host wait for, measured: one batch of `prompts` decoded for
    `COUNTED_BYTES` bytes under `runtime.host.HostTransfers` (device-to-host reads, data-dependent
    shapes and synchronous host-to-device copies, where torch dispatches), over the passes the
    model ran (every pass runs its embedding once). On a GPU the model decodes where it is; on the
    CPU, which has no transfers, a copy of it decodes on the stand-in accelerator (`runtime.standin`).
    The static step runs uncompiled (the code its graph holds, op by op), with the timed decoder's
    pass `costs` (no calibration of its own); a sampled row's one key draw is left out."""
    from bytemtp.decoding.compiled import StaticStep
    from bytemtp.runtime import standin
    from bytemtp.runtime.host import HostTransfers

    on_host = model.embed.weight.device.type == "cpu"
    with standin.StandIn() if on_host else contextlib.nullcontext() as device:
        here = copy.deepcopy(model).to(device) if on_host else model
        decoder = decode.Decoder(here, compile="on" if static else "off", costs=costs)
        if static:
            decoder.policy.static = StaticStep(here, decoder.pass_heads, compiled=False)
        sampling = seeded_sampling(here, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        runs = []
        hook = here.embed.register_forward_pre_hook(lambda *_: runs.append(1))
        with HostTransfers() as transfers:
            decoder.generate(prompts, max_bytes=COUNTED_BYTES, draft=draft, sampling=sampling)
        hook.remove()
    passes = len(runs)
    return round((transfers.total - (0 if sampling is None else len(prompts))) / max(1, passes), 3)


def decode_speed(ckpt: str, *, prompts_path: str | None = None, n_prompts: int = 16, prompt_bytes: int = 128,
                 max_bytes: int = 256, batch_sizes=(1, 8), modes=DECODE_MODES, rounds: int = 2,
                 device: str = "cpu", dtype: str = "float32", eval_batches: int = EVAL_BATCHES, compile: str = "auto",
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                 confidence: float = 0.0, progress=None) -> DecodeSpeed:
    """Plain against self-speculative decoding in several drafting modes (drafts, or their names),
    on the same model and held-out prompts, in one run: greedy at `temperature` 0, else every mode
    (plain included) sampled at that temperature, `top_k` and `top_p`, each mode with its own
    generator seeded with `seed` afresh at every batch size (`time_arms`).

    Every mode decodes with one `Decoder` (heads stacked once, pass costs measured once per batch
    size, the acceptance profile kept across calls); greedy outputs must
    be identical (each case's `identical`); sampled ones are compared too (every mode draws each
    byte by its position from the same seed, so they come out as plain's) but not judged
    (`all_identical` is then None).
    Per batch size and mode, the figures of `speed_figures`, with `repetition`: how
    repetitive the decoded text is, and, for prompts cut from val documents, the same figures of
    the bytes that follow each prompt there (the real continuation, cut to the decoded length) and
    the ratio of the zstd ratios (a prompts file has no continuation: `real` is then None). The
    `top` case is auto at the first batch size (or the first mode measured), whose figures the
    JSON form also puts at its top level; `compile` says on or off (whether the passes ran the
    compiled static step); `val_bpb` is head 1's held-out bits per byte on `bytemtp eval`'s bytes
    (`held_out_bpb`, measured before decoding; `val_split` and `val_bytes` say which bytes, and
    `val_note` why it was not measured: with `prompts_path` the run's corpus need not be here). When
    compiled, eager plain decoding runs in the same rounds as the baseline: each case's
    `eager_plain_bytes_s`, `compiled_plain_speedup` (compiled plain over eager plain) and
    `eager_speedup` (the mode over eager plain).
    """
    dev = torch.device(device)
    temperature = Sampling(temperature=temperature, top_k=top_k, top_p=top_p).temperature  # checked before loading
    model, cfg = load_model(ckpt, device=dev)
    model = model.to(getattr(torch, dtype))
    real = None  # the real continuations, where the prompts come from documents
    if prompts_path is not None:
        prompts = load_prompts(prompts_path)[:n_prompts]
    else:
        pairs = val_continuations(cfg.data.path, n=n_prompts, prompt_bytes=prompt_bytes, continuation_bytes=max_bytes)
        prompts, real = [p for p, _ in pairs], [c for _, c in pairs]
    held = held_out_bpb(model, cfg.data.path, batches=eval_batches, device=dev)  # before any decoding
    n_future = model.config.n_future
    # a model of one head (a next-byte or a BPE baseline's) has the modes that need no other head
    modes = ["plain", *[m for m in map(str, modes) if n_future > 1 or Draft.parse(m).heads in (None, 1)]]
    decoder = decode.Decoder(model, compile=compile, confidence=confidence)
    compiled = decoder.policy.settle(batch_size=batch_sizes[0],
                                     work_bytes=len(prompts) * max_bytes * len(modes) * rounds * len(batch_sizes))
    arms = {m: (decoder, Draft.parse(m).capped(n_future)) for m in modes}
    if compiled:
        arms["eager plain"] = (decode.Decoder(model, compile="off"), Draft.plain())
    cases = []
    for timed in time_arms(arms, prompts, batch_sizes=batch_sizes, max_bytes=max_bytes, rounds=rounds,
                           temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, real=real, progress=progress):
        for mode in modes[1:]:
            figures = dataclasses.replace(timed.figures(mode), host_transfers_per_pass=counted_transfers(
                model, prompts[:timed.batch_size], draft=arms[mode][1], static=compiled,
                costs=decoder.pass_costs(timed.batch_size, static=compiled), temperature=temperature,
                top_k=top_k, top_p=top_p, seed=seed))
            case = DecodeCase(batch_size=timed.batch_size, figures=figures)
            if compiled:
                eager = timed.figures(mode, base="eager plain", same_step=False)
                plain = timed.figures("plain", base="eager plain", same_step=False)
                case = DecodeCase(batch_size=timed.batch_size,
                                  figures=dataclasses.replace(figures, identical=figures.identical and plain.identical),
                                  eager_plain_bytes_s=eager.plain_bytes_s, eager_speedup=eager.speedup.mid,
                                  compiled_plain_speedup=plain.speedup.mid)
            cases.append(case)
    costs = decoder.pass_costs(batch_sizes[0], static=compiled)
    static = decoder.policy.static
    return DecodeSpeed(ckpt=str(ckpt), device=str(dev), dtype=dtype, prompts=len(prompts),
                       prompt_bytes=max(len(p) for p in prompts), max_bytes=max_bytes, rounds=rounds,
                       val_bpb=held.bpb, compile="on" if compiled else "off",
                       compile_stats=static.stats() if static is not None else None, pass_costs_ms=costs.to_dict(),
                       cases=cases, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                       confidence=confidence, val_split=held.split, val_bytes=held.bytes, val_note=held.note)


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
            "train_step.time_ratio": step.time_ratio, "train_step.time_ratio_min": step.time_ratio_rounds.low,
            "train_step.time_ratio_max": step.time_ratio_rounds.high,
            "train_step.time_ratio_noisy": step.time_ratio_noisy, "train_step.memory_ratio": step.memory_ratio,
            "loader.ratio": loader.ratio.mid, "loader.loader_mb_s": loader.loader_mb_s,
            "decode.speedup": top.speedup.mid, "decode.bytes_per_forward": top.bytes_per_forward,
            "decode.speedup_min": top.speedup.low, "decode.pass_cost": top.pass_cost,
            "decode.identical": dec.all_identical,
            "decode.distinct_8grams": top.repetition.decoded.distinct_8grams,
            "decode.zstd_ratio": top.repetition.decoded.zstd_ratio,
            "decode.zstd_ratio_over_real": top.repetition.zstd_ratio_over_real,
            "eval.bpb_head1": ev.bpb[0], f"eval.bytes_per_forward_{k}": ev.bytes_per_forward[k],
        }

    def table(self) -> str:
        """What `bench all` prints: the tracked figures, one a row."""
        rows = [(key, f"{value:.3f}" if isinstance(value, float) else str(value))
                for key, value in self.summary.items()]
        return table(rows, ("figure", "value"))

    def to_json(self) -> dict:
        return {"summary": self.summary, "train_step": self.train_step.to_json(), "loader": self.loader.to_json(),
                "decode": self.decode.to_json(), "eval": self.eval.to_json()}

    @classmethod
    def from_json(cls, data: dict) -> AllBenchmarks:
        return cls(train_step=TrainStepResult.from_json(data["train_step"]),
                   loader=LoaderThroughput.from_json(data["loader"]), decode=DecodeSpeed.from_json(data["decode"]),
                   eval=EvalResult.from_json(data["eval"]))


def all_benchmarks(*, ckpt: str, data: str = "data/corpus/stdlib", preset_name: str = "small",
                   device: str = "cpu", n_prompts: int = 16, eval_batches: int = EVAL_BATCHES,
                   progress=None) -> AllBenchmarks:
    """Evaluation (first: the run's corpus, which decoding takes its prompts from too, is checked
    before any timing; `bytemtp eval`'s bytes by default), the training step (eager; `bench
    train-step` times the compiled one), the loader and decoding in one run (under two minutes on
    two CPU cores with the `small` preset and the `make demo` run)."""
    say = progress or (lambda name: None)
    say("eval")
    model, cfg = load_model(ckpt, device=torch.device(device))
    ev = evaluate(model, cfg.data.path, split=held_out_split(cfg.data.path), batches=eval_batches,
                  device=torch.device(device))
    say("train-step")
    step = train_step(preset_name, device=device, compile="off")  # eager: compiling 3 variants, each in a subprocess too, would double the run
    say("loader")
    loader = loader_throughput(data)
    say("decode")
    dec = decode_speed(ckpt, n_prompts=n_prompts, device=device, eval_batches=0, max_bytes=128, rounds=1,
                       modes=("auto", "chain-2", "chain-all", "tree-4"))
    return AllBenchmarks(train_step=step, loader=loader, decode=dec, eval=ev)
