"""`bytemtp bench ...`: speed, memory and quality, measured as ratios within one run."""

from __future__ import annotations

import contextlib
import os
import sys

import click

from bytemtp.decoding.strategy import DECODE_MODES
from bytemtp.experiments.quality import ARMS, DEFAULT_ARMS

from .options import (OneLineErrors, check_output_dir, compile_option, decoding_options, device_option, dtype_option,
                      empty_split_error, fresh_option, json_option, parse_batch_sizes, parse_duration, preset_option,
                      prompt_options, sampling_options)
from .report import echo, write_json


@click.group(cls=OneLineErrors)
def bench() -> None:
    """Measure speed and memory (ratios within one run)."""


@bench.command("train-step")
@preset_option("small")
@click.option("--batch-size", default=8, show_default=True, type=click.IntRange(1))
@click.option("--steps", default=6, show_default=True, type=click.IntRange(1),
              help="Timed rounds, the variants taking turns (after the warm-up): each variant's median "
                   "step counts, and the round-by-round time ratios give the spread (3 or more to judge it).")
@click.option("--warmup", default=2, show_default=True, type=click.IntRange(0),
              help="Untimed rounds first; they also decide how many steps a timed sample repeats.")
@click.option("--min-sample-s", default=0.2, show_default=True, type=click.FloatRange(0),
              help="A timed sample repeats a variant's step until it lasts this long.")
@click.option("--compile", "compile_mode", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
              help="Compiled steps as train.compile takes them (auto: compiled where torch.compile runs, as a run "
                   "long enough to pay for it is); off: the eager reference.")
@click.option("--peak-flops", type=click.FloatRange(0), default=0.0, show_default=True,
              help="The device's peak FLOP/s, for model FLOP utilisation (0: known GPUs' bf16 peak, else none).")
@device_option()
@json_option()
def bench_train_step(preset: str, batch_size: int, steps: int, warmup: int, min_sample_s: float, compile_mode: str,
                     peak_flops: float, device: str | None, json_path: str | None) -> None:
    """Next-byte vs memory-efficient vs plain multi-token training step, as `train` takes it.

    Says when the time ratio is too noisy to mean anything (time_ratio_noisy in the JSON)."""
    from tqdm import tqdm

    from bytemtp.experiments.step_bench import TRAIN_STEP_VARIANTS, train_step
    from bytemtp.runtime.devices import resolve_device

    with tqdm(total=warmup + steps + len(TRAIN_STEP_VARIANTS), desc="train-step", unit="round") as bar:
        def progress(stage: str) -> None:
            bar.set_postfix_str(stage)
            bar.update()

        res = train_step(preset, batch_size=batch_size, steps=steps, warmup=warmup, min_sample_s=min_sample_s,
                         device=str(resolve_device(device)), compile=compile_mode, peak=peak_flops, progress=progress)
    echo(res.table())
    write_json(json_path, res)


@bench.command("loader")
@click.option("--data", "path", default="data/corpus/stdlib", show_default=True,
              help="A prepared corpus (its largest train shard is read) or one .zst shard.")
@click.option("--seq-len", default=2048, show_default=True, type=click.IntRange(1))
@click.option("--batch-size", default=8, show_default=True, type=click.IntRange(1))
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1),
              help="Passes of each reader; the fastest counts.")
@click.option("--vs", "vs", default=None, metavar="PATH",
              help="Also time the loader's epochs of this corpus (any file, folder or glob: a Parquet file with "
                   "the same documents, say), interleaved, against the loader on the shard.")
@json_option()
def bench_loader(path: str, seq_len: int, batch_size: int, repeats: int, vs: str | None,
                 json_path: str | None) -> None:
    """Loader throughput on one shard beside `zstd -dc` of the same file (and the loader on --vs)."""
    from tqdm import tqdm

    from bytemtp.experiments.loader_bench import loader_throughput

    with tqdm(total=repeats, desc="loader", unit="pass") as bar:
        res = loader_throughput(path, seq_len=seq_len, batch_size=batch_size, repeats=repeats, vs=vs,
                                progress=bar.update)
    echo(res.table())
    write_json(json_path, res)


@bench.command("decode")
@click.option("--ckpt", required=True, help="A run directory (its newest checkpoint) or a checkpoint.")
@prompt_options()
@click.option("--max-bytes", default=256, show_default=True, type=click.IntRange(1),
              help="Output bytes a prompt (the window slides past the context).")
@click.option("--batch-sizes", default="1,8", show_default=True, help="Comma-separated.")
@decoding_options(default=",".join(DECODE_MODES), several=True, old=("modes",))
@click.option("--rounds", default=2, show_default=True, type=click.IntRange(1),
              help="Times every batch is decoded in every mode (interleaved).")
@sampling_options()
@click.option("--draft-confidence", "confidence", default=0.0, show_default=True, type=click.FloatRange(0, 1),
              help="End a greedy row's draft of the heads where the heads' own probability that their top chain is "
                   "right so far falls below this (0: off).")
@click.option("--eval-batches", default=50, show_default=True, type=click.IntRange(0),
              help="Head 1's held-out bits/byte, measured before decoding on this many batches of 8 windows of the "
                   "run's val split, as `bytemtp eval --batches` (the same bytes and figure); 0: not measured. Without "
                   "the run's corpus here (fine with --prompts FILE) a note says it is not measured.")
@compile_option()
@device_option()
@dtype_option()
@json_option()
def bench_decode(ckpt: str, prompts_path: str | None, n_prompts: int, prompt_bytes: int, max_bytes: int,
                 batch_sizes: str, draft: tuple, rounds: int, temperature: float, top_k: int, top_p: float, seed: int,
                 confidence: float, eval_batches: int, compile_mode: str, device: str, dtype: str,
                 json_path: str | None) -> None:
    """Plain vs self-speculative decoding (automatic, fixed chains, trees) on one model, greedy
    (outputs checked identical) or sampled (--temperature), beside head 1's held-out bits/byte.

    With --prompts FILE the run's corpus need not be on this machine: without it, the bits/byte
    is not measured (null in --json) and every decoding figure is."""
    from tqdm import tqdm

    from bytemtp.experiments.bench import decode_speed
    from bytemtp.runtime.devices import resolve_device

    sizes = parse_batch_sizes(batch_sizes)
    with tqdm(total=sum(-(-n_prompts // b) * rounds for b in sizes), desc="decode", unit="batch") as bar:
        try:
            res = decode_speed(ckpt, prompts_path=prompts_path, n_prompts=n_prompts, prompt_bytes=prompt_bytes,
                               max_bytes=max_bytes, batch_sizes=sizes, modes=draft, rounds=rounds,
                               device=str(resolve_device(device)), dtype=dtype, compile=compile_mode,
                               temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, confidence=confidence,
                               eval_batches=eval_batches, progress=bar.update)
        except RuntimeError as e:
            raise click.ClickException(str(e)) from None
        except ValueError as e:
            hint = "give prompts of your own (--prompts FILE)"
            if prompts_path is None and "does not exist" in str(e):
                e = ValueError(f"the run's corpus, where the default prompts come from, is not here: {e}, or {hint}")
            raise empty_split_error(e, hint) from None
    echo(res.table())
    write_json(json_path, res)
    if res.all_identical is False:
        raise click.ClickException("speculative output differs from plain greedy output")


@bench.command("serve")
@click.option("--ckpt", required=True, help="A run directory (its newest checkpoint) or a checkpoint.")
@click.option("--clients", default="1,8", show_default=True,
              help="Comma-separated counts of concurrent streaming clients; the first is the baseline of the ratio.")
@prompt_options()
@click.option("--max-bytes", default=256, show_default=True, type=click.IntRange(1), help="Bytes each completion writes.")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1), help="Interleaved rounds.")
@click.option("--load", "load_time", default="0s", show_default=True,
              help="Then stream from --load-clients clients for this long (e.g. 60s), checking every byte and the memory.")
@click.option("--load-clients", default=16, show_default=True, type=click.IntRange(1))
@click.option("--malformed", default=0.0, show_default=True, type=click.FloatRange(0, 1, max_open=True),
              help="In the --load, this share of the requests are malformed (bad JSON, NaN temperature, a huge seed, "
                   "unknown fields, wrong types, many stop strings, ...), each of which must get a 4xx: the answers "
                   "are counted by kind, and any 5xx fails the run.")
@decoding_options()
@click.option("--vs-plain/--no-vs-plain", default=True, show_default=True,
              help="Also run a second server on the same model that decodes plainly, on the same step: every "
                   "round runs each load against the draft's server, then the plain one (same prompts).")
@compile_option("off")
@device_option("cpu")
@dtype_option()
@json_option()
def bench_serve(ckpt: str, clients: str, prompts_path: str | None, n_prompts: int, prompt_bytes: int, max_bytes: int,
                rounds: int, load_time: str, load_clients: int, malformed: float, draft, vs_plain: bool,
                compile_mode: str, device: str, dtype: str, json_path: str | None) -> None:
    """Concurrent streaming clients against `bytemtp serve` on loopback: aggregate bytes/s against
    one client and against the same server decoding plainly, time to first byte, every byte checked
    against solo decoding; then a timed load."""
    from bytemtp.experiments.serve_bench import serve_speed

    counts = parse_batch_sizes(clients)
    load_s = parse_duration(load_time, option="--load")
    if malformed and not load_s:
        raise click.UsageError("--malformed mixes bad requests into the timed load: give --load too (e.g. --load 60s)")
    try:
        res = serve_speed(ckpt, clients=counts, prompts_path=prompts_path, n_prompts=n_prompts,
                          prompt_bytes=prompt_bytes, max_bytes=max_bytes, rounds=rounds, load_s=load_s,
                          load_clients=load_clients, malformed=malformed, draft=draft, vs_plain=vs_plain,
                          compile=compile_mode, device=device, dtype=dtype,
                          progress=lambda line: click.echo(line, err=True))
    except ValueError as e:
        raise empty_split_error(e, "the checkpoint's corpus needs a val split") from None
    echo(res.table())
    ld = res.load
    write_json(json_path, res)
    bad = sum(c.mismatches + c.errors + (c.plain_mismatches or 0) + (c.plain_errors or 0) for c in res.cases.values())
    bad += ld.mismatches + ld.errors if ld is not None else 0
    if bad:
        raise click.ClickException(f"{bad} completions differed from solo decoding or failed")
    if ld is not None and ld.server_errors:
        raise click.ClickException(f"the server answered {ld.server_errors} requests with a 5xx")
    hung = sum(n for answers in (ld.malformed_by_kind.values() if ld is not None else ())
               for a, n in answers.items() if not a[0].isdigit() or a.startswith(("2", "3")))
    if hung:
        raise click.ClickException(f"{hung} malformed requests were taken or got no answer (see the table)")


@bench.command("all")
@click.option("--ckpt", default="runs/demo", show_default=True,
              help="The run that decode and eval use (make demo trains it).")
@click.option("--data", default="data/corpus/stdlib", show_default=True, help="A prepared corpus for the loader.")
@preset_option("small")
@device_option("cpu")
@json_option("bench-all.json")
def bench_all(ckpt: str, data: str, preset: str, device: str, json_path: str) -> None:
    """Train step, loader, decode and eval in one run: one table, one JSON."""
    from bytemtp.experiments.bench import all_benchmarks
    from bytemtp.runtime.checkpoint import latest_checkpoint
    from bytemtp.runtime.devices import resolve_device

    if latest_checkpoint(ckpt) is None and not os.path.isfile(os.path.join(ckpt, "config.json")):
        raise click.ClickException(f"no checkpoint in {ckpt}: run `make demo` first, or give --ckpt RUN")
    res = all_benchmarks(ckpt=ckpt, data=data, preset_name=preset, device=str(resolve_device(device)),
                         progress=lambda name: click.echo(f"--- {name}", err=True))
    echo(res.table())
    write_json(json_path, res)


@contextlib.contextmanager
def _interrupted_in_one_line():
    """A sweep that a signal stopped ends with one line and exit status 130 (128 + SIGINT)."""
    from bytemtp.experiments.sweep import SweepInterrupted

    try:
        yield
    except SweepInterrupted as e:
        click.echo(f"Error: {e}", err=True)
        sys.exit(130)


@bench.command("quality")
@preset_option("small")
@click.option("--data", default="data/corpus/stdlib", show_default=True, help="A prepared corpus with a val split.")
@click.option("--time", "budget", default="3m", show_default=True,
              help="Training wall time of every arm and seed (the schedule is fitted to it).")
@click.option("--steps", default=0, show_default=True, type=click.IntRange(0),
              help="Train every arm this many steps instead (the same bytes; 0: equal wall time).")
@click.option("--seeds", default=2, show_default=True, type=click.IntRange(1),
              help="Seeds of each arm (train.seed and data.seed 0..N-1); the spread is over them.")
@click.option("--arms", default=",".join(DEFAULT_ARMS), show_default=True,
              help=f"Comma-separated arms, of: {', '.join(ARMS)} (ntp, the baseline, always runs).")
@click.option("--arm", "extra", multiple=True, metavar="NAME=SETTING[,SETTING...]",
              help="An arm of your own: settings (as --set) on top of the preset, e.g. "
                   "span3=loss.head_schedule=reverse,loss.head_schedule_span=0.3.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="A setting every arm shares.")
@click.option("--tune-time", default="30s", show_default=True,
              help="Then tune each multi-head arm's draft heads this long (as make demo does) and measure the "
                   "tuned greedy chain's bytes per pass (0s: no tune).")
@click.option("--eval-bytes", default=102_400, show_default=True, type=click.IntRange(1),
              help="Score head 1 on this many bytes of the val split, the same for every arm.")
@prompt_options(n_default=8, prompt_bytes=None, from_file=False)
@click.option("--out", required=True, type=click.Path(file_okay=False), callback=check_output_dir,
              help="Each arm and seed trains into OUT/ARM-sSEED; one measured before is read back.")
@fresh_option()
@device_option()
@json_option()
def bench_quality(preset: str, data: str, budget: str, steps: int, seeds: int, arms: str, extra: tuple[str, ...],
                  overrides: tuple[str, ...], tune_time: str, eval_bytes: int, n_prompts: int, out: str, fresh: bool,
                  device: str, json_path: str | None) -> None:
    """Head-1 val bits/byte of multi-token recipes against next-byte training at equal wall time
    (or equal steps), with the spread over seeds, and what their tuned draft heads give decoding."""
    from bytemtp.experiments import quality
    from bytemtp.runtime.devices import resolve_device

    from .options import parse_duration

    with _interrupted_in_one_line():
        res = quality.compare(preset, data=data, arms=[a.strip() for a in arms.split(",") if a.strip()],
                              extra=[quality.parse_arm(a) for a in extra],
                              sets=[*overrides, f"train.device={resolve_device(device)}"], seeds=seeds,
                              budget_s=parse_duration(budget), steps=steps, eval_bytes=eval_bytes,
                              tune_s=parse_duration(tune_time), prompts=n_prompts, out=out, fresh=fresh)
    echo(res.table())
    write_json(json_path, res)


@bench.command("tokens")
@preset_option("small")
@click.option("--data", default="data/corpus/stdlib", show_default=True,
              help="A prepared corpus with a val split: the tokenizer and both models train on its train split.")
@click.option("--time", "budget", default="9m", show_default=True,
              help="Training wall time of each arm and seed (the schedule is fitted to it).")
@click.option("--steps", default=0, show_default=True, type=click.IntRange(0),
              help="Train each arm this many steps instead (0: equal wall time).")
@click.option("--seeds", default=1, show_default=True, type=click.IntRange(1),
              help="Seeds of each arm (train.seed and data.seed 0..N-1); the ratios' spread is over them.")
@click.option("--vocab", "vocab_size", default=4096, show_default=True, type=click.IntRange(265),
              help="Ids of the byte-level BPE: the 264 byte ids and the rest merges.")
@click.option("--held-out", default=None,
              help="Text neither arm trained on, scored whole by both (a file, a folder of files, a glob such as "
                   "'src/*.py', or a prepared corpus's val split), e.g. the source of another project.")
@click.option("--held-out-bytes", default=0, show_default=True, type=click.IntRange(0),
              help="Score only the first this many bytes of --held-out (0: all).")
@click.option("--token-heads", default=1, show_default=True, type=click.IntRange(1),
              help="Heads of the token arm (1: next-token only).")
@click.option("--token-seq-len", default=0, show_default=True, type=click.IntRange(0),
              help="The token arm's context in tokens (0: the byte arm's context over the train split's bytes a token).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="A setting both arms share.")
@click.option("--token-set", "token_overrides", multiple=True, metavar="KEY=VALUE",
              help="A setting of the token arm only (e.g. model.d_model=128).")
@prompt_options()
@click.option("--max-bytes", default=256, show_default=True, type=click.IntRange(1), help="Bytes decoded from each.")
@click.option("--batch-sizes", default="1,8", show_default=True, help="Comma-separated.")
@decoding_options(default=None, several=True, default_text="auto,auto+lookup")
@click.option("--rounds", default=2, show_default=True, type=click.IntRange(1),
              help="Interleaved rounds of decoding (after a warm-up).")
@click.option("--check-rounds", default=5, show_default=True, type=click.IntRange(0),
              help="Rounds of the step check after training: a step of each arm timed turn about, to say how much "
                   "of an equal machine each arm's slot gave it (0: no check).")
@sampling_options()
@compile_option()
@click.option("--out", required=True, type=click.Path(file_okay=False), callback=check_output_dir,
              help="The tokenizer and each arm's run (OUT/bytes-sN, OUT/tokens-sN); one measured before is read back.")
@fresh_option()
@device_option()
@dtype_option()
@json_option()
def bench_tokens(preset: str, data: str, budget: str, steps: int, seeds: int, vocab_size: int, held_out: str | None,
                 held_out_bytes: int, token_heads: int, token_seq_len: int, overrides: tuple[str, ...],
                 token_overrides: tuple[str, ...], prompts_path: str | None, n_prompts: int, prompt_bytes: int,
                 max_bytes: int, batch_sizes: str, draft: tuple, rounds: int, check_rounds: int, temperature: float,
                 top_k: int, top_p: float, seed: int, compile_mode: str, out: str, fresh: bool, device: str,
                 dtype: str, json_path: str | None) -> None:
    """Bytes against tokens: train a byte-level BPE on the corpus, the same model family on its
    tokens and on bytes for the same budget, and compare bits per byte on the same bytes (val and
    held-out) and decoding speed in bytes a second at each batch size; a step check after training
    warns where the machine's load gave one arm more of its budget than the other."""
    from bytemtp.experiments import token_bench
    from bytemtp.runtime.devices import resolve_device

    from .options import parse_duration

    sizes = parse_batch_sizes(batch_sizes)
    dev = resolve_device(device)
    with _interrupted_in_one_line():
        res = token_bench.compare(data, out=out, preset=preset, budget_s=parse_duration(budget), steps=steps,
                                  seeds=seeds, vocab_size=vocab_size, held_out=held_out, held_out_bytes=held_out_bytes,
                                  sets=[*overrides, f"train.device={dev}"], token_sets=list(token_overrides),
                                  token_heads=token_heads, token_seq_len=token_seq_len, prompts_path=prompts_path,
                                  n_prompts=n_prompts, prompt_bytes=prompt_bytes, max_bytes=max_bytes,
                                  batch_sizes=sizes, rounds=rounds, drafts=draft or token_bench.DRAFTS,
                                  compile=compile_mode,
                                  temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, device=str(dev),
                                  dtype=dtype, check_rounds=check_rounds, fresh=fresh)
    echo(res.table())
    write_json(json_path, res)
    if res.all_identical is False:
        raise click.ClickException("speculative output differs from its arm's plain greedy output")


@bench.command("sweep")
@click.argument("grid", type=click.Path(dir_okay=False, exists=True))
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Each candidate's run goes to OUT/NAME; a candidate with OUT/NAME/sweep.json is read back.")
@click.option("--time", "budget", default="9m", show_default=True,
              help="Training wall time of every candidate (the schedule is fitted to it).")
@click.option("--tune-time", default="0s", show_default=True,
              help="Then tune each candidate's draft heads this long and measure decoding on them (0s: no tune).")
@click.option("--eval-bytes", default=102_400, show_default=True, type=click.IntRange(1),
              help="Score head 1 on this many bytes of the val split, the same for every candidate.")
@prompt_options(n_default=8, prompt_bytes=None, from_file=False)
@click.option("--only", default=None, help="Comma-separated candidates to run (default: all, in the grid's order).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="A setting every candidate shares, after the grid's (e.g. train.log_to=jsonl,tensorboard).")
@fresh_option()
@json_option()
def bench_sweep(grid: str, out: str, budget: str, tune_time: str, eval_bytes: int, n_prompts: int, only: str | None,
                overrides: tuple[str, ...], fresh: bool, json_path: str | None) -> None:
    """Train every candidate of a grid (a TOML file; see examples/sweep-small.toml) for the same wall
    time and compare head-1 val bits/byte, and with --tune-time what the tuned draft heads give."""
    from bytemtp.experiments import sweep

    from .options import parse_duration

    budget_s, tune_s = parse_duration(budget), parse_duration(tune_time)
    names = [n.strip() for n in only.split(",") if n.strip()] if only else None
    with _interrupted_in_one_line():
        results = sweep.run_sweep(sweep.read_grid(grid, shared=list(overrides)), out, budget_s=budget_s,
                                  eval_bytes=eval_bytes, tune_s=tune_s, prompts=n_prompts, only=names, fresh=fresh)
    res = sweep.SweepResult(results)
    echo(res.table())
    write_json(json_path, res)


@bench.command("prep")
@click.argument("sources", nargs=-1, required=True)
@click.option("--workers", "workers_text", default=None, metavar="1,N",
              help="Numbers of workers to time against each other, comma-separated  [default: 1 and the cores "
                   "there are].")
@click.option("--rounds", default=2, show_default=True, type=click.IntRange(1),
              help="Times each variant runs (interleaved).")
@click.option("--parts", default=4, show_default=True, type=click.IntRange(0),
              help="Then prepare the inputs as this many `--part I/N` jobs and merge them (0: skip).")
@click.option("--vs", "vs", multiple=True, metavar="PATH",
              help="Other inputs holding the same records (Parquet beside JSONL, say), timed with the most "
                   "workers in the same rounds (repeatable).")
@click.option("--field", default="text", show_default=True, help="The text field of JSONL or Parquet inputs.")
@click.option("--scratch", default=None, type=click.Path(file_okay=False),
              help="Where the outputs go while measured (removed after)  [default: a temporary folder].")
@json_option()
def bench_prep(sources: tuple[str, ...], workers_text: str | None, rounds: int, parts: int, vs: tuple[str, ...],
               field: str, scratch: str | None, json_path: str | None) -> None:
    """prep's MB/s with 1 and N workers (checked to write the same corpus), prep of other inputs
    with the same records, and N part jobs plus their merge (checked against one prep)."""
    import tempfile

    from tqdm import tqdm

    from bytemtp.experiments.prep_bench import prep_speed

    workers = parse_batch_sizes(workers_text, param_hint="--workers") if workers_text else (1, len(os.sched_getaffinity(0)))
    with tempfile.TemporaryDirectory(dir=scratch) as tmp, tqdm(desc="bench prep", unit="run") as bar:
        def progress(text: str) -> None:
            bar.set_postfix_str(text)
            bar.update()

        res = prep_speed(list(sources), scratch=tmp, workers=workers, rounds=rounds, parts=parts,
                         vs=list(vs) or None, field=field, progress=progress)
    echo(res.table())
    write_json(json_path, res)
