"""A preset sized by measurement: every candidate of a grid trained for the same wall time on the
same corpus, then scored on the same held-out bytes, with what its draft heads give decoding.

A grid is a TOML file: a preset, settings every candidate shares, and candidates, each a name and
its own `section.key=value` settings (the CLI's --set)::

    preset = "small"
    sets = ["data.path=data/corpus/stdlib"]

    [[candidate]]
    name = "w128-b16"
    sets = ["model.d_model=128", "data.batch_size=16", "train.lr=3e-3"]

`run_sweep` trains each candidate into OUT/NAME for `budget_s` seconds (train.max_time: the schedule
is fitted to the time), scores head 1 on the first `eval_bytes` bytes of the val split (the same
bytes for every context length and batch), and where `tune_s` is given tunes the draft heads for
that long (`bytemtp tune-heads`, as `make demo` does) and reports the greedy chain's bytes per pass
on held-out prompts and eager decoding's speed on them (`bench.decode_speed`, plain against the
chain of every head). A candidate whose OUT/NAME/sweep.json exists is read back, not trained
again, so a sweep stopped half way goes on where it stopped, and two processes can share the
candidates out (`only`); one measured without a tune is tuned when a later call asks for one. A
signal (Ctrl-C, SIGTERM) stops the sweep, not only the candidate training or tuning then
(`SweepInterrupted`, which the command turns into one line and exit status 130). Nothing cut short
counts as done: a candidate's sweep.json is written, whole, once it is measured and again once its
tune is measured; a candidate cut before that is trained again from its start by the next call
(one limited by steps resumes: its steps are exact), and a cut tune is done anew (its NAME-tuned
folder removed first, as it is whenever its candidate trains again), since a time budget spent over
two sessions is not the budget the others had.
The trade-off: candidates run one after another in the process, so a
sweep of n candidates takes n budgets; the figures are comparable only within one machine and one
sitting (run two halves at the same time, one thread each, for twice the candidates an hour).

A candidate's figures are a `CandidateResult`; OUT/NAME/sweep.json is its JSON form (`to_json`),
unchanged since the sweep began, and `from_json` reads back every file a sweep has written (the
first ones had no `train_s`). The candidates of a sweep are a `SweepResult`, whose `table` is what
`bench sweep` prints and whose JSON form is the list of theirs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import sys
import threading
import tomllib
from pathlib import Path

import torch
from tqdm import tqdm

from bytemtp import config as config_lib
from bytemtp import config_io
from bytemtp.data.splits import has_val_split
from bytemtp.decoding.repetition import Repetition
from bytemtp.evaluation.evaluate import draft_report, evaluate
from bytemtp.experiments.bench import DecodeCase, decode_speed
from bytemtp.runtime.checkpoint import load_model, read_train_state
from bytemtp.runtime.devices import resolve_device
from bytemtp.training import runs
from bytemtp.training.train import run_plan, train

RESULT = "sweep.json"


class SweepInterrupted(RuntimeError):
    """A signal stopped a candidate's training or tune: the sweep stops, and what was cut is not kept."""


EVAL_BATCH = 8  # windows a validation batch; the batches are as many as eval_bytes needs


@dataclasses.dataclass(frozen=True)
class Grid:
    """A sweep's candidates: each name's settings on top of the preset and the shared ones."""

    preset: str
    sets: tuple[str, ...]
    candidates: dict[str, tuple[str, ...]]

    def config(self, name: str, *, budget_s: float, steps: int = 0) -> config_lib.Config:
        """The candidate's configuration, limited by time alone (or, given `steps`, by steps alone)."""
        limit = [f"train.steps={steps}", "train.max_time=0"] if steps else ["train.steps=0", f"train.max_time={budget_s}"]
        return config_io.resolve(self.preset, overrides=[*self.sets, *self.candidates[name], "train.max_bytes=0",
                                                          *limit])


def read_grid(path: str | Path, *, shared: list[str] = ()) -> Grid:
    """A grid file, every candidate's configuration checked before anything trains (ValueError);
    `shared` (`bench sweep --set`, e.g. train.log_to=jsonl,tensorboard) join the grid's shared settings."""
    try:
        raw = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"cannot read the grid {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"the grid {path} is not valid TOML: {e}") from None
    unknown = sorted(set(raw) - {"preset", "sets", "candidate"})
    if unknown:
        raise ValueError(f"the grid {path} has an unknown key {unknown[0]!r}; allowed: preset, sets, candidate")
    candidates = {}
    for i, c in enumerate(raw.get("candidate", [])):
        name, sets = c.get("name"), c.get("sets", [])
        if not isinstance(name, str) or not name or "/" in name or not isinstance(sets, list):
            raise ValueError(f"the grid {path}: candidate {i + 1} needs a name (no '/') and a list of sets")
        if name in candidates:
            raise ValueError(f"the grid {path} names the candidate {name!r} twice")
        candidates[name] = tuple(sets)
    if not candidates:
        raise ValueError(f"the grid {path} has no [[candidate]]")
    grid = Grid(preset=raw.get("preset", "small"), sets=(*raw.get("sets", []), *shared), candidates=candidates)
    for name in candidates:
        try:
            grid.config(name, budget_s=1.0)
        except ValueError as e:
            raise ValueError(f"the grid {path}, candidate {name!r}: {e}") from None
    return grid


@dataclasses.dataclass(frozen=True)
class TunedFigures:
    """What a candidate's draft heads give decoding after the demo's tune (`_tuned`)."""
    tuned_chain_bytes_per_pass: float  # the greedy chain of every head, on held-out prompts
    tuned_tree_bytes_per_pass: float  # the tree of every head, the same prompts
    eager_speedup: float  # eager decoding's speed, the chain of every head over plain
    plain_bytes_s: float
    repetition: Repetition | None  # how repetitive the chain's decoded text is
    decode: DecodeCase  # the decode benchmark's case: chain-all at batch 1

    def to_json(self) -> dict:
        case = {k: v for k, v in self.decode.to_json().items() if k not in ("batch_size", "mode")}
        return {"tuned_chain_bytes_per_pass": self.tuned_chain_bytes_per_pass,
                "tuned_tree_bytes_per_pass": self.tuned_tree_bytes_per_pass, "eager_speedup": self.eager_speedup,
                "plain_bytes_s": self.plain_bytes_s,
                "repetition": None if self.repetition is None else dataclasses.asdict(self.repetition),
                "decode": case}

    @classmethod
    def from_json(cls, data: dict) -> TunedFigures:
        rep = data.get("repetition")
        return cls(tuned_chain_bytes_per_pass=data["tuned_chain_bytes_per_pass"],
                   tuned_tree_bytes_per_pass=data["tuned_tree_bytes_per_pass"], eager_speedup=data["eager_speedup"],
                   plain_bytes_s=data["plain_bytes_s"], repetition=None if rep is None else Repetition.from_json(rep),
                   decode=DecodeCase.from_json({"batch_size": 1, "mode": "chain-all", **data["decode"]}))


@dataclasses.dataclass(frozen=True)
class CandidateResult:
    """One candidate trained and scored (`run_candidate`); its JSON form is OUT/NAME/sweep.json."""
    name: str
    sets: list[str]  # its own settings, on top of the preset and the shared ones
    params: int
    budget_s: float
    steps: int  # steps trained
    bytes_seen: int
    train_s: float | None  # seconds of training; None in files of the first sweeps, which did not keep it
    stopped_by: str  # what ended the training: time, schedule, steps, ...
    val_bytes: int  # bytes scored, the same for every candidate
    val_bpb: list[float]  # bits per byte of each head on them
    head_agreement: dict[int, float]  # k: heads 2..k all agree with head 1
    tuned: TunedFigures | None = None  # None: its draft heads not tuned (yet)

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)[:11]}
        if self.train_s is None:
            del out["train_s"]
        out.update(sets=list(self.sets), val_bpb=list(self.val_bpb),
                   head_agreement={str(k): v for k, v in self.head_agreement.items()})
        return out | (self.tuned.to_json() if self.tuned is not None else {})

    @classmethod
    def from_json(cls, data: dict) -> CandidateResult:
        """A sweep.json read back, from this version or an earlier one."""
        given = {f.name: data[f.name] for f in dataclasses.fields(cls)[:11]
                 if f.name not in ("train_s", "head_agreement")}
        return cls(**given,
                   train_s=data.get("train_s"),
                   head_agreement={int(k): v for k, v in data["head_agreement"].items()},
                   tuned=TunedFigures.from_json(data) if "tuned_chain_bytes_per_pass" in data else None)


def run_candidate(grid: Grid, name: str, out: Path, *, budget_s: float, eval_bytes: int, tune_s: float,
                  prompts: int, steps: int = 0, say=tqdm.write) -> CandidateResult:
    """Train, score and (with tune_s) tune one candidate; its figures, also kept in OUT/NAME/sweep.json
    (written once it is measured, and again once its tune is)."""
    cfg = grid.config(name, budget_s=budget_s, steps=steps)
    run_dir = out / name
    device = resolve_device(cfg.train.device)
    if (run_dir / RESULT).is_file():  # measured before; a tune may be asked for now
        figures = CandidateResult.from_json(json.loads((run_dir / RESULT).read_text()))
    else:
        if run_dir.exists() and not steps:  # interrupted: a time budget is not split over sessions
            say(f"{name} was interrupted before it was measured: training it anew")
            shutil.rmtree(run_dir)
        shutil.rmtree(_tune_dir(run_dir), ignore_errors=True)  # a tune of an earlier training of it
        result = train(cfg, run_dir, resume=(run_dir / "checkpoints").is_dir(), say=say)
        if result.stopped_by == "signal":
            raise SweepInterrupted(f"stopped during {name}: run the same command again to go on "
                                   f"({'it resumes' if steps else 'it trains anew'}; the candidates measured are kept)")
        model, _ = load_model(result.checkpoint, device=device)
        batches = max(1, math.ceil(eval_bytes / (EVAL_BATCH * cfg.model.seq_len)))
        ev = evaluate(model, cfg.data.path, split="val", batches=batches, batch_size=EVAL_BATCH, device=device)
        figures = CandidateResult(name=name, sets=list(grid.candidates[name]), params=model.num_params(),
                                  budget_s=budget_s, steps=result.step, bytes_seen=result.bytes_seen,
                                  train_s=read_train_state(result.checkpoint)["elapsed_s"],
                                  stopped_by=result.stopped_by, val_bytes=ev.bytes, val_bpb=ev.bpb,
                                  head_agreement=dict(ev.agreement))
        _keep(run_dir, figures)  # measured: a tune cut short later does not cost its training
    if tune_s and cfg.model.n_future > 1 and figures.tuned is None:
        figures = dataclasses.replace(figures, tuned=_tuned(run_dir, name=name, budget_s=tune_s, prompts=prompts,
                                                            device=device, say=say))
        _keep(run_dir, figures)
    return figures


def _keep(run_dir: Path, figures: CandidateResult) -> None:
    """Write OUT/NAME/sweep.json whole or not at all (a new file renamed over the old)."""
    tmp = run_dir / f".{RESULT}.tmp"
    tmp.write_text(json.dumps(figures.to_json(), indent=2) + "\n")
    os.replace(tmp, run_dir / RESULT)


def _tune_dir(run_dir: Path) -> Path:
    return run_dir.with_name(run_dir.name + "-tuned")


def _tuned(run_dir: Path, *, name: str, budget_s: float, prompts: int, device: torch.device, say) -> TunedFigures:
    """The demo's tune of the draft heads for budget_s, then the greedy chain's bytes per pass and
    eager decoding's speed (plain against the chain of every head) on held-out prompts. A tune is
    kept only with its figures: one found without them was cut short, and is done anew (its budget
    is a time, which is not split over sessions)."""
    tuned = _tune_dir(run_dir)
    if tuned.exists():
        say(f"{name}'s tune was interrupted before it was measured: tuning it anew")
        shutil.rmtree(tuned)
    result = run_plan(runs.plan_tune(run_dir, tuned, overrides=[f"train.max_time={budget_s}"]), say=say)
    if result.stopped_by == "signal":
        raise SweepInterrupted(f"stopped during {name}'s tune: run the same command again to go on (the tune starts "
                               f"anew; {name}'s training and the candidates measured are kept)")
    model, cfg = load_model(tuned, device=device)
    report = draft_report(model, cfg.data.path, batches=4, prompts=prompts, device=device)
    speed = decode_speed(str(tuned), n_prompts=prompts, max_bytes=128, batch_sizes=(1,), modes=("chain-all",),
                         rounds=1, device=str(device), eval_batches=0, compile="off")
    top = speed.top.figures
    return TunedFigures(tuned_chain_bytes_per_pass=report.decoded_bytes_per_forward["chain-all"],
                        tuned_tree_bytes_per_pass=report.decoded_bytes_per_forward["tree-all"],
                        eager_speedup=top.speedup.mid, plain_bytes_s=top.plain_bytes_s, repetition=top.repetition,
                        decode=speed.cases[0])


def run_sweep(grid: Grid, out: str | Path, *, budget_s: float, eval_bytes: int = 102_400, tune_s: float = 0.0,
              prompts: int = 8, only: list[str] | None = None, steps: int = 0,
              fresh: bool = False) -> list[CandidateResult]:
    """`run_candidate` of every candidate (or those named in `only`), in the grid's order; with
    `steps`, each trains that many steps instead of budget_s seconds.

    A candidate's run found in `out` is read back (or resumed) only when it was trained with the
    settings asked for now (`differing_settings`: budget, corpus, preset, shapes); one trained with
    others stops the sweep before anything trains, in one line that names them, unless `fresh`
    says to train it anew (its run and tune removed first, none of them while a training holds its
    lock: another sweep training it stops this one, `RunLocked`, before anything is removed). Every sweep-like command (`bench sweep`,
    `bench quality`, `bench tokens`) goes through here, so each refuses alike."""
    names = only or list(grid.candidates)
    missing = [n for n in names if n not in grid.candidates]
    if missing:
        raise ValueError(f"no candidate {missing[0]!r} in the grid; it has {', '.join(grid.candidates)}")
    out = Path(out)
    stale = []
    for name in names:  # every candidate checked before anything trains
        cfg = grid.config(name, budget_s=budget_s, steps=steps)
        if not has_val_split(cfg.data):  # each candidate is scored on its val split
            raise ValueError(f"candidate {name!r}: {cfg.data.path} has no val split to score on; prepare it with "
                             "`make corpus` or `bytemtp prep`")
        differ = differing_settings(out / name, cfg)
        if differ and not fresh:
            raise ValueError(f"{out / name} was trained with other settings than asked for now ({'; '.join(differ)}); "
                             "train it anew with --fresh, or use another --out")
        stale += [name] if differ else []
    for name in stale:  # none goes while a training holds it (another sweep's): RunLocked names the holder
        for run_dir in (out / name, _tune_dir(out / name)):
            runs.check_unlocked(run_dir)
    for name in stale:  # fresh: a run of other settings and its tune go, and the candidate trains anew
        shutil.rmtree(out / name)
        shutil.rmtree(_tune_dir(out / name), ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    say = lambda text: tqdm.write(text, file=sys.stderr)  # noqa: E731 (stdout may carry the table)
    results = []
    with _terminate_interrupts():
        for n in names:
            try:
                results.append(run_candidate(grid, n, out, budget_s=budget_s, eval_bytes=eval_bytes, tune_s=tune_s,
                                             prompts=prompts, steps=steps, say=say))
            except KeyboardInterrupt:  # outside a training, which takes the signal at a step's end itself
                raise SweepInterrupted(f"stopped during {n}: run the same command again to go on (what of it was "
                                       f"not measured is done again; the candidates measured are kept)") from None
    return results


def differing_settings(run_dir: Path, cfg: config_lib.Config) -> list[str]:
    """The settings in which the run in `run_dir` (its run-config.json) differs from `cfg`, each as
    `section.key: was -> now` (corpus and tokenizer paths compared resolved); empty where they are
    the same or nothing was trained there yet."""
    saved = run_dir / runs.RUN_CONFIG
    if not saved.is_file():
        return []

    def flat(d: dict) -> dict:
        return {f"{section}.{key}": str(Path(v).resolve()) if section == "data" and key in ("path", "tokenizer") and v
                else v for section, values in d.items() for key, v in values.items()}

    was, now = flat(json.loads(saved.read_text())), flat(json.loads(json.dumps(config_io.to_dict(cfg))))
    return [f"{key}: {was.get(key)!r} -> {now.get(key)!r}" for key in sorted(was.keys() | now.keys())
            if was.get(key) != now.get(key)]


@contextlib.contextmanager
def _terminate_interrupts():
    """While the sweep runs in the main thread, SIGTERM raises KeyboardInterrupt as Ctrl-C does (a
    training in between takes both itself, at its next step); a handler set by someone else is left."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """The candidates a sweep measured (`run_sweep`'s), in its order; its JSON form is theirs, a list."""
    candidates: list[CandidateResult]

    def to_json(self) -> list[dict]:
        return [c.to_json() for c in self.candidates]

    def table(self) -> str:
        """The sweep as a Markdown table, lowest head-1 bits per byte first."""
        rows = ["| candidate | settings | params | steps | bytes seen | head-1 val bpb | head-2 agrees | "
                "tuned chain bytes/pass | eager speedup | decoded zstd ratio / real |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(self.candidates, key=lambda r: r.val_bpb[0]):
            tuned = r.tuned
            chain, speed = (tuned.tuned_chain_bytes_per_pass, tuned.eager_speedup) if tuned else (None, None)
            over = tuned.repetition.zstd_ratio_over_real if tuned and tuned.repetition else None
            rows.append(f"| {r.name} | {' '.join(r.sets)} | {r.params / 1e6:.2f}M | {r.steps} | "
                        f"{r.bytes_seen / 1e6:.2f} MB | {r.val_bpb[0]:.3f} | {r.head_agreement.get(2, 0):.3f} | "
                        f"{'-' if chain is None else f'{chain:.2f}'} | {'-' if speed is None else f'{speed:.2f}x'} | "
                        f"{'-' if over is None else f'{over:.2f}'} |")
        return "\n".join(rows)
