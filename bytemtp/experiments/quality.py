"""Multi-token recipes against next-byte training, measured as users compare them: `bench quality`.

Each arm is a set of settings on top of a preset (the next-byte baseline, the paper's 8 heads, a
head schedule, heads on top of the next-byte trunk, linear heads, document masking, the teacher
term, or one of the user's). Every arm trains once per seed (train.seed and data.seed) for the same
wall time, or the same steps, and is scored on the same held-out bytes; the arms with draft heads
then get the demo's short tune of those heads (`tune-heads` for a fixed time) and the tuned greedy
chain's bytes per pass on held-out prompts. An arm's head 1 is held against the baseline of the
same seed (same initial stream of batches where the shapes allow): the ratio of their bits per
byte, with its spread over the seeds, says whether a recipe is better beyond the noise of a seed.

Built on the sweep (`sweep`): one candidate per arm and seed, named ARM-sSEED, trained in
seed-major order (every arm's first seed, then every arm's second) so that a machine whose speed
drifts slows every arm alike, and read back when measured, so an interrupted comparison goes on
where it stopped (a signal stops the whole comparison; what it cut, a training or a tune, is done
again by the next call: the sweep's rules). The arms are read without torch (the command line
lists them in its help); the sweep, and torch with it, is imported when a comparison runs. The
trade-off: equal wall time on one machine is what a user with a budget faces, but its figures hold
for that machine only; equal steps (`steps`) compare the same bytes.

The comparison is a `QualityResult` of one `ArmSummary` per arm, each figure over the seeds a
`Spread` (the mean and range, with each seed's; `{"mean", "min", "max", "each"}` in the JSON); its
JSON form (`to_json`, read back by `from_json`) is what `bench quality --json` writes, and its
`table` what the command prints.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from bytemtp.spread import Spread

if TYPE_CHECKING:  # the sweep imports torch: only when a comparison runs
    from bytemtp.experiments.sweep import CandidateResult

BASELINE = "ntp"
ARMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ntp": ("next-byte baseline: one head, the same layers", ("model.n_future=1",)),
    "mtp": ("8 heads, constant weights (the paper's loss)", ()),
    "forward": ("8 heads, forward curriculum: heads 2..8 join one by one", ("loss.head_schedule=forward",)),
    "reverse": ("8 heads, reverse curriculum: heads 8..2 fade to 0", ("loss.head_schedule=reverse",)),
    "ontop": ("8 heads on top of the next-byte trunk", ("model.param_match=false",)),
    "ontop-reverse": ("8 heads on top, reverse curriculum", ("model.param_match=false", "loss.head_schedule=reverse")),
    "linear": ("8 linear heads on a trunk of every layer", ("model.head_type=linear",)),
    "teacher": ("8 heads, head 1 teaching the others", ("loss.teacher_weight=1.0",)),
    "docmask": ("8 heads, attention kept inside each document", ("model.doc_mask=true",)),
    "ntp-docmask": ("next-byte baseline, attention inside each document", ("model.n_future=1", "model.doc_mask=true")),
    "ntp-trunk": ("next-byte model as deep as the 8-head model's trunk and one head", ()),  # sized in `arm_sets`
}
DEFAULT_ARMS = ("ntp", "mtp", "forward", "reverse", "ontop", "ontop-reverse", "linear", "docmask")


def parse_arm(text: str) -> tuple[str, tuple[str, ...]]:
    """A user's arm, NAME=SETTING[,SETTING...] (each a --set), e.g.
    `span3=loss.head_schedule=reverse,loss.head_schedule_span=0.3`."""
    name, _, sets = text.partition("=")
    if not name or "/" in name or not sets or name in ARMS:
        raise ValueError(f"--arm {text!r}: expected NAME=SETTING[,SETTING...], a new name without '/' "
                         f"(the built-in arms are {', '.join(ARMS)})")
    return name, tuple(s.strip() for s in sets.split(",") if s.strip())


def arm_sets(arm: str, preset: str, sets: list[str]) -> tuple[str, ...]:
    """An arm's settings; `ntp-trunk`'s depend on the preset's shape: one head on the trunk that
    heads 2..n share (the control that tells a gain of multi-token training from one of depth)."""
    if arm != "ntp-trunk":
        return ARMS[arm][1]
    from bytemtp.config_io import resolve

    model = resolve(preset, overrides=list(sets)).model
    return ("model.n_future=1", f"model.n_layers={model.trunk_layers + model.layers_per_head}")


def grid_of(preset: str, sets: list[str], arms: dict[str, tuple[str, ...]], seeds: int):
    """The sweep grid of the comparison: every arm at every seed, seed-major, the baseline first."""
    from bytemtp.experiments.sweep import Grid

    candidates = {f"{arm}-s{seed}": (*settings, f"train.seed={seed}", f"data.seed={seed}")
                  for seed in range(seeds) for arm, settings in arms.items()}
    return Grid(preset=preset, sets=tuple(sets), candidates=candidates)


def compare(preset: str = "small", *, data: str, arms: list[str] | None = None,
            extra: list[tuple[str, tuple[str, ...]]] = (), sets: list[str] = (), seeds: int = 2,
            budget_s: float = 180.0, steps: int = 0, eval_bytes: int = 102_400, tune_s: float = 30.0,
            prompts: int = 8, out: str | Path, fresh: bool = False) -> QualityResult:
    """Train, score and tune every arm at every seed (see the module docstring) into `out`, and
    summarize them against the baseline (`summary`); a run found there is read back only when it
    was trained with the settings asked for now, else refused unless `fresh` (`sweep.run_sweep`)."""
    from bytemtp.experiments.sweep import run_sweep

    names = list(arms or DEFAULT_ARMS)
    unknown = [a for a in names if a not in ARMS]
    if unknown:
        raise ValueError(f"no arm {unknown[0]!r}; the arms are {', '.join(ARMS)} (or add one with --arm)")
    shared = [f"data.path={data}", "train.eval_every=0", *sets]
    chosen = {BASELINE: ARMS[BASELINE][1]}
    chosen.update({a: arm_sets(a, preset, shared) for a in names})
    chosen.update(dict(extra))
    grid = grid_of(preset, shared, chosen, seeds)
    for name in grid.candidates:  # every setting checked before anything trains
        try:
            grid.config(name, budget_s=budget_s, steps=steps)
        except ValueError as e:
            raise ValueError(f"arm {name.rsplit('-s', 1)[0]!r}: {e}") from None
    results = run_sweep(grid, out, budget_s=budget_s, eval_bytes=eval_bytes, tune_s=tune_s, prompts=prompts,
                        steps=steps, fresh=fresh)
    by_arm: dict[str, list[CandidateResult]] = {arm: [] for arm in chosen}
    for r in results:
        by_arm[r.name.rsplit("-s", 1)[0]].append(r)
    labels = {**{a: ARMS[a][0] for a in chosen if a in ARMS}, **{a: " ".join(s) for a, s in extra}}
    return QualityResult(preset=preset, data=data, seeds=seeds, budget_s=0.0 if steps else budget_s, steps=steps,
                         eval_bytes=eval_bytes, tune_s=tune_s, out=str(out),
                         arms={arm: summary(rs, by_arm[BASELINE], label=labels[arm], sets=list(chosen[arm]))
                               for arm, rs in by_arm.items()})


@dataclasses.dataclass(frozen=True)
class ArmSummary:
    """One arm over its seeds (`summary`)."""
    label: str  # what the arm is
    sets: list[str]  # its settings on top of the preset and the shared ones
    params: int
    # each figure over the seeds: the mean, the range and each seed's (runs)
    bpb: Spread  # head-1 val bits per byte
    ratio: Spread  # head-1 bits per byte over the baseline's of the same seed
    steps: Spread
    ms_per_step: Spread
    verdict: str  # "better", "worse" or "within the seeds' spread"
    head_bpb: list[float] | None = None  # each head's bits per byte, the mean over the seeds (None: one head)
    tuned_chain_bytes_per_pass: Spread | None = None  # over the seeds whose draft heads were tuned

    def to_json(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Spread):
                out[f.name] = value.to_dict("mean", runs="each")
            elif value is not None or f.name not in ("head_bpb", "tuned_chain_bytes_per_pass"):
                out[f.name] = value
        return out

    @classmethod
    def from_json(cls, data: dict) -> ArmSummary:
        chain = data.get("tuned_chain_bytes_per_pass")
        return cls(label=data["label"], sets=list(data["sets"]), params=data["params"],
                   **{k: _seeds(data[k]) for k in ("bpb", "ratio", "steps", "ms_per_step")},
                   verdict=data["verdict"], head_bpb=data.get("head_bpb"),
                   tuned_chain_bytes_per_pass=None if chain is None else _seeds(chain))


def _seeds(data: dict) -> Spread:
    """A figure over the seeds read back from its JSON form."""
    return Spread.from_dict(data, "mean", runs="each")


@dataclasses.dataclass(frozen=True)
class QualityResult:
    """Every arm against the baseline (`compare`)."""
    preset: str
    data: str  # the corpus
    seeds: int
    budget_s: float  # each arm's training time (0.0: limited by steps)
    steps: int  # each arm's steps (0: limited by time)
    eval_bytes: int  # val bytes head 1 is scored on
    tune_s: float  # the draft heads' tune
    out: str  # where the runs are
    arms: dict[str, ArmSummary]  # the baseline first

    def to_json(self) -> dict:
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)[:8]},
                "arms": {arm: s.to_json() for arm, s in self.arms.items()}}

    def table(self) -> str:
        """The comparison as a Markdown table, the baseline first, then by head-1 bits per byte."""
        arms = self.arms
        order = [BASELINE] + sorted((a for a in arms if a != BASELINE), key=lambda a: arms[a].bpb.mid)
        limit = f"{self.steps} steps" if self.steps else f"{self.budget_s:g} s"
        lines = [f"{self.preset} on {self.data}, {limit} each, {self.seeds} seed(s); head 1 on the first "
                 f"{self.eval_bytes:,} val bytes; draft heads tuned {self.tune_s:g} s",
                 "| arm | what | params | steps | ms/step | head-1 val bpb (seeds' range) | ratio to ntp (range) | "
                 "verdict | tuned chain-8 bytes/pass |", "|---|---|---|---|---|---|---|---|---|"]
        for a in order:
            s = arms[a]
            chain = s.tuned_chain_bytes_per_pass
            lines.append(f"| {a} | {s.label} | {s.params / 1e6:.2f}M | {s.steps.mid:.0f} | "
                         f"{s.ms_per_step.mid:.0f} | {s.bpb.format('{:.4f}')} | {s.ratio.format('{:.4f}')} | "
                         f"{'-' if a == BASELINE else s.verdict} | {'-' if chain is None else '%.2f' % chain.mid} |")
        return "\n".join(lines)

    @classmethod
    def from_json(cls, data: dict) -> QualityResult:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)[:8]},
                   arms={arm: ArmSummary.from_json(s) for arm, s in data["arms"].items()})


def summary(runs: list[CandidateResult], baseline: list[CandidateResult], *, label: str,
            sets: list[str]) -> ArmSummary:
    """One arm over its seeds: head-1 bits per byte, its ratio to the baseline of the same seed,
    steps and seconds a step, and (where tuned) the tuned chain's bytes per pass; `verdict` says
    whether every seed's ratio lies below 1 (better), above 1 (worse) or some on each side."""
    ratios = [r.val_bpb[0] / b.val_bpb[0] for r, b in zip(runs, baseline)]
    heads = len(runs[0].val_bpb)
    chains = [r.tuned.tuned_chain_bytes_per_pass for r in runs if r.tuned is not None]
    def seeds(values: list[float]) -> Spread:
        return Spread.mean_of(values, keep_runs=True)

    return ArmSummary(
        label=label, sets=sets, params=runs[0].params, bpb=seeds([r.val_bpb[0] for r in runs]),
        ratio=seeds(ratios), steps=seeds([r.steps for r in runs]),
        ms_per_step=seeds([1000 * r.train_s / r.steps for r in runs]),
        verdict="better" if max(ratios) < 1 else "worse" if min(ratios) > 1 else "within the seeds' spread",
        head_bpb=[statistics.fmean(r.val_bpb[k] for r in runs) for k in range(heads)] if heads > 1 else None,
        tuned_chain_bytes_per_pass=seeds(chains) if chains else None)
