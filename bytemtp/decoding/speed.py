"""Speed measurement of decoding, in one place: the timing of a call, the warm-up, the
interleaving of the modes compared, the speedup with its spread, and the rule that refuses an
impossible speedup. `bench decode`, `generate --compare` and HumanEval's `--compare` all measure
through it.

A comparison decodes the same batches in every mode, the modes in turn on each batch, so that a
busy moment of a noisy machine hits them alike; each mode runs once first (its pass costs
measured, its graphs compiled, the acceptance profile learnt, the allocator warm). A mode is a
decoder (eager or compiled) and the arguments of its `generate` call (a draft, sampling options).
The figures are frozen dataclasses: `SpeedFigures` (its `to_json` is a case of `bench decode
--json`; its speedup a `Spread` over the batches and rounds) and `Comparison` (`generate
--compare`, which renders what that prints: `Comparison.table`); `compile_line` says what compiling
the static step cost. Beside the speed, each says how repetitive the text it was measured on is
(`repetition`, against the real continuation where the prompts have one; `repetition_line`): a
speedup on a run of spaces is a speedup on nothing.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from bytemtp.decoding.calibration import compile_shapes
from bytemtp.decoding.decode import Decoder
from bytemtp.decoding.generation import Generation, SpeculativeStats, as_bytes
from bytemtp.decoding.repetition import Repetition, RepetitionFigures, measure_repetition
from bytemtp.decoding.strategy import Draft
from bytemtp.runtime.devices import synchronize
from bytemtp.spread import Spread


def timed_generate(decoder: Decoder, prompts: list[bytes | str], **kwargs) -> tuple[list[Generation], float]:
    """`decoder.generate(prompts, **kwargs)` and the seconds it took, the device's queued work
    included: what a comparison of decoding modes times."""
    device = decoder.model.embed.weight.device
    synchronize(device)
    t0 = time.perf_counter()
    generations = decoder.generate(prompts, **kwargs)
    synchronize(device)
    return generations, time.perf_counter() - t0


JUDGED_S = 1.0  # seconds of plain decoding below which a speedup is too short to judge


def speedup_is_impossible(speedup: float, bytes_per_forward: float) -> bool:
    """Whether a measured speedup over plain decoding exceeds what its bytes per pass allow (a
    speculative pass never costs less than a plain one), beyond a margin for timing noise: then
    the machine was busy during the measurement, and the figure says nothing. Only for modes that
    run on the same step as the plain one (a compiled step against an eager one may gain more)."""
    return speedup > 1.15 * bytes_per_forward + 0.05


def interleaved_decodes(modes: dict[str, tuple[Decoder, dict]], batches: list[list[bytes]], *,
                        max_bytes: int, rounds: int, warm_up: bool = True, progress=None,
                        **common) -> tuple[dict, dict]:
    """Decode every batch in every mode (name: (decoder, `generate` arguments, sampling options
    included)), `rounds` times, the modes in turn on each batch, after a warm-up that runs each
    mode once on the first batch (and compiles every shape of a compiled step, so that no timed
    run compiles); `warm_up=False` leaves it out, for a run timed once whose first decode must
    be its own (a seeded sampler's draws). `progress()` is called after each batch of each round.
    Returns took[mode][round][batch] (seconds) and outs[mode][batch] (the last round's generations)."""
    if warm_up:
        for decoder, args in modes.values():
            decoder.generate(batches[0], max_bytes=min(max_bytes, 64), **common, **args)
        for decoder in {id(d): d for d, _ in modes.values()}.values():
            compile_shapes(decoder, len(batches[0]))
    took = {m: [[0.0] * len(batches) for _ in range(rounds)] for m in modes}
    outs: dict[str, list] = {m: [None] * len(batches) for m in modes}
    for rnd in range(rounds):
        for i, batch in enumerate(batches):
            for mode, (decoder, args) in modes.items():
                outs[mode][i], took[mode][rnd][i] = timed_generate(decoder, batch, max_bytes=max_bytes,
                                                                   **common, **args)
            if progress is not None:
                progress()
    return took, outs


@dataclass(frozen=True)
class SpeedFigures:
    """One mode against plain decoding (`speed_figures`); its JSON form is `to_json`."""
    mode: str
    # mid: plain time over the mode's time, all batches and rounds; runs: each batch and round's ratio, sorted
    speedup: Spread
    bytes_per_forward: float
    pass_cost: float  # the mode's time per pass over plain's
    plain_bytes_s: float
    spec_bytes_s: float
    identical: bool  # the mode's outputs are the base's (expected of greedy decoding; sampled draws differ)
    heads_used: dict[int, int]  # heads run in a pass -> passes, in the order first seen
    shapes: dict[str, int]  # the three commonest draft shapes -> passes
    repetition: Repetition  # how repetitive the mode's outputs are, against the real continuations if given
    # what predicts a GPU's pass (`host_cost`): device-to-host transfers a pass, and the share of
    # the decoding time spent outside the step itself (None: read from a file that predates them)
    host_transfers_per_pass: float | None = None
    outside_step_share: float | None = None
    # why the speedup cannot be trusted (a speedup its bytes per pass make impossible: a busy machine), else None
    noise: str | None = None

    def to_json(self) -> dict:
        """The figures, the speedup flat (`speedup`, `speedup_min`, `speedup_max`, `speedup_runs`);
        the host's, only where they were measured (a file that predates them is written back as it was)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "speedup":
                out.update(value.flat("speedup", runs=True))
            elif value is not None or f.name not in _HOST_FIGURES:
                out[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
        return out

    @classmethod
    def from_json(cls, data: dict) -> SpeedFigures:
        """`to_json` read back (other keys ignored; JSON's string keys of `heads_used` as ints)."""
        fields = {f.name: data.get(f.name, f.default) for f in dataclasses.fields(cls) if f.name != "speedup"}
        return cls(**{**fields, "speedup": Spread.from_flat(data, "speedup", runs=True),
                      "heads_used": {int(k): n for k, n in data["heads_used"].items()},
                      "shapes": dict(data["shapes"]), "repetition": Repetition.from_json(data["repetition"])})


def speed_figures(took: dict, outs: dict, mode: str, *, base: str = "plain", same_step: bool = True,
                  real: list[bytes] | None = None) -> SpeedFigures:
    """One mode against plain decoding, from `interleaved_decodes`: speedup = the mode's bytes a
    second over plain's, over all batches and rounds (greedy: plain time / mode time; sampled runs
    differ in their bytes, whose last round stands for every round), its spread (each batch and round's ratio), bytes per pass
    (output bytes over the passes each row took part in), pass cost (the mode's time per pass over
    plain's), both speeds, whether the outputs are identical, the heads run, the commonest draft
    shapes, and how repetitive the mode's outputs are (`repetition.measure_repetition`; `real`:
    the real continuation of each prompt, in the order of the batches' rows). A speedup above bytes per pass is impossible (a pass never costs less than a plain
    one): on runs long enough to judge (a second of plain decoding), where both run on the same step
    (`same_step`), such a figure is kept with a `noise` note that says so, for the table to print
    beside it (a long benchmark is never thrown away for it)."""
    total = SpeculativeStats.total(g.stats for got in outs[mode] for g in got)
    plain_time, mode_time = sum(map(sum, took[base])), sum(map(sum, took[mode]))
    # bytes a second, not time: sampled outputs differ between the modes (and may end at EOS
    # sooner); each batch's bytes are its last round's (greedy: every round's, and the base's)
    mode_bytes = [sum(len(g.output) for g in got) or 1 for got in outs[mode]]
    base_bytes = [sum(len(g.output) for g in got) or 1 for got in outs[base]]
    ratios = sorted((mb / m) / (pb / p) for p_round, m_round in zip(took[base], took[mode])
                    for p, m, mb, pb in zip(p_round, m_round, mode_bytes, base_bytes))
    passes = sum(max(g.stats.forward_passes for g in got) for got in outs[mode])
    plain_passes = sum(max(g.stats.forward_passes for g in got) for got in outs[base])
    rounds = len(took[mode])
    figures = SpeedFigures(
        mode=mode, speedup=Spread.around((sum(mode_bytes) / mode_time) / (sum(base_bytes) / plain_time), ratios,
                                         keep_runs=True), bytes_per_forward=total.bytes_per_forward,
        pass_cost=(mode_time / passes) / (plain_time / plain_passes),
        plain_bytes_s=sum(base_bytes) * rounds / plain_time, spec_bytes_s=sum(mode_bytes) * rounds / mode_time,
        identical=[[g.output for g in got] for got in outs[mode]] == [[g.output for g in got] for got in outs[base]],
        heads_used=total.heads_used, shapes=dict(sorted(total.shapes.items(), key=lambda kv: -kv[1])[:3]),
        repetition=measure_repetition([g.output for got in outs[mode] for g in got], real),
        **host_cost(outs[mode], took[mode][-1]))
    # judged where both did the same work (the same outputs: greedy, or sampled from one seed)
    if (same_step and figures.identical and plain_time > JUDGED_S
            and speedup_is_impossible(figures.speedup.mid, figures.bytes_per_forward)):
        figures = dataclasses.replace(figures, noise=(
            f"{mode}'s speedup {figures.speedup.mid:.2f} at {figures.bytes_per_forward:.2f} bytes per pass is "
            "impossible (a pass never costs less than a plain one): the machine was busy; rerun on a quieter one"))
    return figures


_HOST_FIGURES = ("host_transfers_per_pass", "outside_step_share", "noise")  # written where set


def host_cost(batches: list[list[Generation]], seconds: list[float]) -> dict[str, float]:
    """What a mode's passes cost the host, from its batches' generations and the seconds each
    batch took (the same round): device-to-host transfers a pass (`host_transfers_per_pass`;
    each batch's longest-lived row took part in all its passes) and the share of the time spent
    outside the step itself (`outside_step_share`: planning, drafting, verifying, accepting,
    emitting, sliding; on a GPU the step's seconds are the host's, launching it)."""
    reads = sum(max(g.stats.host_reads for g in got) for got in batches)
    passes = sum(max(g.stats.forward_passes for g in got) for got in batches)
    step_s = sum(max(g.stats.step_s for g in got) for got in batches)
    return {"host_transfers_per_pass": round(reads / max(1, passes), 3),
            "outside_step_share": round(max(0.0, 1 - step_s / max(sum(seconds), 1e-9)), 3)}


@dataclass(frozen=True)
class Comparison:
    """Plain against speculative greedy decoding of one prompt (`compare_decoding`)."""
    figures: SpeedFigures  # speculative against plain, on the decoder's step
    output: bytes  # the plain output
    compiled: bool  # whether the decoder ran the compiled step
    degenerate: bool  # the output is one byte repeated
    identical: bool  # every output is the plain one (the eager one's too, when compiled)
    eager_plain_bytes_s: float | None = None  # compiled only: eager plain decoding, the baseline
    compiled_plain_speedup: float | None = None  # compiled plain over eager plain
    eager_speedup: float | None = None  # speculative over eager plain
    compile_stats: dict | None = None

    def table(self, mode: str) -> str:
        """What `generate --compare` prints, `mode` naming the speculative draft: plain and
        speculative speeds, the speedup and its runs, identity, how repetitive the output is; on
        the compiled step also eager plain decoding, the speedups over it and what compiling cost."""
        step = "compiled" if self.compiled else "eager"
        fig = self.figures
        lines = []
        if self.compiled:
            lines.append(f"plain greedy, eager:          {self.eager_plain_bytes_s:8,.0f} bytes/s, 1.00 bytes/pass")
        lines += [f"plain greedy, {step + ':':15s} {fig.plain_bytes_s:8,.0f} bytes/s, 1.00 bytes/pass",
                  f"speculative, {mode:16s} {fig.spec_bytes_s:8,.0f} bytes/s, {fig.bytes_per_forward:.2f} bytes/pass",
                  f"speedup {fig.speedup.mid:.2f}x over {step} plain "
                  f"(runs: {', '.join(f'{r:.2f}' for r in fig.speedup.runs)}); "
                  f"outputs identical: {'yes' if self.identical else 'NO'}",
                  repetition_line(fig.repetition)]
        if self.compiled:
            lines.append(f"over eager plain: compiled plain {self.compiled_plain_speedup:.2f}x, speculative "
                         f"{self.eager_speedup:.2f}x")
            if self.compile_stats:
                lines.append(compile_line(self.compile_stats))
        if self.degenerate:
            lines.append(f"note: the output is one byte repeated ({self.output[:1]!r}): a degenerate "
                         "continuation says little about speed; try another prompt")
        return "\n".join(lines)


def compare_decoding(decoder: Decoder, prompt: bytes | str, *, max_bytes: int, draft: Draft | str = Draft(),
                     stop: tuple = (), rounds: int = 3) -> Comparison:
    """Plain greedy against self-speculative greedy decoding of one prompt, interleaved (`rounds`
    times after a warm-up): the figures of `speed_figures` (their `repetition` that of the output,
    with no real continuation to judge it against), the plain output and `degenerate`, whether
    that output is one byte repeated (a continuation that says little about speed).

    When the decoder runs compiled, eager plain decoding runs too, as the baseline the compiled
    step is measured against: `eager_plain_bytes_s`, `compiled_plain_speedup` (compiled plain
    over eager plain) and `eager_speedup` (speculative over eager plain); `identical` then also
    covers the eager output."""
    modes = {"plain": (decoder, {"draft": Draft.plain()}), "speculative": (decoder, {"draft": draft})}
    compiled = decoder.policy.settle(batch_size=1, work_bytes=max_bytes * (2 * rounds + 2))
    if compiled:
        modes["eager plain"] = (Decoder(decoder.model, compile="off"), {"draft": Draft.plain()})
    took, outs = interleaved_decodes(modes, [[as_bytes(prompt)]], max_bytes=max_bytes, rounds=rounds, stop=stop)
    output = outs["plain"][0][0].output
    figures = speed_figures(took, outs, "speculative")
    res = Comparison(figures=figures, output=output, compiled=compiled, identical=figures.identical,
                     degenerate=len(output) > 1 and len(set(output)) == 1)
    if compiled:
        eager = speed_figures(took, outs, "plain", base="eager plain", same_step=False)
        spec = speed_figures(took, outs, "speculative", base="eager plain", same_step=False)
        res = dataclasses.replace(res, eager_plain_bytes_s=eager.plain_bytes_s,
                                  compiled_plain_speedup=eager.speedup.mid,
                                  eager_speedup=spec.speedup.mid, identical=res.identical and eager.identical,
                                  compile_stats=decoder.policy.static.stats() if decoder.policy.static is not None else None)
    return res


def compile_line(stats: dict) -> str:
    """What compiling the static step cost (`StaticStep.stats`), and whether inductor's disk cache
    served it: the line `bench decode` and `generate` print under their figures."""
    if not stats["graphs"]:
        return "compiled step: no graph compiled in this run (compiled earlier in this process)"
    served = "the disk cache served" if stats["cache_hits"] and not stats["cache_misses"] else (
        f"disk cache: {stats['cache_hits']} hits, {stats['cache_misses']} misses")
    return f"compiled step: {stats['graphs']} graphs in {stats['compile_s']:.1f} s ({served})"


def repetition_line(rep: Repetition) -> str:
    """How repetitive decoded text is, in one line: its distinct 8-grams and zstd ratio, beside
    the real continuation's and the ratio of the zstd ratios where the prompts had one."""
    def figures(f: RepetitionFigures) -> str:
        distinct = "-" if f.distinct_8grams is None else f"{f.distinct_8grams:.2f}"
        ratio = "-" if f.zstd_ratio is None else f"{f.zstd_ratio:.2f}x"
        return f"distinct 8-grams {distinct}, zstd ratio {ratio}"
    line = f"repetition, decoded text ({rep.decoded.bytes:,} bytes): {figures(rep.decoded)}"
    if rep.real is not None:
        line += f"; real continuation: {figures(rep.real)}"
        if rep.zstd_ratio_over_real is not None:
            line += f"; decoded zstd ratio {rep.zstd_ratio_over_real:.2f}x the real's"
    return line
