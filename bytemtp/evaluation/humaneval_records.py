"""HumanEval's records (bytemtp.evaluation.humaneval): a decoded completion, the decoding
statistics and the speed comparison of a run, a completion checked against its tests, a task's
and a whole check's results, and the run with its settings. Each is frozen and owns its JSON form
(`to_json`), which is what `bytemtp eval-task humaneval --json` writes, key for key; the run also
renders what the command prints (`HumanEvalRun.table`). The trade-off: the JSON shape is spelled
out by hand where a field's form differs (sorted heads with str keys, the optional `prompt_fits`
and `comparison`), so that the files keep the form they always had.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from bytemtp.decoding.generation import Generation, SpeculativeStats
from bytemtp.evaluation.execution import Outcome
from bytemtp.evaluation.guard import PASSED
from bytemtp.spread import Spread
from bytemtp.tables import table


@dataclass(frozen=True)
class Completion:
    """One decoded completion of a problem (`sample_completions`)."""
    completion: str  # cut before the stop string
    stopped_by: str  # eos, stop or max_bytes
    slid: bool  # the window slid: the model did not see the whole prompt
    bytes: int  # bytes decoded, the stop string included
    forward_passes: int

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class DecodingSummary:
    """The decoding statistics of a run, summed over its completions (`SpeculativeStats.total`)."""
    bytes: int
    forward_passes: int
    drafted: list[int]  # per draft depth: passes that offered it
    accepted: list[int]  # ... and passes whose output used it
    heads_used: dict[int, int]  # heads run in a pass -> passes
    slides: int
    wall_s: float  # seconds of speculative decoding

    @classmethod
    def of(cls, generations: Sequence[Generation], seconds: float) -> DecodingSummary:
        total = SpeculativeStats.total(g.stats for g in generations)
        return cls(bytes=total.bytes_out, forward_passes=total.forward_passes, drafted=total.drafted,
                   accepted=total.accepted, heads_used=dict(sorted(total.heads_used.items())), slides=total.slides,
                   wall_s=seconds)

    @property
    def bytes_per_forward(self) -> float:
        return self.bytes / max(1, self.forward_passes)

    @property
    def acceptance(self) -> list[float]:
        """Accepted over drafted at each draft depth."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted, self.drafted)]

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.wall_s if self.wall_s > 0 else 0.0

    def to_json(self) -> dict:
        return {"bytes": self.bytes, "forward_passes": self.forward_passes, "bytes_per_forward": self.bytes_per_forward,
                "drafted": self.drafted, "accepted": self.accepted,
                "acceptance": self.acceptance,
                "heads_used": {str(k): v for k, v in self.heads_used.items()}, "slides": self.slides,
                "wall_s": self.wall_s, "bytes_per_s": self.bytes_per_s}


@dataclass(frozen=True)
class SpeedComparison:
    """Speculative against plain greedy decoding of a run's batches (`compare`), measured by
    `bytemtp.decoding.speed`; `note` says why the speedup means nothing, or is empty."""
    plain_s: float
    speculative_s: float
    speedup: Spread  # mid: plain time over speculative time; low and high: over the batches
    batches: int
    identical: bool
    note: str

    def to_json(self) -> dict:
        """The figures, the speedup flat (`speedup`, `speedup_min`, `speedup_max`)."""
        return {"plain_s": self.plain_s, "speculative_s": self.speculative_s, **self.speedup.flat("speedup"),
                "batches": self.batches, "identical": self.identical, "note": self.note}


@dataclass(frozen=True)
class Sampled:
    """What `sample_completions` decoded."""
    completions: dict[str, list[Completion]]  # task_id -> its samples
    prompt_fits: dict[str, bool]  # task_id -> the prompt fits the model's context
    heads: int | str  # the heads that drafted, or "auto"
    decoding: DecodingSummary
    compile: str  # on or off: whether the passes ran the compiled static step
    compile_stats: dict | None
    comparison: SpeedComparison | None = None  # with compare only


@dataclass(frozen=True)
class Checked:
    """A completion run with its problem's tests: its verdict (bytemtp.evaluation.execution) and
    why, and how it was decoded when `sample_completions` decoded it."""
    completion: str
    verdict: str
    detail: str
    sampled: Completion | None = None

    @classmethod
    def of(cls, completion: str | Completion, outcome: Outcome) -> Checked:
        if isinstance(completion, Completion):
            return cls(completion.completion, outcome.verdict, outcome.detail, sampled=completion)
        return cls(completion, outcome.verdict, outcome.detail)

    @property
    def passed(self) -> bool:
        return self.verdict == PASSED

    def to_json(self) -> dict:
        head = self.sampled.to_json() if self.sampled is not None else {"completion": self.completion}
        return {**head, "verdict": self.verdict, "detail": self.detail}


@dataclass(frozen=True)
class TaskResult:
    """A problem's checked completions: n of them, `passed` passed."""
    task_id: str
    n: int
    passed: int
    completions: list[Checked]
    prompt_fits: bool | None = None  # known when the run decoded the completions

    def to_json(self) -> dict:
        out = {"task_id": self.task_id, "n": self.n, "passed": self.passed,
               "completions": [c.to_json() for c in self.completions]}
        if self.prompt_fits is not None:
            out["prompt_fits"] = self.prompt_fits
        return out


@dataclass(frozen=True)
class Execution:
    """How the programs ran: the sandbox (bwrap or guard), the limits and the time it took, and
    what the sandbox could not stop (`guard.LIMITS` with the guard alone; "" under bubblewrap): a
    score from the guard alone carries its caveat wherever it is read."""
    sandbox: str
    timeout: float
    memory_mb: int
    wall_s: float
    caveat: str = ""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class CheckResult:
    """What `check_completions` scored."""
    pass_at_k: dict[str, float]  # "pass@k": mean over problems
    shares: dict[str, float]  # verdict: share of completions
    problems: int  # problems with completions
    completions: int
    missing: list[str]  # task ids of the problems without completions
    execution: Execution
    tasks: list[TaskResult]

    def to_json(self) -> dict:
        return {"pass_at_k": self.pass_at_k, "shares": self.shares, "problems": self.problems,
                "completions": self.completions, "missing": self.missing, "execution": self.execution.to_json(),
                "tasks": [t.to_json() for t in self.tasks]}


@dataclass(frozen=True)
class Settings:
    """The settings of a run (`run_humaneval`)."""
    samples: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    batch_size: int
    max_bytes: int
    heads: int | str
    seq_len: int
    n_future: int
    stop: list[str]
    compile: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class HumanEvalRun:
    """A whole run (`run_humaneval`): its settings, the check of its completions, how they were decoded."""
    settings: Settings
    check: CheckResult
    decoding: DecodingSummary
    comparison: SpeedComparison | None  # with compare only
    slid: int  # completions whose window slid
    compile_stats: dict | None

    def to_json(self) -> dict:
        extra = {"comparison": self.comparison.to_json()} if self.comparison is not None else {}
        return {"settings": self.settings.to_json(), **self.check.to_json(), "decoding": self.decoding.to_json(),
                **extra, "slid": self.slid, "compile_stats": self.compile_stats}

    def table(self, *, source: str, ckpt: str, device: str, dtype: str) -> str:
        """What `eval-task humaneval` prints of the run: what was run (the problems' `source`, the
        checkpoint, device and dtype), pass@k, the verdicts' shares, the decoding statistics, the
        speedup where it was measured, and whether the prompts fit the context."""
        s, dec, check = self.settings, self.decoding, self.check
        n = check.problems
        how = "greedy" if s.temperature == 0 else f"temperature {s.temperature:g}, top-p {s.top_p:g}, seed {s.seed}"
        lines = [f"{n} problems of {source}, {s.samples} sample(s) each ({how}), "
                 f"at most {s.max_bytes} bytes; {ckpt}, {device} {dtype}"]
        rows = [(k, f"{v:.4f}") for k, v in check.pass_at_k.items()]
        rows += [(verdict, f"{100 * share:.1f}% of {check.completions}") for verdict, share in check.shares.items()]
        lines.append(table(rows, ("score", "value")))
        rates = ", ".join(f"d{j + 1} {a:,}/{d:,}" for j, (a, d) in enumerate(zip(dec.accepted, dec.drafted)) if d)
        lines.append(f"decoding: {dec.bytes:,} bytes in {dec.forward_passes:,} forward passes "
                     f"({dec.bytes_per_forward:.2f} bytes/pass), {dec.bytes_per_s:,.0f} bytes/s; heads "
                     f"{s.heads}; drafts accepted/drafted by depth: {rates or 'none drafted'}")
        if self.comparison is not None:
            c = self.comparison
            lines.append(f"speedup over plain greedy decoding: {c.speedup.mid:.2f}x ({c.speedup.low:.2f}-"
                         f"{c.speedup.high:.2f} over {c.batches} batches, interleaved); outputs identical: "
                         f"{'yes' if c.identical else 'NO'}" + (f"\nnote: {c.note}" if c.note else ""))
        else:
            lines.append("speedup over plain decoding: not measured (--compare decodes plainly too); bytes/pass "
                         "is its upper bound")
        longer = sum(not t.prompt_fits for t in check.tasks)
        lines.append(f"context: {longer} of {n} prompts are longer than the model's {s.seq_len} bytes "
                     f"and {self.slid} of {check.completions} completions slid the window (the model saw "
                     "only the newest bytes)" if longer or self.slid else
                     f"context: every prompt fits the model's {s.seq_len} bytes")
        return "\n".join(lines)
