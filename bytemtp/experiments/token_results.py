"""What `bench tokens` (`bytemtp.experiments.token_bench`) gives: each arm at each seed, trained
and scored (`ArmFigures`), both arms' decoders at each batch size (`TokenDecoding`), and the
comparison (`TokenBench`): its JSON form (`to_json`, what `bench tokens --json` writes, read back by
`from_json`), the warnings of a sitting that favoured one arm (`load_warnings`, the step check's
noise by `check_noise`) and the table the command prints (a figure over the seeds as a `Spread`:
the mean and range).
"""

from __future__ import annotations

import dataclasses
import statistics

from bytemtp.decoding.speed import SpeedFigures
from bytemtp.experiments.step_bench import StepCheck
from bytemtp.spread import Spread

DEFAULT_MODE = "auto+lookup"  # what `generate` and the server decode with
SHARE_FLOOR = 0.05  # the arms' shares of an equal machine differ by more than this plus the check's spread: a warning


@dataclasses.dataclass(frozen=True)
class ArmFigures:
    """One arm at one seed, trained and scored."""
    name: str  # bytes-sN or tokens-sN
    arm: str  # bytes or tokens
    seed: int
    sets: list[str]  # its settings on top of the preset and the shared ones
    params: int
    steps: int
    train_s: float
    tokens_seen: int  # positions trained on (ids: bytes for the byte arm)
    bytes_seen: int  # the bytes they stand for (the token arm: tokens x the train split's bytes a token)
    context_ids: int  # the context (model.seq_len) in the arm's ids
    context_bytes: float  # ... and in bytes (the token arm: at the train split's bytes a token)
    val_bpb: float  # head 1, the whole val split
    val_bytes: int
    held_out_bpb: float | None  # head 1, the held-out text (None without one)
    held_out_bytes: int
    check_step_s: float | None = None  # its median step in the step check (None: not checked; JSON before it)

    @property
    def steps_per_s(self) -> float | None:
        """Steps a second of its training (None where its wall time was not kept)."""
        return self.steps / self.train_s if self.train_s else None

    @property
    def expected_steps(self) -> float | None:
        """The steps its wall time buys at the step check's pace: what it would have got on an equal machine."""
        return self.train_s / self.check_step_s if self.train_s and self.check_step_s else None

    @property
    def share(self) -> float | None:
        """Its steps over `expected_steps`: how much of an equal machine its slot of the sitting gave it."""
        return self.steps / self.expected_steps if self.expected_steps else None

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "steps_per_s": self.steps_per_s, "expected_steps": self.expected_steps,
                "share_of_expected_steps": self.share}

    @classmethod
    def from_json(cls, data: dict) -> ArmFigures:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


@dataclasses.dataclass(frozen=True)
class TokenDecoding:
    """Both arms' decoders at one batch size, in one interleaved run."""
    batch_size: int
    modes: dict[str, SpeedFigures]  # "ARM MODE": the mode against its arm's plain decoding
    best: dict[str, str]  # arm: its fastest mode (plain included)
    default_over_best_tokens: SpeedFigures  # the byte arm's default against the token arm's best mode

    def bytes_s(self, name: str) -> float:
        figures = self.modes[name]
        return figures.plain_bytes_s if name.endswith(" plain") else figures.spec_bytes_s

    def to_json(self) -> dict:
        return {"batch_size": self.batch_size, "modes": {k: v.to_json() for k, v in self.modes.items()},
                "best": dict(self.best), "default_over_best_tokens": self.default_over_best_tokens.to_json()}

    @classmethod
    def from_json(cls, data: dict) -> TokenDecoding:
        return cls(batch_size=data["batch_size"], best=dict(data["best"]),
                   modes={k: SpeedFigures.from_json(v) for k, v in data["modes"].items()},
                   default_over_best_tokens=SpeedFigures.from_json(data["default_over_best_tokens"]))


@dataclasses.dataclass(frozen=True)
class TokenBench:
    """The comparison (`compare`); its JSON form is `to_json`."""
    data: str
    preset: str
    budget_s: float  # 0 when limited by steps
    steps: int
    seeds: int
    tokenizer: str
    vocab_size: int
    train_bytes_per_token: float
    val_bytes_per_token: float
    held_out: str | None
    arms: list[ArmFigures]
    decoding: list[TokenDecoding]
    prompts: int
    max_bytes: int
    temperature: float
    compiled: bool
    top_k: int = 0  # the sampling's (JSON written before they were asked: these defaults)
    top_p: float = 1.0
    seed: int = 0
    dtype: str = "float32"
    check: StepCheck | None = None  # the step check of seed 0's arms (None: skipped, or JSON before it)

    def of(self, arm: str) -> list[ArmFigures]:
        return [a for a in self.arms if a.arm == arm]

    def ratio(self, field: str) -> Spread | None:
        """The byte arm's figure over the token arm's, seed by seed: their mean and range."""
        pairs = [(b, t) for b, t in zip(self.of("bytes"), self.of("tokens"))
                 if getattr(b, field) is not None and getattr(t, field) is not None]
        if not pairs:
            return None
        return Spread.mean_of(getattr(b, field) / getattr(t, field) for b, t in pairs)

    def to_json(self) -> dict:
        """The comparison, and the ratios of the arms' figures as [mean, min, max] (`ratio`)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["arms"] = [a.to_json() for a in self.arms]
        out["decoding"] = [d.to_json() for d in self.decoding]
        out["check"] = None if self.check is None else self.check.to_json()
        out["load_warnings"] = self.load_warnings()
        ratios = {f: self.ratio(f) for f in ("val_bpb", "held_out_bpb", "bytes_seen")}
        out["ratios"] = {f: None if r is None else [r.mid, r.low, r.high] for f, r in ratios.items()}
        return out

    @property
    def all_identical(self) -> bool | None:
        """Whether every greedy mode's outputs are its arm's plain ones; None when sampled (compared,
        not judged, as in `bench decode`)."""
        if self.temperature:
            return None
        return all(f.identical for d in self.decoding for f in d.modes.values())

    @classmethod
    def from_json(cls, data: dict) -> TokenBench:
        given = {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data}
        check = data.get("check")
        return cls(**{**given, "arms": [ArmFigures.from_json(a) for a in data["arms"]],
                      "decoding": [TokenDecoding.from_json(d) for d in data["decoding"]],
                      "check": None if check is None else StepCheck.from_json(check)})

    def load_warnings(self) -> list[str]:
        """A line for each seed whose sitting favoured one arm: the arms' shares of the steps their
        wall time buys at the step check's pace lie further apart than the check's noise (its ratio's
        round-by-round spread, an outlier round at each end left out: `check_noise`, plus SHARE_FLOOR). None without a check, or under --steps, where both
        arms do the same work and the load changes only how long it takes."""
        if self.check is None or self.steps:
            return []
        noise = check_noise(self.check.ratio("bytes", "tokens")) + SHARE_FLOOR
        lines = []
        for b, t in zip(self.of("bytes"), self.of("tokens")):
            if b.share is None or t.share is None:
                continue
            hi, lo = (b, t) if b.share >= t.share else (t, b)
            if hi.share / lo.share - 1 > noise:
                lines.append(f"WARNING, seed {b.seed}: the sitting favoured the {hi.arm} arm "
                             f"{hi.share / lo.share:.2f}x: it got {hi.share:.0%} of the steps its wall time buys at "
                             f"the step check's pace, the {lo.arm} arm {lo.share:.0%} (more apart than the check's "
                             f"noise, {noise:.0%}); the arms did not train on an equal machine: rerun on a quieter "
                             f"one, or compare equal work with --steps {round(b.expected_steps)} (the byte arm's "
                             "steps at that pace)")
        return lines

    def table(self) -> str:
        """The comparison as Markdown: the arms side by side, the ratios, then decoding by batch size."""
        b, t = self.of("bytes"), self.of("tokens")

        def row(label: str, get, form: str = "{:.3f}") -> str:
            return f"| {label} | {_seeds([get(a) for a in b], form)} | {_seeds([get(a) for a in t], form)} |"

        limit = f"{self.steps} steps" if self.steps else f"{self.budget_s / 60:g} min"
        seeds = f"{self.seeds} seed{'s' if self.seeds > 1 else ''}"
        lines = [f"{self.preset} on {self.data}, {limit} each, {seeds} (mean and range); tokens: byte-level BPE of "
                 f"{self.vocab_size} ids, {self.train_bytes_per_token:.2f} bytes a token on train, "
                 f"{self.val_bytes_per_token:.2f} on val",
                 *(f"{arm} arm's settings on the preset: {' '.join(_own(a[0].sets)) or 'none'}" for arm, a in
                   (("bytes", b), ("tokens", t))), "",
                 "| | bytes | tokens |", "|---|---|---|",
                 row("parameters", lambda a: a.params / 1e6, "{:.2f}M"),
                 row("steps", lambda a: a.steps, "{:,.0f}"),
                 row("tokens seen (ids)", lambda a: a.tokens_seen / 1e6, "{:.2f}M"),
                 row("bytes seen", lambda a: a.bytes_seen / 1e6, "{:.2f} MB"),
                 *self._pace_rows(row),
                 row("context (ids)", lambda a: a.context_ids, "{:.0f}"),
                 row("context (bytes)", lambda a: a.context_bytes, "{:.0f}"),
                 row(f"bits/byte, whole val ({b[0].val_bytes:,} bytes)", lambda a: a.val_bpb)]
        if b[0].held_out_bpb is not None:
            lines.append(row(f"bits/byte, held-out ({b[0].held_out_bytes:,} bytes)", lambda a: a.held_out_bpb))
        lines.append("")
        for field, label in (("val_bpb", "val bits/byte"), ("held_out_bpb", "held-out bits/byte"),
                             ("bytes_seen", "bytes seen")):
            r = self.ratio(field)
            if r is not None:
                lines.append(f"bytes/tokens, {label}: {r.format('{:.3f}', unit='x')}")
        if self.check is not None:
            kinds = {arm: "compiled" if c else "eager" for arm, c in self.check.compiled.items()}
            compiled = (kinds["bytes"] if len(set(kinds.values())) == 1
                        else ", ".join(f"{arm} {kind}" for arm, kind in kinds.items()))
            phases = ", ".join(f"{arm}: " + " / ".join(f"{p['heads_run']} head{'s' if p['heads_run'] > 1 else ''} "
                                                       f"{p['share']:.0%} {1000 * p['step_s']:.0f} ms" for p in shown)
                               for arm, shown in self.check.phases.items() if len(shown) > 1)
            lines.append(f"step check after training ({self.check.rounds} rounds, the arms turn about, {compiled}; "
                         "each arm's step over its head schedule's phases, weighed by their shares"
                         + (f": {phases}" if phases else "") + "): a bytes step over a tokens step "
                         f"{self.check.ratio('bytes', 'tokens').format(unit='x')}")
        return "\n".join(lines + self.load_warnings() + self._decoding_lines())

    def _pace_rows(self, row) -> list[str]:
        """The table's rows of what each arm's slot of the sitting gave it: its wall time and steps a
        second (where kept), and with a step check its step there and its share of the steps its wall
        time buys at that pace."""
        rows = []
        if all(a.train_s for a in self.arms):
            rows += [row("wall time (s)", lambda a: a.train_s, "{:,.0f}"),
                     row("steps a second", lambda a: a.steps_per_s, "{:.2f}"),
                     row("bytes seen a second", lambda a: a.bytes_seen / a.train_s / 1e3, "{:,.1f} KB")]
        if all(a.share is not None for a in self.arms):
            rows += [row("step in the check (ms)", lambda a: 1000 * a.check_step_s, "{:.1f}"),
                     row("share of the steps at the check's pace", lambda a: 100 * a.share, "{:.0f}%")]
        return rows

    def _decoding_lines(self) -> list[str]:
        """The table's decoding part: every mode of both arms by batch size, then the byte arm's
        default over the token arm's best mode."""
        sampled = (f"sampled at temperature {self.temperature:g}, top-p {self.top_p:g}"
                   + (f", top-k {self.top_k}" if self.top_k else "") + f" (seed {self.seed})" if self.temperature
                   else "greedy")
        lines = ["", f"decoding, {sampled}, {self.prompts} held-out prompts x {self.max_bytes} bytes, "
                 f"{'compiled' if self.compiled else 'eager'} step (seed 0's models):", "",
                 "| batch | mode | bytes/s | over its arm's plain | bytes/pass | distinct 8-grams | zstd ratio / real |",
                 "|---|---|---|---|---|---|---|"]
        for dec in self.decoding:
            for name, f in dec.modes.items():
                rep = f.repetition
                star = " (best)" if name in dec.best.values() else ""
                over = rep.zstd_ratio_over_real
                lines.append(f"| {dec.batch_size} | {name}{star} | {dec.bytes_s(name):,.0f} | "
                             f"{'-' if name.endswith(' plain') else f'{f.speedup.mid:.2f}x'} | "
                             f"{f.bytes_per_forward:.2f} | "
                             f"{'-' if rep.decoded.distinct_8grams is None else f'{rep.decoded.distinct_8grams:.2f}'} | "
                             f"{'-' if over is None else f'{over:.2f}'} |")
        lines.append("")
        for dec in self.decoding:
            lines.append(f"batch {dec.batch_size}: bytes {DEFAULT_MODE} over the token arm's best "
                         f"({dec.best['tokens']}): {dec.default_over_best_tokens.speedup.format(unit='x')}")
        lines += [f"NOISY, batch {dec.batch_size}: {f.noise}" for dec in self.decoding
                  for f in [*dec.modes.values(), dec.default_over_best_tokens] if f.noise]
        return lines


def check_noise(rounds: Spread) -> float:
    """The step check's own noise: the width of its ratio's rounds over their median, the highest
    and the lowest round left out where there are five or more, as the median that gives each arm's
    step leaves them out. One round that the machine's load slowed (a ratio of 1.06 among four of
    0.52-0.54) made the whole range the noise, and the warning then stayed silent where one arm's
    slot had had half the machine."""
    runs = sorted(rounds.runs)
    if len(runs) >= 5:
        runs = runs[1:-1]
    if not runs:
        return rounds.width
    return (runs[-1] - runs[0]) / statistics.median(runs)


def _own(sets: list[str]) -> list[str]:
    """An arm's settings without its seeds (the seeds are in the table's heading)."""
    return [x for x in sets if x.split("=", 1)[0] not in ("train.seed", "data.seed")]


def _seeds(values: list[float], form: str) -> str:
    """A figure over the seeds as the table writes it: the mean and range (each number by `form`),
    or the one seed's figure alone."""
    if len(values) == 1:
        return form.format(values[0])
    return Spread.mean_of(values).format(form)
