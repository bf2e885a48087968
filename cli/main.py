"""`bytemtp` commands. Each one parses its options, calls one library function and prints.

Errors a user can cause (a bad preset, an unknown --set key, an unreadable file) arrive here as
ValueError (CheckpointError is one) and leave as one line and exit status 1, never a traceback.
Heavy imports (torch) happen inside the commands, so `bytemtp --help` is instant. The shared
options and the parsing of what users type live in `options`, the tables and reports in `report`.
"""

from __future__ import annotations

import json
import os
import sys

import click

from bytemtp import __version__
from bytemtp import config as config_lib
from bytemtp import config_io
from bytemtp import config_docs

from . import report
from .bench import bench
from .corpus import prep_cmd, verify_cmd
from .eval_task import eval_task
from .export import export_cmd
from .generate import generate_cmd
from .harness import lm_eval_cmd
from .serve import serve_cmd
from .options import (OneLineErrors, check_output_dir, device_option, dtype_option, empty_split_error, json_option,
                      one_target, parse_counts, parse_duration, parse_size, preset_option, renamed)
from .report import echo, table, write_json


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bytemtp")
def main() -> None:
    """Byte-level language models with multi-token prediction heads."""


@main.command("config")
@preset_option("small")
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML or JSON file of settings applied on top of the preset.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override one setting, e.g. --set model.n_future=4 (repeatable).")
@click.option("--keys", is_flag=True,
              help="List every setting with its value (after --preset, --config and --set) and meaning.")
def config_cmd(preset: str, config_file: str | None, overrides: tuple[str, ...], keys: bool) -> None:
    """Show the resolved configuration and the model's parameter counts."""
    cfg = config_io.resolve(preset, config_file=config_file, overrides=list(overrides))
    if keys:
        click.echo(table(config_docs.settings(config_lib.Config, values=cfg), ("setting", f"value ({preset})", "meaning")))
        return
    import torch

    from bytemtp.model.model import ByteMTP

    with torch.device("meta"):
        model = ByteMTP(cfg.model)
    click.echo(config_io.to_json(cfg))
    m = cfg.model
    parts = ("embed", "trunk", "heads", "unembed", *(("drafter",) if model.drafter is not None else ()))
    rows = [(part, f"{model.num_params(part):,}") for part in parts]
    rows.append(("total", f"{model.num_params():,}"))
    click.echo(f"\n{m.trunk_layers} trunk layers + {m.n_future} {m.head_type} heads "
               f"of {m.layers_per_head} layer(s) = {m.total_layers} layers\n")
    click.echo(table(rows, ("part", "parameters")))


@main.command("corpus-info")
@click.argument("path")
@click.option("--field", default="text", show_default=True, help="JSON field or table column holding the text.")
@json_option()
def corpus_info_cmd(path: str, field: str, json_path: str | None) -> None:
    """Documents, bytes, compression ratio and splits of a corpus (prepared or not)."""
    from bytemtp.data import corpus, shards

    info = corpus.describe(path, field=field)
    if "manifest" in info:
        m = info["manifest"]
        echo(f"corpus   {path}\nsource   {m.get('source')}\nlicence  {m.get('licence')}\n"
             f"created  {m.get('created')}  by bytemtp {m.get('bytemtp_version')}\n"
             f"format   {m.get('format_version')}" + ("" if m.get("format_version") == shards.FORMAT_VERSION
                                                     else " (JSONL shards: read, but `bytemtp prep` it again "
                                                          "for raw-byte shards and the faster loader)"))
        echo(corpus.corpus_table(m))
        if not json_path:
            echo("manifest.json:\n" + json.dumps(m, indent=2))
    else:
        rows = [("files", f"{info['files']:,}"), ("documents", f"{info['documents']:,}"),
                ("bytes", f"{info['bytes']:,}"), ("on disk", f"{info['compressed_bytes']:,}"),
                ("ratio", f"{info['bytes'] / max(1, info['compressed_bytes']):.2f}")]
        rows += [(f"skipped {k}", f"{v:,}") for k, v in sorted(info.get("skipped", {}).items())]
        echo(table(rows, ("corpus " + path, "")))
    write_json(json_path, {"corpus": path, **info})


@main.command("train")
@preset_option("small")
@click.option("--data", "data_path", default=None,
              help="Corpus (prepared directory, folder, glob or file); default data/corpus/stdlib.")
@click.option("--out", default=None, type=click.Path(file_okay=False), help="Run directory.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML or JSON file of settings applied on top of the preset.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override one setting, e.g. --set train.lr=3e-4 (repeatable; see bytemtp config --keys).")
@click.option("--steps", type=click.IntRange(1), help="Stop after this many optimizer steps.")
@click.option("--bytes", "max_bytes", help="Stop after this many training bytes (e.g. 50M).")
@click.option("--time", "max_time", help="Stop after this much wall time (e.g. 10m, 1h30m).")
@click.option("--resume", "resume", is_flag=False, flag_value="", default=None, metavar="[RUN]",
              help="Continue a run from its newest checkpoint (the run directory here or in --out).")
@click.option("--parallel", type=click.Choice(config_lib.PARALLEL), default=None,
              help="Under torchrun: DDP (default) or FSDP2 (train.parallel).")
@click.option("--nproc", type=click.IntRange(1), default=None,
              help="Launch this many processes on this machine with torchrun (one per GPU).")
@device_option(None)
def train_cmd(preset: str, data_path: str | None, out: str | None, config_file: str | None,
              overrides: tuple[str, ...], steps: int | None, max_bytes: str | None,
              max_time: str | None, resume: str | None, parallel: str | None, nproc: int | None,
              device: str | None) -> None:
    """Train (or resume) a byte model with multi-token prediction.

    On many GPUs: `torchrun --nproc-per-node 8 -m bytemtp_cli train ...` (add --nnodes and a
    rendezvous endpoint across machines), or `bytemtp train --nproc 8 ...` on one machine.
    """
    if nproc is not None:
        _relaunch_with_torchrun(nproc)
    flags = {"train.parallel": parallel, "train.device": device, "data.path": data_path, "train.steps": steps,
             "train.max_bytes": max_bytes and parse_size(max_bytes),
             "train.max_time": max_time and parse_duration(max_time)}
    sets = list(overrides) + [f"{key}={value}" for key, value in flags.items() if value]
    run_dir = resume or out
    if not run_dir:
        raise click.UsageError("give the run directory: --out DIR (or --resume DIR)")
    if resume is not None and out and resume and resume != out:
        raise click.UsageError(f"--resume {resume} and --out {out} name different runs")
    preset_given = click.get_current_context().get_parameter_source("preset") != click.core.ParameterSource.DEFAULT
    from bytemtp.training import runs
    from bytemtp.training import train as train_lib
    from bytemtp.training.faults import TrainingError

    plan = runs.plan_run(run_dir, resume=resume is not None, preset=preset if preset_given else None,
                         config_file=config_file, overrides=sets)
    cfg, main_rank = plan.cfg, os.environ.get("RANK", "0") == "0"
    if plan.done is not None:
        if main_rank:
            done = plan.done
            if cfg.train.steps and done.step >= cfg.train.steps:
                limit = f"--steps {cfg.train.steps}; nothing changed (raise the limit to train on)"
            elif cfg.train.max_bytes and done.bytes_seen >= cfg.train.max_bytes:
                limit = f"--bytes {cfg.train.max_bytes}; nothing changed (raise the limit to train on)"
            else:
                limit = ("the end of its schedule, fitted to its time budget; nothing changed (to train on, "
                         "start a new run from its weights with --set train.init=RUN)")
            click.echo(f"{plan.run_dir} is already done: step {done.step} ({done.bytes_seen:,} bytes) reached "
                       f"{limit}\ncheckpoint {done.checkpoint}")
        return
    if main_rank:
        click.echo(report.train_header(cfg, plan.run_dir, resume=plan.resume))
    try:
        result = train_lib.run_plan(plan)
    except TrainingError as e:
        raise click.ClickException(str(e)) from None
    val = (" val bits/byte " + " ".join(f"{b:.3f}" for b in result.val_bpb)) if result.val_bpb else ""
    if main_rank:
        click.echo(f"stopped by {result.stopped_by} at step {result.step} ({result.bytes_seen:,} bytes);"
                   f"{val}\ncheckpoint {result.checkpoint}")


@main.command("tune-heads")
@click.option("--ckpt", default=None, help="The run (its newest checkpoint) or checkpoint whose draft heads to tune.")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="The tuned run: a new run directory (or, with --resume, the tune to continue).")
@click.option("--steps", type=click.IntRange(1), help="Stop after this many optimizer steps (cosine schedule over them).")
@click.option("--bytes", "max_bytes", help="Stop after this many training bytes (e.g. 5M).")
@click.option("--time", "max_time", help="Stop after this much wall time (e.g. 3m).")
@click.option("--teacher-weight", type=click.FloatRange(0), default=None,
              help="Weight of the teacher term (loss.teacher_weight).  [default: 1]")
@click.option("--teacher-temperature", type=click.FloatRange(0, min_open=True), default=None,
              help="Temperature of head 1's distribution as the teacher (loss.teacher_temperature).  [default: 1]")
@click.option("--temperature", "old_temperature", type=click.FloatRange(0, min_open=True), default=None, hidden=True)
@click.option("--data-term", type=click.FloatRange(0), default=None,
              help="Weight of the draft heads' cross-entropy on the windows' bytes beside the teacher term "
                   "(loss.draft_data_weight).  [default: 1]")
@click.option("--rollout-bytes", type=click.IntRange(0), default=None,
              help="Bytes at the end of every window that the model writes itself, greedily, before the "
                   "heads learn from it (loss.rollout_bytes; 0: the corpus alone).  [default: half the context]")
@click.option("--drafter", type=click.Choice(["medusa", "hydra"]), default=None,
              help="Add cheap draft heads of this design and train them instead of heads 2..n (model.draft): "
                   "medusa, parallel residual blocks on head 1's state; hydra, blocks that also read the byte "
                   "drafted before. The decoder drafts with them.  [default: tune heads 2..n]")
@click.option("--draft", "old_draft", type=click.Choice(["medusa", "hydra"]), default=None, hidden=True)
@click.option("--divergence", type=click.Choice(["kl", "tv"]), default=None,
              help="The teacher term: KL from head 1's distribution, or total variation to it (one minus the "
                   "acceptance of speculative sampling) (loss.teacher_divergence).  [default: kl]")
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML or JSON file of settings applied on top of the source run's.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override one setting, e.g. --set train.lr=5e-4 (repeatable).")
@click.option("--resume", is_flag=True, help="Continue the tune in --out from its newest checkpoint.")
@click.option("--report-prompts", default=16, show_default=True, type=click.IntRange(0),
              help="Held-out prompts decoded before and after to measure bytes per pass (0: evaluate only).")
@click.option("--nproc", type=click.IntRange(1), default=None,
              help="Launch this many processes on this machine with torchrun (one per GPU).")
@device_option(None)
@json_option()
def tune_heads_cmd(ckpt: str | None, out: str, steps: int | None, max_bytes: str | None, max_time: str | None,
                   teacher_weight: float | None, teacher_temperature: float | None, old_temperature: float | None,
                   data_term: float | None, rollout_bytes: int | None, drafter: str | None, old_draft: str | None,
                   divergence: str | None, config_file: str | None, overrides: tuple[str, ...], resume: bool,
                   report_prompts: int, nproc: int | None, device: str | None, json_path: str | None) -> None:
    """Train heads 2..n of a run (or, with --drafter, cheap draft heads added to it) toward its
    next-byte head, which stays frozen with the trunk.

    Greedy self-speculative decoding keeps a drafted byte only when head 1 would have chosen it,
    after bytes head 1 chose too. So the draft heads learn from text the model writes itself: the
    second half of every training window is replaced by the model's greedy continuation of the
    first (--rollout-bytes), and each draft head learns those bytes (--data-term) and head 1's
    distribution where its byte is next (--teacher-weight). The embedding, trunk and head 1 do not
    change, so next-byte quality is the source's to the last digit. Reports the agreement with
    head 1 and the bytes per pass of greedy decoding (chain and tree of all heads) on held-out
    prompts before and after (no report where the corpus's val split is empty); the tuned run
    loads everywhere a run does and resumes like `train`.
    """
    if nproc is not None:
        _relaunch_with_torchrun(nproc)
    from bytemtp.training import runs
    from bytemtp.training import train as train_lib
    from bytemtp.training.faults import TrainingError

    teacher_temperature = renamed(old_temperature, teacher_temperature, "--temperature", "--teacher-temperature")
    drafter = renamed(old_draft, drafter, "--draft", "--drafter")
    flags = {"train.device": device, "train.steps": steps, "train.max_bytes": max_bytes and parse_size(max_bytes),
             "train.max_time": max_time and parse_duration(max_time), "loss.teacher_weight": teacher_weight,
             "loss.teacher_temperature": teacher_temperature, "loss.draft_data_weight": data_term,
             "loss.rollout_bytes": rollout_bytes, "model.draft": drafter, "loss.teacher_divergence": divergence}
    sets = list(overrides) + [f"{key}={value}" for key, value in flags.items() if value is not None]
    if resume:
        if ckpt:
            raise click.UsageError("--resume continues the tune in --out; leave --ckpt out (the tune knows its source)")
        plan = runs.plan_run(out, resume=True, config_file=config_file, overrides=sets)
    else:
        if not ckpt:
            raise click.UsageError("name the run to tune: --ckpt RUN (or --resume to continue the tune in --out)")
        plan = runs.plan_tune(ckpt, out, config_file=config_file, overrides=sets)
    cfg, main_rank = plan.cfg, os.environ.get("RANK", "0") == "0"
    if cfg.train.trainable != "draft-heads":
        raise click.ClickException(f"{out} is not a tune of draft heads (train.trainable={cfg.train.trainable}); "
                                   "resume it with bytemtp train")
    if plan.done is not None:
        if main_rank:
            echo(f"{plan.run_dir} is already done at step {plan.done.step}; raise --steps to tune on")
        return
    report_args = dict(cfg=cfg, prompts=report_prompts) if main_rank else None
    if report_args and _empty_val_split(cfg.data):
        echo(f"note: the val split of {cfg.data.path} is empty, so no report before and after the tune (it is "
             "measured on held-out text); prepare the corpus again with a larger `bytemtp prep --val-fraction` "
             "to have one")
        report_args = None
    before = _draft_report(cfg.train.init, **report_args) if report_args else None
    if main_rank:
        echo(report.train_header(cfg, plan.run_dir, resume=plan.resume))
    def say(text: str) -> None:  # the run's notes, above its progress bar, where the report goes
        from tqdm import tqdm
        tqdm.write(text, file=sys.stderr if json_path == "-" else sys.stdout)

    try:
        result = train_lib.run_plan(plan, say=say)
    except TrainingError as e:
        raise click.ClickException(str(e)) from None
    if not main_rank:
        return
    echo(f"stopped by {result.stopped_by} at step {result.step} ({result.bytes_seen:,} bytes)\n"
         f"checkpoint {result.checkpoint}")
    after = _draft_report(result.checkpoint, **report_args) if report_args else None
    if after is not None:
        echo(after.table(before))
    write_json(json_path, {"source": cfg.train.init, "tuned": str(result.checkpoint), "before": before,
                           "after": after})


def _empty_val_split(data) -> bool:
    """Whether the corpus is a prepared one whose val split holds no document (a tune trains on
    it, but has no held-out text to report on)."""
    from bytemtp.data.splits import has_splits, has_val_split

    return has_splits(data.path) and not has_val_split(data)


def _draft_report(ckpt: str, *, cfg, prompts: int):
    """`evaluate.draft_report` of a checkpoint on the run's corpus, with a progress bar; None
    when the checkpoint is gone (a resumed tune whose source was removed)."""
    from tqdm import tqdm

    from bytemtp.evaluation.evaluate import draft_report
    from bytemtp.runtime.checkpoint import load_model
    from bytemtp.runtime.devices import resolve_device

    if not os.path.exists(ckpt):
        return None
    device = resolve_device(cfg.train.device)
    model, _ = load_model(ckpt, device=device)
    with tqdm(desc=f"draft report {os.path.basename(ckpt)}", unit="batch", leave=False) as bar:
        return draft_report(model, cfg.data.path, batches=cfg.train.eval_batches, batch_size=cfg.data.batch_size,
                            prompts=prompts, device=device, progress=bar.update)


def _relaunch_with_torchrun(nproc: int) -> None:
    """Replace this process by torchrun running the same command, less --nproc, on nproc processes."""
    import sys

    if "RANK" in os.environ:
        raise click.UsageError("--nproc launches torchrun; inside torchrun leave it out")
    args, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            args.append(arg)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "bytemtp_cli", *args]
    os.execv(sys.executable, command)


@main.command("eval")
@click.option("--ckpt", required=True, help="A run directory (its newest checkpoint) or a checkpoint.")
@click.option("--data", "data_path", default=None,
              help="Corpus to evaluate on (prepared directory, folder, glob or file); default: the run's.")
@click.option("--split", type=click.Choice(["val", "train", "all"]), default=None,
              help="Split of a prepared corpus; all = every file.  [default: val, or all for a corpus "
                   "that is not prepared and so has no splits]")
@click.option("--batches", default=50, show_default=True, type=click.IntRange(1),
              help="Batches at most (per process); fewer when the split ends first.")
@click.option("--batch-size", default=8, show_default=True, type=click.IntRange(1))
@click.option("--decode-prompts", default=0, show_default=True, type=click.IntRange(0),
              help="Also decode this many held-out prompts (the starts of val documents) greedily with a chain "
                   "and a tree of all heads, and report the bytes per pass measured.")
@device_option()
@dtype_option()
@json_option()
def eval_cmd(ckpt: str, data_path: str | None, split: str | None, batches: int, batch_size: int,
             decode_prompts: int, device: str, dtype: str, json_path: str | None) -> None:
    """Bits per byte and accuracy of every head, and the acceptance profile of self-speculative decoding.

    Runs under torchrun too (each process evaluates its share; the sums are added).
    """
    from tqdm import tqdm

    from bytemtp.data.splits import has_splits
    from bytemtp.evaluation.evaluate import evaluate_checkpoint
    from bytemtp.runtime.checkpoint import load_config, resolve_checkpoint

    data = data_path or load_config(resolve_checkpoint(ckpt)).data.path
    if split is None:
        split = "val" if has_splits(data) else "all"
    elif split != "all" and not has_splits(data):
        raise click.ClickException(f"{data} is not a prepared corpus, so it has no splits (no {split} split); "
                                   "evaluate every file with --split all, or prepare it with bytemtp prep")
    with tqdm(total=batches, desc="eval", unit="batch", disable=os.environ.get("RANK", "0") != "0") as bar:
        try:
            res = evaluate_checkpoint(ckpt, data, split=None if split == "all" else split, batches=batches,
                                      batch_size=batch_size, device=device, dtype=dtype, progress=bar.update)
        except ValueError as e:  # an empty split: the splits to read instead, as this command's options
            other = "train" if split == "val" else "val"
            raise empty_split_error(e, f"read another split (--split {other} or --split all)") from None
    if res is not None:  # rank 0 reports
        out = {"ckpt": str(ckpt), "data": str(data), "split": split, **res.to_json()}
        echo(f"{res.bytes:,} bytes of {data} ({split})")
        echo(res.table())
        if decode_prompts:
            decoded = _decoded(ckpt, data, decode_prompts, device=device, dtype=dtype)
            out["decoded"] = decoded.to_json()
            echo(decoded.line())
        write_json(json_path, out)


def _decoded(ckpt: str, data: str, n: int, *, device: str, dtype: str | None):
    """Bytes per pass of greedy chain and tree drafts of all heads on n held-out prompts."""
    from bytemtp.data.splits import has_splits
    from bytemtp.evaluation.evaluate import held_out_decoding
    from bytemtp.runtime.checkpoint import load_model
    from bytemtp.runtime.devices import resolve_device

    if not has_splits(data):
        raise click.ClickException(f"{data} is not a prepared corpus: it has no val split to take held-out "
                                   "prompts from (--decode-prompts)")
    model, _ = load_model(ckpt, device=resolve_device(device), dtype=dtype)
    if model.config.n_future < 2:
        raise click.ClickException("--decode-prompts measures the draft heads; this model has only head 1")
    return held_out_decoding(model, data, prompts=n)


@main.command("plot")
@click.argument("run", type=click.Path(file_okay=False), required=False)
@click.option("--ckpt", default=None, help="The run (or one of its checkpoints), instead of the RUN argument.")
@click.option("--out", default=None, type=click.Path(file_okay=False), callback=check_output_dir,
              help="Folder for the PNGs; default RUN/plots.")
@click.option("--eval", "eval_json", type=click.Path(dir_okay=False, exists=True),
              help="Take the acceptance profile from `bytemtp eval --json` output instead of evaluating.")
@click.option("--eval-batches", default=20, show_default=True, type=click.IntRange(0),
              help="Val batches to evaluate for the acceptance profile (0: no profile).")
@device_option()
@dtype_option()
def plot_cmd(run: str | None, ckpt: str | None, out: str | None, eval_json: str | None, eval_batches: int,
             device: str, dtype: str) -> None:
    """PNG figures of a run: loss and validation bits per byte per head, and the acceptance profile."""
    from bytemtp.runtime.checkpoint import is_checkpoint_dir
    from bytemtp.training import plot

    model_from = run = one_target(run, ckpt, "run")
    if is_checkpoint_dir(run) and os.path.basename(os.path.dirname(os.path.abspath(run))) == "checkpoints":
        run = os.path.dirname(os.path.dirname(os.path.abspath(run)))  # a checkpoint: its run's metrics
    out_dir = out or os.path.join(run, "plots")
    plot.read_metrics(run)  # a run without metrics stops before an evaluation
    result = None
    if eval_json:
        from bytemtp.evaluation.evaluate import EvalResult

        result = EvalResult.from_json(json.loads(open(eval_json).read()))
    elif eval_batches:
        from bytemtp.data.shards import CorpusError
        from bytemtp.data.splits import held_out_split
        from bytemtp.evaluation.evaluate import evaluate
        from bytemtp.runtime.checkpoint import load_model
        from bytemtp.runtime.devices import resolve_device

        dev = resolve_device(device)
        model, cfg = load_model(model_from, device=dev, dtype=dtype)
        if model.config.n_future > 1:
            try:
                result = evaluate(model, cfg.data.path, split=held_out_split(cfg.data.path), batches=eval_batches,
                                  device=dev)
            except CorpusError as e:
                raise empty_split_error(e, "plot without the acceptance profile (--eval-batches 0), or take "
                                           "it from `bytemtp eval --split train --json F` (--eval F)") from None
    for path in plot.figures(run, out_dir, result):  # all figures or none
        click.echo(f"wrote {path}")


@main.command("task-corpus")
@click.argument("task", type=click.Choice(["poly", "induction"]))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="The prepared corpus to write.")
@click.option("--documents", type=click.IntRange(1),
              help="Problems (poly) or stories (induction) to write.  [default: 200,000 / 100,000]")
@click.option("--counts", help="poly: numbers of operations in training problems.  [default: 1-5]")
@click.option("--seed", default=0, show_default=True, type=int)
def task_corpus_cmd(task: str, out: str, documents: int | None, counts: str | None, seed: int) -> None:
    """Write a synthetic task's training documents as a prepared corpus: poly (paper section 4.2),
    induction (section 4.1)."""
    from bytemtp.evaluation import tasks

    if task == "induction" and counts is not None:
        raise click.UsageError("--counts is for poly; induction stories have no operations")
    ops = parse_counts(counts) if counts else None
    summary = tasks.write_corpus(task, out, documents=documents, seed=seed,
                                 operations=(ops.start, ops.stop - 1) if ops else None)
    click.echo(f"wrote {out}: " + ", ".join(f"{name} {s.get('documents', 0):,} documents"
                                            for name, s in summary.get("splits", {}).items())
               + f"; {summary.get('duplicates', 0):,} duplicate documents left out")


@main.command("inspect")
@click.argument("path", type=click.Path(), required=False)
@click.option("--ckpt", default=None, help="The run or checkpoint, instead of the PATH argument.")
@json_option()
def inspect_cmd(path: str | None, ckpt: str | None, json_path: str | None) -> None:
    """Show what a checkpoint (or a run's newest checkpoint) holds, without loading its weights."""
    from bytemtp.runtime.checkpoint import describe

    info = describe(one_target(path, ckpt, "checkpoint"))
    echo(report.checkpoint_report(info))
    write_json(json_path, {**info, "config": config_io.to_dict(info["config"])})


main.add_command(generate_cmd)
main.add_command(bench)
main.add_command(eval_task)
main.add_command(lm_eval_cmd)
main.add_command(serve_cmd)
main.add_command(export_cmd)
main.add_command(prep_cmd)
main.add_command(verify_cmd)
