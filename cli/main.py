"""`bytemtp` commands. Each one parses its options, calls one library function and prints.

Errors a user can cause (a bad preset, an unknown --set key, an unreadable file) arrive here as
ValueError (CheckpointError is one) and leave as one line and exit status 1, never a traceback.
Heavy imports (torch) happen inside the commands, so `bytemtp --help` is instant.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os

import click

from bytemtp import __version__
from bytemtp import config as config_lib


class _Group(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ValueError as e:
            raise click.ClickException(str(e)) from None


def _preset_option(default: str):
    return click.option("--preset", default=default, show_default=True,
                        type=click.Choice(list(config_lib.PRESETS)), help="Starting configuration.")


def _check_device(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        config_lib.check_device(param.opts[0], value)  # the one check train.device has too
    return value


def _device_option(default: str | None = "auto"):
    return click.option("--device", default=default, show_default=default is not None, callback=_check_device,
                        help="auto (CUDA when available), cpu, cuda or cuda:N.")


def _dtype_option():
    return click.option("--dtype", default="float32", show_default=True,
                        type=click.Choice(["float32", "bfloat16", "float16"]),
                        help="Weights and activations of the loaded model (bfloat16 halves the memory on a GPU).")


def _one_target(argument: str | None, ckpt: str | None, what: str) -> str:
    """A command's RUN argument or its --ckpt, whichever was given (exactly one)."""
    if (argument is None) == (ckpt is None):
        raise click.UsageError(f"give the {what} once: as an argument or with --ckpt")
    return argument or ckpt


def _check_output_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An output file must be writable before the work starts ('-' is stdout)."""
    if value is None or value == "-":
        return value
    name, folder = param.opts[0], os.path.dirname(os.path.abspath(value))
    if os.path.isdir(value):
        raise ValueError(f"{name} {value} is a directory; name a file")
    if not os.path.isdir(folder):
        raise ValueError(f"{name} {value}: the folder {folder} does not exist; create it or name another file")
    if not os.access(folder, os.W_OK) or (os.path.exists(value) and not os.access(value, os.W_OK)):
        raise ValueError(f"{name} {value} cannot be written (permission denied); name another file")
    return value


def _check_output_dir(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An output folder (made if missing) must be makable before the work starts."""
    if value is None:
        return value
    name, path = param.opts[0], os.path.abspath(value)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{name} {value} is a file; name a folder")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK):
        raise ValueError(f"{name} {value} cannot be made: {existing} is not a writable folder")
    return value


def _json_option(default: str | None = None):
    return click.option("--json", "json_path", default=default, show_default=default is not None,
                        type=click.Path(allow_dash=True), callback=_check_output_file,
                        help="Also write the results here as JSON ('-': stdout, and the table goes to stderr).")


def _table(rows: list[tuple], header: tuple) -> str:
    cells = [tuple(str(c) for c in header)] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bytemtp")
def main() -> None:
    """Byte-level language models with multi-token prediction heads."""


@main.command("config")
@_preset_option("small")
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML or JSON file of settings applied on top of the preset.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override one setting, e.g. --set model.n_future=4 (repeatable).")
@click.option("--keys", is_flag=True,
              help="List every setting with its value (after --preset, --config and --set) and meaning.")
def config_cmd(preset: str, config_file: str | None, overrides: tuple[str, ...], keys: bool) -> None:
    """Show the resolved configuration and the model's parameter counts."""
    cfg = config_lib.resolve(preset, config_file=config_file, overrides=list(overrides))
    if keys:
        click.echo(_table(config_lib.settings(values=cfg), ("setting", f"value ({preset})", "meaning")))
        return
    import torch

    from bytemtp.model import ByteMTP

    with torch.device("meta"):
        model = ByteMTP(cfg.model)
    click.echo(config_lib.to_json(cfg))
    m = cfg.model
    rows = [(part, f"{model.num_params(part):,}") for part in ("embed", "trunk", "heads", "unembed")]
    rows.append(("total", f"{model.num_params():,}"))
    click.echo(f"\n{m.trunk_layers} trunk layers + {m.n_future} {m.head_type} heads "
               f"of {m.layers_per_head} layer(s) = {m.total_layers} layers\n")
    click.echo(_table(rows, ("part", "parameters")))


@main.command("prep")
@click.argument("sources", nargs=-1, required=True)
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="New corpus directory, e.g. data/corpus/NAME.")
@click.option("--field", default="text", show_default=True, help="JSON field holding the text.")
@click.option("--val-fraction", default=0.01, show_default=True, type=click.FloatRange(0, 1))
@click.option("--level", default=10, show_default=True, type=click.IntRange(1, 22),
              help="zstd compression level.")
@click.option("--include", multiple=True, metavar="GLOB",
              help="Only files whose path below a source directory matches (repeatable).")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Skip files that match (repeatable).")
@click.option("--name", "source_name", default=None, help="Source name for the manifest.")
@click.option("--licence", default="unknown", show_default=True, help="Licence for the manifest.")
@click.option("--max-bad-fraction", default=0.01, show_default=True, type=click.FloatRange(0, 1),
              help="Abort when more than this fraction of records is unusable.")
def prep_cmd(sources: tuple[str, ...], out: str, field: str, val_fraction: float, level: int,
             include: tuple[str, ...], exclude: tuple[str, ...], source_name: str | None,
             licence: str, max_bad_fraction: float) -> None:
    """Prepare a corpus: deduplicate, split train/val, write shards of the documents' exact bytes
    (any bytes: raw files are documents as they are) in 1 MiB zstd frames with an index."""
    from tqdm import tqdm

    from bytemtp import corpus

    files = corpus.select_files(corpus.corpus_files(list(sources), split=None), include=include,
                                exclude=exclude)
    total = sum(f.stat().st_size for f in files)
    with tqdm(total=total, desc="prep", unit="B", unit_scale=True) as bar:
        def progress(bytes_read: int, docs: int) -> None:
            bar.update(min(bytes_read, total) - bar.n)  # tqdm redraws at most every 0.1 s
            bar.set_postfix_str(f"{docs:,} docs", refresh=False)

        manifest = corpus.prepare(files, out, field=field, val_fraction=val_fraction, level=level,
                                  source_name=source_name or " ".join(sources), licence=licence,
                                  progress=progress, max_bad_fraction=max_bad_fraction)
    click.echo(f"wrote {out}")
    click.echo(_corpus_table(manifest))


def _corpus_table(manifest: dict) -> str:
    rows = []
    for name, split in manifest["splits"].items():
        ratio = split["bytes"] / split["compressed_bytes"] if split["compressed_bytes"] else 0.0
        rows.append((name, f"{split['documents']:,}", f"{split['bytes']:,}",
                     f"{split['compressed_bytes']:,}", f"{ratio:.2f}", len(split["shards"])))
    lines = [_table(rows, ("split", "documents", "bytes", "compressed", "ratio", "shards"))]
    skipped = {k: v for k, v in manifest.get("skipped", {}).items() if v}
    lines.append(f"duplicates removed: {manifest.get('duplicates', 0):,}; skipped: "
                 + (", ".join(f"{k} {v:,}" for k, v in sorted(skipped.items())) or "none"))
    return "\n".join(lines)


@main.command("corpus-info")
@click.argument("path")
@click.option("--field", default="text", show_default=True, help="JSON field holding the text.")
@_json_option()
def corpus_info_cmd(path: str, field: str, json_path: str | None) -> None:
    """Documents, bytes, compression ratio and splits of a corpus (prepared or not)."""
    from bytemtp import corpus

    info = corpus.describe(path, field=field)
    if "manifest" in info:
        m = info["manifest"]
        _echo(f"corpus   {path}\nsource   {m.get('source')}\nlicence  {m.get('licence')}\n"
              f"created  {m.get('created')}  by bytemtp {m.get('bytemtp_version')}\n"
              f"format   {m.get('format_version')}" + ("" if m.get("format_version") == corpus.FORMAT_VERSION
                                                      else " (JSONL shards: read, but `bytemtp prep` it again "
                                                           "for raw-byte shards and the faster loader)"))
        _echo(_corpus_table(m))
        if not json_path:
            _echo("manifest.json:\n" + json.dumps(m, indent=2))
    else:
        rows = [("files", f"{info['files']:,}"), ("documents", f"{info['documents']:,}"),
                ("bytes", f"{info['bytes']:,}"), ("on disk", f"{info['compressed_bytes']:,}"),
                ("ratio", f"{info['bytes'] / max(1, info['compressed_bytes']):.2f}")]
        rows += [(f"skipped {k}", f"{v:,}") for k, v in sorted(info.get("skipped", {}).items())]
        _echo(_table(rows, ("corpus " + path, "")))
    _write_json(json_path, {"corpus": path, **info})


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_duration(text: str) -> float:
    """Seconds in '90', '90s', '10m', '1h30m', '2h'."""
    import re

    parts = re.fullmatch(r"\s*(?:\d+(?:\.\d+)?[smhd]?\s*)+", text)
    if not parts:
        raise ValueError(f"--time {text!r} is not a duration; write e.g. 90s, 10m, 1h30m")
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)([smhd]?)", text):
        total += float(number) * _UNITS[unit or "s"]
    return total


def parse_size(text: str) -> int:
    """Bytes in '5000000', '50M', '2G' (decimal units)."""
    import re
    from decimal import Decimal

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)[bB]?\s*", text)
    if not match:
        raise ValueError(f"--bytes {text!r} is not a size; write e.g. 5000000, 50M, 2G")
    return int(Decimal(match[1]) * _SIZES[match[2].lower()])


@main.command("train")
@_preset_option("small")
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
@click.option("--parallel", type=click.Choice(["ddp", "fsdp"]), default=None,
              help="Under torchrun: DDP (default) or FSDP2 (train.parallel).")
@click.option("--nproc", type=click.IntRange(1), default=None,
              help="Launch this many processes on this machine with torchrun (one per GPU).")
@_device_option(None)
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
    sets = list(overrides)
    if parallel:
        sets.append(f"train.parallel={parallel}")
    if device:
        sets.append(f"train.device={device}")
    if data_path:
        sets.append(f"data.path={data_path}")
    if steps:
        sets.append(f"train.steps={steps}")
    if max_bytes:
        sets.append(f"train.max_bytes={parse_size(max_bytes)}")
    if max_time:
        sets.append(f"train.max_time={parse_duration(max_time)}")
    run_dir = resume or out
    if not run_dir:
        raise click.UsageError("give the run directory: --out DIR (or --resume DIR)")
    if resume is not None and out and resume and resume != out:
        raise click.UsageError(f"--resume {resume} and --out {out} name different runs")
    from bytemtp import train as train_lib

    if resume is not None:
        if click.get_current_context().get_parameter_source("preset") != click.core.ParameterSource.DEFAULT:
            raise click.UsageError("--preset is for a new run; a resumed run keeps its checkpoint's settings "
                                   "(change train.* with --set or --config)")
        run_dir, cfg = train_lib.resume_config(run_dir, config_file=config_file, overrides=sets)
    else:
        cfg = config_lib.resolve(preset, config_file=config_file, overrides=sets)
    if not (cfg.train.steps or cfg.train.max_bytes or cfg.train.max_time):
        raise click.ClickException("no stop condition: give --steps, --bytes or --time")
    from bytemtp.corpus import corpus_files

    corpus_files(cfg.data.path)  # a missing corpus fails here, before any work
    main_rank = os.environ.get("RANK", "0") == "0"
    if main_rank:
        click.echo(_train_header(cfg, run_dir, resume=resume is not None))
    try:
        result = train_lib.train(cfg, run_dir, resume=resume is not None)
    except train_lib.TrainingError as e:
        raise click.ClickException(str(e)) from None
    if result.stopped_by == "done":
        if main_rank:
            limit = (f"--steps {cfg.train.steps}" if cfg.train.steps and result.step >= cfg.train.steps
                     else f"--bytes {cfg.train.max_bytes}")
            click.echo(f"{run_dir} is already done: step {result.step} ({result.bytes_seen:,} bytes) reached "
                       f"{limit}; nothing changed (raise the limit to train on)\ncheckpoint {result.checkpoint}")
        return
    val = (" val bits/byte " + " ".join(f"{b:.3f}" for b in result.val_bpb)) if result.val_bpb else ""
    if main_rank:
        click.echo(f"stopped by {result.stopped_by} at step {result.step} ({result.bytes_seen:,} bytes);"
                   f"{val}\ncheckpoint {result.checkpoint}")


def _train_header(cfg: config_lib.Config, run_dir: str, *, resume: bool) -> str:
    """Device, parameters, corpus and run directory; the full config goes to RUN/run-config.json."""
    import torch

    from bytemtp.model import ByteMTP
    from bytemtp.train import RUN_CONFIG, absolute_corpus, resolve_device

    with torch.device("meta"):
        model = ByteMTP(cfg.model)
    m, world = cfg.model, int(os.environ.get("WORLD_SIZE", "1"))
    rows = [("run", f"{os.path.abspath(run_dir)} ({'resumed' if resume else 'new'}; all settings in {RUN_CONFIG})"),
            ("corpus", absolute_corpus(cfg).data.path),
            ("model", f"{model.num_params():,} parameters: {m.trunk_layers} trunk layers + {m.n_future} "
                      f"{m.head_type} heads, width {m.d_model}, context {m.seq_len}"),
            ("device", f"{resolve_device(cfg.train.device)}" + (f" x {world} processes" if world > 1 else "")),
            ("batch", f"{cfg.data.batch_size * m.seq_len * cfg.train.grad_accum * world:,} bytes a step")]
    return "\n".join(f"{name:8s} {value}" for name, value in rows)


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


@main.command("generate")
@click.option("--ckpt", required=True, help="A run directory (its newest checkpoint) or a checkpoint.")
@click.option("--prompt", default=None, help="Prompt text (UTF-8).")
@click.option("--prompt-file", type=click.Path(dir_okay=False, exists=True, allow_dash=True),
              help="Read the prompt's exact bytes from a file ('-': stdin).")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False, exists=True),
              help='Many prompts, one JSON object a line: {"prompt": "text"}, or {"prompt_b64": "..."} with '
                   "the prompt's exact bytes in base64 (for bytes that are not UTF-8); decoded in batches, "
                   "one JSON line out per prompt.")
@click.option("--batch-size", default=8, show_default=True, type=click.IntRange(1),
              help="Prompts decoded together with --prompts.")
@click.option("--max-bytes", type=click.IntRange(0), default=256, show_default=True,
              help="Bytes to generate at most (past the context, the window slides).")
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0),
              help="0 = greedy.")
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(0), help="0 = all bytes.")
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True))
@click.option("--seed", default=None, type=int,
              help="Seed of the sampler; without it a seed is drawn and printed to stderr when sampling. "
                   "The draws repeat exactly with a fixed draft (--heads or --no-speculative), since the "
                   "automatic one follows measured timings.")
@click.option("--stop", multiple=True, help="Stop after this string (repeatable).")
@click.option("--heads", type=click.IntRange(1), default=None,
              help="Force this many heads (a chain of heads - 1 drafts); default: chosen each pass from "
                   "measured pass costs and the heads' acceptance.")
@click.option("--draft", type=click.Choice(["auto", "chain", "tree"]), default="auto", show_default=True,
              help="Draft shape: auto (trees where they pay, greedy only), chain, or tree (with --heads).")
@click.option("--no-speculative", is_flag=True,
              help="Plain decoding, one byte per forward pass, with the next-byte head only.")
@click.option("--raw", is_flag=True,
              help="Write exactly the generated bytes: no newline after them and no U+FFFD for invalid "
                   "UTF-8 (the way to get exact bytes; with --prompts, adds output_base64).")
@click.option("--stats", "show_stats", is_flag=True,
              help="Print bytes per forward pass, speed, and the heads and drafts that were chosen.")
@click.option("--compare", is_flag=True,
              help="Greedy only: decode plainly and speculatively (interleaved, best of 3), check that the "
                   "outputs are identical, and print bytes per forward pass and the speedup.")
@_device_option()
@_dtype_option()
@click.option("--json", "json_path", type=click.Path(), callback=_check_output_file,
              help="Also write the statistics here as JSON (a file: stdout carries the output).")
def generate_cmd(ckpt: str, prompt: str | None, prompt_file: str | None, prompts_file: str | None,
                 batch_size: int, max_bytes: int, temperature: float, top_k: int, top_p: float,
                 seed: int | None, stop: tuple[str, ...], heads: int | None, draft: str, no_speculative: bool, raw: bool,
                 show_stats: bool, compare: bool, device: str, dtype: str, json_path: str | None) -> None:
    """Continue a prompt with a trained model, streaming the output.

    Decoding is self-speculative by default: the extra heads draft bytes (a chain or a tree of
    candidates) and the next-byte head verifies them, with as many heads as pay off on this
    device. Greedy output (temperature 0) is identical to plain greedy decoding; sampled output
    has exactly the distribution of plain sampling.
    """
    import sys

    import torch

    from bytemtp import decode
    from bytemtp.checkpoint import load_model
    from bytemtp.train import resolve_device
    from bytemtp.vocab import TextStream

    if sum(x is not None for x in (prompt, prompt_file, prompts_file)) != 1:
        raise click.UsageError("give exactly one of --prompt, --prompt-file and --prompts")
    if compare and (temperature > 0 or no_speculative or prompts_file is not None):
        raise click.UsageError("--compare is for greedy decoding of one prompt (temperature 0, speculative)")
    if draft == "tree" and temperature > 0:
        raise click.UsageError("--draft tree is for greedy decoding; sampling drafts chains")
    if json_path == "-":
        raise click.UsageError("--json - would mix the statistics into the output on stdout; name a file")
    if prompts_file is not None:
        prompts = decode.load_prompts(prompts_file)
    elif prompt is not None:
        prompts = [prompt.encode("utf-8", "surrogateescape")]
    else:
        prompts = [click.open_file(prompt_file, "rb").read()]
    dev = resolve_device(device)
    model, _ = load_model(ckpt, device=dev, dtype=dtype)
    if heads is not None and heads > model.config.n_future:
        n = model.config.n_future
        raise click.ClickException(f"--heads {heads}: {heads} is more than the model's {n} heads; choose "
                                   + (f"1 to {n} (1 decodes plainly)" if n > 1 else "1 (it has no draft heads)"))
    if seed is None and temperature > 0:
        import secrets

        seed = secrets.randbelow(2**31)
        click.echo(f"seed {seed} (sampling again with --seed {seed} and a fixed draft repeats this output)", err=True)
    generator = torch.Generator(device=dev).manual_seed(seed or 0)
    sampling = decode.Sampling(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    stops = tuple(s.encode() for s in stop)
    speculative = not no_speculative and model.config.n_future > 1
    decoder = decode.Decoder(model)
    kwargs = dict(max_bytes=max_bytes, sampling=sampling, stop=stops, heads=heads, draft=draft,
                  speculative=speculative)
    ctx = click.get_current_context()
    report = {"ckpt": str(ckpt), "seed": seed, "device": str(dev), "dtype": dtype}
    if prompts_file is not None:
        all_stats = []
        with _interruptible() as interrupted:
            for first in range(0, len(prompts), batch_size):
                batch = prompts[first:first + batch_size]
                results = decoder.generate(batch, cancel=interrupted.is_set, **kwargs)
                for i, result in enumerate(results):
                    line = {"index": first + i, "output": result.output.decode("utf-8", "replace")}
                    if raw:
                        line["output_base64"] = base64.b64encode(result.output).decode("ascii")
                    if show_stats:
                        line["stats"] = _stats_dict(result.stats)
                    all_stats.append(_stats_dict(result.stats))
                    click.echo(json.dumps(line, ensure_ascii=False))
                if interrupted.is_set():
                    break
        _write_stats(json_path, {**report, "prompts": all_stats})
        if interrupted.is_set():
            ctx.exit(130)
        return
    text = TextStream()
    out = sys.stdout.buffer if raw else sys.stdout

    def emit(_row: int, piece: bytes) -> None:
        out.write(piece if raw else text.feed(piece))
        out.flush()

    with _interruptible() as interrupted:
        if compare:
            decoder.generate(prompts, cancel=interrupted.is_set,
                             **{**kwargs, "max_bytes": min(max_bytes, 32)})  # warm-up: costs measured
        result = decoder.generate(prompts, on_bytes=emit, cancel=interrupted.is_set, **kwargs)[0]
    if not raw:  # --raw writes the generated bytes and nothing else
        out.write(text.finish() + "\n")
    out.flush()
    if compare and not interrupted.is_set():
        plains, specs = [], []
        for _ in range(3):  # interleaved, so that a busy moment hits both
            plains.append(decoder.generate(prompts, **{**kwargs, "speculative": False})[0])
            specs.append(decoder.generate(prompts, **kwargs)[0])
        plain = min(plains, key=lambda g: g.stats.wall_s)
        result = min(specs, key=lambda g: g.stats.wall_s)
        bps = lambda st: st.bytes_out / max(st.wall_s, 1e-9)  # noqa: E731
        ratios = sorted(p.stats.wall_s / s.stats.wall_s for p, s in zip(plains, specs))
        mode = f"{heads} heads, {draft}" if heads else f"automatic ({draft})"
        click.echo(f"plain greedy:                 {bps(plain.stats):8,.0f} bytes/s, 1.00 bytes/pass", err=True)
        click.echo(f"speculative, {mode:16s} {bps(result.stats):8,.0f} bytes/s, "
                   f"{result.stats.bytes_per_forward:.2f} bytes/pass", err=True)
        click.echo(f"speedup {bps(result.stats) / bps(plain.stats):.2f}x (runs: "
                   f"{', '.join(f'{r:.2f}' for r in ratios)}); outputs identical: "
                   f"{'yes' if plain.output == result.output else 'NO'}", err=True)
        if plain.output and len(set(plain.output)) == 1:
            click.echo(f"note: the output is one byte repeated ({plain.output[:1]!r}): a degenerate "
                       "continuation says little about speed; try another prompt", err=True)
        if plain.output != result.output:
            raise click.ClickException("speculative output differs from plain greedy output")
    if show_stats:
        st = result.stats
        click.echo(f"{st.bytes_out} bytes in {st.forward_passes} forward passes "
                   f"({st.bytes_per_forward:.2f} bytes/pass), {st.wall_s:.2f} s, "
                   f"{st.bytes_out / max(st.wall_s, 1e-9):,.0f} bytes/s; stopped by {st.stopped_by}",
                   err=True)
        if speculative and heads != 1:
            click.echo(_draft_summary(st, decoder), err=True)
        elif speculative:
            click.echo("no drafts: --heads 1 runs the next-byte head alone, one byte a pass", err=True)
    _write_stats(json_path, {**report, "stats": _stats_dict(result.stats)})
    if interrupted.is_set():
        ctx.exit(130)  # the shell's status for Ctrl-C; what was produced is out


def _write_stats(path: str | None, data: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
        click.echo(f"wrote {path}", err=True)  # stdout carries the output


@contextlib.contextmanager
def _interruptible():
    """A first Ctrl-C (SIGINT) sets the event that decoding reads before every pass, so what was
    produced is kept; a second one interrupts at once."""
    import signal
    import threading

    event = threading.Event()

    def handler(signum, frame):
        if event.is_set():
            raise KeyboardInterrupt
        event.set()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield event
    finally:
        signal.signal(signal.SIGINT, previous)


def _draft_summary(st, decoder) -> str:
    """What the decoder chose: heads per pass, the commonest draft shapes, acceptance per depth."""
    total = max(1, sum(st.heads_used.values()))
    heads = ", ".join(f"{k} ({100 * n / total:.0f}%)" for k, n in
                      sorted(st.heads_used.items(), key=lambda kv: -kv[1]))
    shapes = ", ".join(f"{s} ({100 * n / total:.0f}%)" for s, n in
                       sorted(st.shapes.items(), key=lambda kv: -kv[1])[:3])
    rates = " ".join(f"d{j + 1} {r:.2f}" for j, r in enumerate(st.acceptance) if st.drafted[j])
    lines = [f"heads run: {heads}; drafts: {shapes}", f"draft acceptance by depth: {rates or 'none drafted'}"]
    choice = decoder.last_choice
    if choice is not None and choice.speedup:
        lines.append(f"last plan: {choice.heads} heads, {choice.tree.describe()}, expected "
                     f"{choice.bytes_per_pass:.2f} bytes/pass and {choice.speedup:.2f}x plain")
    if st.slides:
        lines.append(f"the window slid {st.slides} times")
    return "\n".join(lines)


def _stats_dict(st) -> dict:
    out = {"bytes": st.bytes_out, "forward_passes": st.forward_passes,
           "bytes_per_forward": round(st.bytes_per_forward, 3), "wall_s": round(st.wall_s, 4),
           "stopped_by": st.stopped_by}
    if getattr(st, "drafted", None):
        out["acceptance"] = [round(r, 4) for r in st.acceptance]
        out["heads_used"] = {str(k): n for k, n in sorted(st.heads_used.items())}
    return out


@main.command("eval")
@click.option("--ckpt", required=True, help="A run directory (its newest checkpoint) or a checkpoint.")
@click.option("--data", "data_path", default=None,
              help="Corpus to evaluate on (prepared directory, folder, glob or file); default: the run's.")
@click.option("--split", type=click.Choice(["val", "train", "all"]), default="val", show_default=True,
              help="Split of a prepared corpus; all = every file.")
@click.option("--batches", default=50, show_default=True, type=click.IntRange(1),
              help="Batches at most (per process); fewer when the split ends first.")
@click.option("--batch-size", default=8, show_default=True, type=click.IntRange(1))
@_device_option()
@_dtype_option()
@_json_option()
def eval_cmd(ckpt: str, data_path: str | None, split: str, batches: int, batch_size: int, device: str,
             dtype: str, json_path: str | None) -> None:
    """Bits per byte and accuracy of every head, and the acceptance profile of self-speculative decoding.

    Runs under torchrun too (each process evaluates its share; the sums are added).
    """
    from tqdm import tqdm

    from bytemtp import distributed as dist_lib
    from bytemtp.checkpoint import load_model
    from bytemtp.evaluate import evaluate
    from bytemtp.train import resolve_device

    d = dist_lib.setup(resolve_device(device))
    try:
        model, cfg = load_model(ckpt, device=d.device, dtype=dtype)
        data = data_path or cfg.data.path
        with tqdm(total=batches, desc="eval", unit="batch", disable=not d.is_main) as bar:
            res = evaluate(model, data, split=None if split == "all" else split, batches=batches,
                           batch_size=batch_size, device=d.device, d=d, progress=bar.update)
    except BaseException:
        dist_lib.teardown(wait=False)
        raise
    dist_lib.teardown()
    if not d.is_main:
        return
    res = {"ckpt": str(ckpt), "data": str(data), "split": split, **res}
    _echo(f"{res['bytes']:,} bytes of {data} ({split})")
    rows = [(f"h{k + 1}", f"{b:.3f}", f"{a:.3f}", f"{res['acceptance'].get(k + 1, 1.0):.3f}" if k else "-",
             f"{res['bytes_per_forward'].get(k + 1, 1.0):.2f}" if k else "1.00")
            for k, (b, a) in enumerate(zip(res["bpb"], res["accuracy"]))]
    _echo(_table(rows, ("head", "bits/byte", "accuracy", "heads 2..k right", "bytes/pass with k")))
    _write_json(json_path, res)


@main.command("plot")
@click.argument("run", type=click.Path(file_okay=False), required=False)
@click.option("--ckpt", default=None, help="The run (or one of its checkpoints), instead of the RUN argument.")
@click.option("--out", default=None, type=click.Path(file_okay=False), callback=_check_output_dir,
              help="Folder for the PNGs; default RUN/plots.")
@click.option("--eval", "eval_json", type=click.Path(dir_okay=False, exists=True),
              help="Take the acceptance profile from `bytemtp eval --json` output instead of evaluating.")
@click.option("--eval-batches", default=20, show_default=True, type=click.IntRange(0),
              help="Val batches to evaluate for the acceptance profile (0: no profile).")
@_device_option()
@_dtype_option()
def plot_cmd(run: str | None, ckpt: str | None, out: str | None, eval_json: str | None, eval_batches: int,
             device: str, dtype: str) -> None:
    """PNG figures of a run: loss and validation bits per byte per head, and the acceptance profile."""
    from bytemtp import plot
    from bytemtp.checkpoint import is_checkpoint_dir

    model_from = run = _one_target(run, ckpt, "run")
    if is_checkpoint_dir(run) and os.path.basename(os.path.dirname(os.path.abspath(run))) == "checkpoints":
        run = os.path.dirname(os.path.dirname(os.path.abspath(run)))  # a checkpoint: its run's metrics
    out_dir = out or os.path.join(run, "plots")
    plot.read_metrics(run)  # a run without metrics stops before an evaluation
    if eval_json:
        result = json.loads(open(eval_json).read())
    elif eval_batches:
        from bytemtp.checkpoint import load_model
        from bytemtp.evaluate import evaluate
        from bytemtp.train import resolve_device

        dev = resolve_device(device)
        model, cfg = load_model(model_from, device=dev, dtype=dtype)
        result = evaluate(model, cfg.data.path, batches=eval_batches, device=dev) if model.config.n_future > 1 else None
    else:
        result = None
    for path in plot.figures(run, out_dir, result):  # all figures or none
        click.echo(f"wrote {path}")


def _parse_counts(text: str) -> range:
    try:
        low, _, high = text.partition("-")
        counts = range(int(low), int(high or low) + 1)
        assert len(counts) > 0 and counts.start >= 1
        return counts
    except (ValueError, AssertionError):
        raise click.BadParameter(f"{text!r} is not a count or a range such as 1-10", param_hint="--counts") from None


TASK_DOCUMENTS = {"poly": 200_000, "induction": 100_000}


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
    import tempfile

    from bytemtp import tasks
    from bytemtp.corpus import prepare

    documents = documents or TASK_DOCUMENTS[task]
    if task == "poly":
        counts = counts or "1-5"
        ops = _parse_counts(counts)
        texts = (p.text for p in tasks.problems(documents, operations=(ops.start, ops.stop - 1), seed=seed))
        source = f"polynomial arithmetic over F7[X]/(X^5), {counts} operations, seed {seed}"
    else:
        if counts is not None:
            raise click.UsageError("--counts is for poly; induction stories have no operations")
        texts = iter(tasks.stories(documents, seed=seed))
        source = f"induction stories with made-up two-part names, seed {seed}"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{task}.jsonl")
        with open(path, "w") as f:
            for text in texts:
                f.write(json.dumps({"text": text}) + "\n")
        summary = prepare([path], out, val_fraction=0.01, licence="generated (CC0)", source_name=source)
    splits = summary.get("splits", {})
    click.echo(f"wrote {out}: " + ", ".join(f"{name} {s.get('documents', 0):,} documents"
                                            for name, s in splits.items())
               + f"; {summary.get('duplicates', 0):,} duplicate documents left out")


@main.command("eval-task")
@click.argument("task", type=click.Choice(["poly", "induction"]))
@click.option("--ckpt", required=True, help="A run directory (its newest checkpoint) or a checkpoint.")
@click.option("--per-count", type=click.IntRange(1),
              help="poly: test problems for each number of operations.  [default: 2000]")
@click.option("--counts", help="poly: numbers of operations (1-5 in domain).  [default: 1-10]")
@click.option("--stories", type=click.IntRange(1),
              help="induction: test stories (each has several later mentions).  [default: 200]")
@click.option("--batch-size", default=64, show_default=True, type=click.IntRange(1))
@_device_option()
@_dtype_option()
@_json_option()
def eval_task_cmd(task: str, ckpt: str, per_count: int | None, counts: str | None, stories: int | None,
                  batch_size: int, device: str, dtype: str, json_path: str | None) -> None:
    """Greedy exact-match accuracy on a synthetic task's fixed test set: poly per number of
    operations, induction (the second part of a name at its later mentions) per mention. Beside
    it, teacher-forced scores of the answers (top-1 accuracy and bits per byte of the next-byte
    head on the answer's bytes given the true prefix): a finer signal for weak models."""
    from tqdm import tqdm

    from bytemtp import tasks
    from bytemtp.checkpoint import load_model
    from bytemtp.evaluate import task_accuracy, task_answer_scores, task_context
    from bytemtp.train import resolve_device

    if task == "poly":
        if stories is not None:
            raise click.UsageError("--stories is for induction; poly takes --per-count and --counts")
        per_count = per_count or 2000
        test, until_eos = tasks.test_set(per_count, _parse_counts(counts or "1-10")), True
        header, settings = "operations", {"per_count": per_count}
    else:
        if per_count is not None or counts is not None:
            raise click.UsageError("--per-count and --counts are for poly; induction takes --stories")
        stories = stories or 200
        test, until_eos = tasks.induction_test_set(stories), False
        header, settings = "mention", {"stories": stories}
    model, _ = load_model(ckpt, device=resolve_device(device), dtype=dtype)
    longest = task_context(test, until_eos=until_eos)
    if longest > model.config.seq_len:
        click.echo(f"note: the {task} test set needs up to {longest} bytes of context and this model has "
                   f"{model.config.seq_len}; decoding slides its window and scoring keeps the newest "
                   f"{model.config.seq_len} bytes", err=True)
    sizes = {group: len(ps) for group, ps in test.items()}
    with tqdm(total=sum(sizes.values()), desc=task, unit="problem") as bar:
        accuracy = task_accuracy(model, test, batch_size=batch_size, until_eos=until_eos,
                                 progress=bar.update)
    scores = task_answer_scores(model, test, until_eos=until_eos, batch_size=batch_size)
    overall = sum(accuracy[g] * n for g, n in sizes.items() if n) / sum(sizes.values())
    rows = [(g, n, f"{accuracy[g]:.3f}", f"{scores[g]['byte_accuracy']:.3f}", f"{scores[g]['bpb']:.3f}")
            for g, n in sizes.items()] + [("all", sum(sizes.values()), f"{overall:.3f}", "", "")]
    _echo(_table(rows, (header, "problems", "exact match", "answer byte acc", "answer bits/byte")))
    _write_json(json_path, {"task": task, "ckpt": str(ckpt), **settings, "problems": sizes,
                            "accuracy": accuracy, "overall": overall, "answer_scores": scores})


@main.command("inspect")
@click.argument("path", type=click.Path(), required=False)
@click.option("--ckpt", default=None, help="The run or checkpoint, instead of the PATH argument.")
@_json_option()
def inspect_cmd(path: str | None, ckpt: str | None, json_path: str | None) -> None:
    """Show what a checkpoint (or a run's newest checkpoint) holds, without loading its weights."""
    from bytemtp.checkpoint import describe

    info = describe(_one_target(path, ckpt, "checkpoint"))
    m = info["config"].model
    _echo(f"checkpoint  {info['checkpoint']}")
    _echo(f"step        {info['step']}")
    _echo(f"model       {info['params']:,} parameters: {m.trunk_layers} trunk layers + "
          f"{m.n_future} {m.head_type} heads, width {m.d_model}, context {m.seq_len}, "
          f"{m.unembed} unembedding")
    _echo(f"resumable   {'yes' if info['resumable'] else 'no (no optimizer.pt: inference only)'}")
    _echo(_table([(name, f"{size:,}") for name, size in info["files"].items()], ("file", "bytes")))
    extra = {k: v for k, v in info["train_state"].items() if k != "step" and not isinstance(v, (dict, list))}
    if extra:
        _echo(_table(sorted(extra.items()), ("train state", "value")))
    _write_json(json_path, {**info, "config": config_lib.to_dict(info["config"])})


@main.group(cls=_Group)
def bench() -> None:
    """Measure speed and memory (ratios within one run)."""


@bench.command("train-step")
@_preset_option("small")
@click.option("--batch-size", default=8, show_default=True, type=click.IntRange(1))
@click.option("--steps", default=6, show_default=True, type=click.IntRange(1),
              help="Timed steps per variant (after the warm-up); the median counts.")
@click.option("--warmup", default=2, show_default=True, type=click.IntRange(0))
@_device_option()
@_json_option()
def bench_train_step(preset: str, batch_size: int, steps: int, warmup: int, device: str | None,
                     json_path: str | None) -> None:
    """Next-byte vs memory-efficient vs plain multi-token training step."""
    from tqdm import tqdm

    from bytemtp.bench import TRAIN_STEP_VARIANTS, train_step
    from bytemtp.train import resolve_device

    with tqdm(total=warmup + steps + len(TRAIN_STEP_VARIANTS), desc="train-step", unit="round") as bar:
        def progress(stage: str) -> None:
            bar.set_postfix_str(stage)
            bar.update()

        res = train_step(preset, batch_size=batch_size, steps=steps, warmup=warmup, device=str(resolve_device(device)),
                         progress=progress)
    rows = []
    for name, label in (("ntp", "next-byte (n=1)"), ("mtp", "multi-token n=8, memory-efficient"),
                        ("mtp_plain", "multi-token n=8, plain")):
        row = [label, f"{res[f'{name}_step_s']:.3f}", f"{res[f'{name}_bytes_s']:,.0f}",
               f"{res[f'{name}_peak_mb']:,.0f}"]
        if f"{name}_mfu" in res:
            row.append(f"{100 * res[f'{name}_mfu']:.1f}%")
        rows.append(tuple(row))
    header = ("variant", "step s", "bytes/s", "peak MiB") + (("MFU",) if len(rows[0]) > 4 else ())
    _echo(f"preset {preset}, batch {batch_size} x {res['seq_len']} bytes, {res['device']}")
    _echo(_table(rows, header))
    _echo(f"time_ratio {res['time_ratio']:.3f}  memory_ratio {res['memory_ratio']:.3f}  "
               f"plain_memory_ratio {res['plain_memory_ratio']:.3f}")
    _write_json(json_path, res)


@bench.command("loader")
@click.option("--data", "path", default="data/corpus/stdlib", show_default=True,
              help="A prepared corpus (its largest train shard is read) or one .zst shard.")
@click.option("--seq-len", default=2048, show_default=True, type=click.IntRange(1))
@click.option("--batch-size", default=8, show_default=True, type=click.IntRange(1))
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1),
              help="Passes of each reader; the fastest counts.")
@_json_option()
def bench_loader(path: str, seq_len: int, batch_size: int, repeats: int, json_path: str | None) -> None:
    """Loader throughput on one shard beside `zstd -dc` of the same file."""
    from tqdm import tqdm

    from bytemtp.bench import loader_throughput

    with tqdm(total=repeats, desc="loader", unit="pass") as bar:
        res = loader_throughput(path, seq_len=seq_len, batch_size=batch_size, repeats=repeats,
                                progress=bar.update)
    _echo(f"shard {res['shard']}: {res['decompressed_bytes']:,} bytes decompressed, "
               f"{res['batches']:,} batches of {batch_size} x {seq_len}")
    _echo(_table([("bytemtp loader (one process)", f"{res['loader_mb_s']:.1f}"),
                       ("zstd -dc > /dev/null", f"{res['zstd_mb_s']:.1f}")], ("reader", "MB/s")))
    spread = res["pair_ratios"]
    _echo(f"ratio {res['ratio']:.3f} (best against best; run by run {spread[0]:.2f} to {spread[-1]:.2f})")
    _write_json(json_path, res)


@bench.command("decode")
@click.option("--ckpt", required=True, help="A run directory (its newest checkpoint) or a checkpoint.")
@click.option("--prompts", "prompts_path", type=click.Path(dir_okay=False, exists=True),
              help='Prompts, one {"prompt": "..."} a line; default: the starts of val documents of the '
                   "run's corpus (text the model did not train on).")
@click.option("--n-prompts", default=16, show_default=True, type=click.IntRange(1))
@click.option("--prompt-bytes", default=128, show_default=True, type=click.IntRange(1),
              help="Length of the val prompts.")
@click.option("--max-bytes", default=256, show_default=True, type=click.IntRange(1),
              help="Output bytes a prompt (the window slides past the context).")
@click.option("--batch-sizes", default="1,8", show_default=True, help="Comma-separated.")
@click.option("--modes", default="auto,chain-2,chain-4,chain-all,tree-4,tree-all", show_default=True,
              help="Drafting modes against plain greedy: auto, chain-K, tree-K (K heads or 'all').")
@click.option("--rounds", default=2, show_default=True, type=click.IntRange(1),
              help="Times every batch is decoded in every mode (interleaved).")
@_device_option()
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "bfloat16"]))
@_json_option()
def bench_decode(ckpt: str, prompts_path: str | None, n_prompts: int, prompt_bytes: int, max_bytes: int,
                 batch_sizes: str, modes: str, rounds: int, device: str, dtype: str, json_path: str | None) -> None:
    """Plain greedy vs self-speculative greedy (automatic, fixed chains, trees) on one model."""
    from tqdm import tqdm

    from bytemtp.bench import decode_speed
    from bytemtp.train import resolve_device

    try:
        sizes = tuple(int(b) for b in batch_sizes.split(","))
        assert sizes and min(sizes) >= 1
    except (ValueError, AssertionError):
        raise click.BadParameter(f"{batch_sizes!r} is not a comma-separated list of batch sizes",
                                 param_hint="--batch-sizes") from None
    mode_list = tuple(m.strip() for m in modes.split(",") if m.strip())
    for m in mode_list:
        shape, _, k = m.partition("-")
        if not (m == "auto" or (shape in ("chain", "tree") and (k == "all" or k.isdigit() and int(k) >= 1))):
            raise click.BadParameter(f"{m!r} is not a mode; use auto, chain-K or tree-K (K a number or all)",
                                     param_hint="--modes")
    runs = sum(-(-n_prompts // b) * rounds for b in sizes)
    with tqdm(total=runs, desc="decode", unit="batch") as bar:
        try:
            res = decode_speed(ckpt, prompts_path=prompts_path, n_prompts=n_prompts, prompt_bytes=prompt_bytes,
                               max_bytes=max_bytes, batch_sizes=sizes, modes=mode_list, rounds=rounds,
                               device=str(resolve_device(device)), dtype=dtype, progress=bar.update)
        except RuntimeError as e:
            raise click.ClickException(str(e)) from None
        bar.close()
    bpb = f"; model val bits/byte {res['val_bpb']:.3f}" if res["val_bpb"] is not None else ""
    _echo(f"{res['prompts']} held-out prompts of up to {res['prompt_bytes']} bytes, {res['max_bytes']} output "
               f"bytes each, {res['rounds']} interleaved rounds, {res['device']} {res['dtype']}{bpb}")
    rows = [(c["batch_size"], c["mode"], f"{c['plain_bytes_s']:,.0f}", f"{c['spec_bytes_s']:,.0f}",
             f"{c['speedup']:.2f} ({c['speedup_min']:.2f}-{c['speedup_max']:.2f})",
             f"{c['bytes_per_forward']:.2f}", f"{c['pass_cost']:.2f}", "yes" if c["identical"] else "NO",
             ", ".join(f"{k}:{n}" for k, n in sorted(c["heads_used"].items())))
            for c in res["cases"]]
    _echo(_table(rows, ("batch", "mode", "plain B/s", "spec B/s", "speedup (spread)", "bytes/pass",
                             "pass cost", "identical", "heads:passes")))
    _write_json(json_path, res)
    if not res["all_identical"]:
        raise click.ClickException("speculative output differs from plain greedy output")


@bench.command("all")
@click.option("--ckpt", default="runs/demo", show_default=True,
              help="The run that decode and eval use (make demo trains it).")
@click.option("--data", default="data/corpus/stdlib", show_default=True, help="A prepared corpus for the loader.")
@_preset_option("small")
@_device_option("cpu")
@_json_option("bench-all.json")
def bench_all(ckpt: str, data: str, preset: str, device: str, json_path: str) -> None:
    """Train step, loader, decode and eval in one run: one table, one JSON."""
    from bytemtp.bench import all_benchmarks
    from bytemtp.checkpoint import latest_checkpoint
    from bytemtp.train import resolve_device

    if latest_checkpoint(ckpt) is None and not os.path.isfile(os.path.join(ckpt, "config.json")):
        raise click.ClickException(f"no checkpoint in {ckpt}: run `make demo` first, or give --ckpt RUN")
    res = all_benchmarks(ckpt=ckpt, data=data, preset_name=preset, device=str(resolve_device(device)),
                         progress=lambda name: click.echo(f"--- {name}", err=True))
    rows = [(key, f"{value:.3f}" if isinstance(value, float) else str(value))
            for key, value in res["summary"].items()]
    _echo(_table(rows, ("figure", "value")))
    _write_json(json_path, res)


def _echo(text: str) -> None:
    """A command's report: on stdout, or on stderr when stdout carries its JSON (--json -)."""
    ctx = click.get_current_context(silent=True)
    click.echo(text, err=ctx is not None and ctx.params.get("json_path") == "-")


def _write_json(path: str | None, data: dict) -> None:
    if path == "-":
        click.echo(json.dumps(data, indent=2, default=str))
    elif path:
        with open(path, "w") as f:
            json.dump(data, f, indent=2, default=str)
        _echo(f"wrote {path}")


@bench.command("quality")
@_preset_option("small")
@click.option("--data", default="data/corpus/stdlib", show_default=True, help="A prepared corpus with a val split.")
@click.option("--steps", default=300, show_default=True, type=click.IntRange(1),
              help="Training steps of each model (the same bytes for both).")
@click.option("--eval-batches", default=100, show_default=True, type=click.IntRange(1))
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help="Keep the two runs here (default: a temporary directory).")
@_json_option()
def bench_quality(preset: str, data: str, steps: int, eval_batches: int, out: str | None,
                  json_path: str | None) -> None:
    """Validation bits per byte: 8-head model vs the next-byte baseline, same bytes."""
    from bytemtp.bench import quality

    res = quality(preset, data=data, steps=steps, eval_batches=eval_batches, out_dir=out)
    _echo(f"preset {preset}, {steps} steps, {res['bytes']:,} training bytes each, {data}")
    rows = [("next-byte baseline (n=1)", f"{res['ntp_bpb']:.4f}"),
            ("multi-token n=8, head 1", f"{res['mtp_bpb']:.4f}")]
    rows += [(f"multi-token n=8, head {k + 1}", f"{b:.4f}") for k, b in enumerate(res["mtp_head_bpb"]) if k]
    _echo(_table(rows, ("model", "val bits/byte")))
    _echo(f"gap (n=8 head 1 - baseline): {res['bpb_gap']:+.4f} bits/byte")
    _write_json(json_path, res)
