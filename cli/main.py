"""`bytemtp` commands. Each one parses its options, calls one library function and prints.

Errors a user can cause (a bad preset, an unknown --set key, an unreadable file) arrive here as
ValueError (CheckpointError is one) and leave as one line and exit status 1, never a traceback.
Heavy imports (torch) happen inside the commands, so `bytemtp --help` is instant.
"""

from __future__ import annotations

import json

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
@click.option("--keys", is_flag=True, help="List every setting with its default and meaning.")
def config_cmd(preset: str, config_file: str | None, overrides: tuple[str, ...], keys: bool) -> None:
    """Show the resolved configuration and the model's parameter counts."""
    if keys:
        click.echo(_table(config_lib.settings(), ("setting", "default", "meaning")))
        return
    cfg = config_lib.resolve(preset, config_file=config_file, overrides=list(overrides))
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


@main.command("inspect")
@click.argument("path", type=click.Path())
def inspect_cmd(path: str) -> None:
    """Show what a checkpoint (or a run's newest checkpoint) holds, without loading its weights."""
    from bytemtp.checkpoint import describe

    info = describe(path)
    m = info["config"].model
    click.echo(f"checkpoint  {info['checkpoint']}")
    click.echo(f"step        {info['step']}")
    click.echo(f"model       {info['params']:,} parameters: {m.trunk_layers} trunk layers + "
               f"{m.n_future} {m.head_type} heads, width {m.d_model}, context {m.seq_len}, "
               f"{m.unembed} unembedding")
    click.echo(f"resumable   {'yes' if info['resumable'] else 'no (no optimizer.pt: inference only)'}")
    click.echo(_table([(name, f"{size:,}") for name, size in info["files"].items()], ("file", "bytes")))
    extra = {k: v for k, v in info["train_state"].items() if k != "step" and not isinstance(v, (dict, list))}
    if extra:
        click.echo(_table(sorted(extra.items()), ("train state", "value")))


@main.group(cls=_Group)
def bench() -> None:
    """Measure speed and memory (ratios within one run)."""


@bench.command("train-step")
@_preset_option("small")
@click.option("--batch-size", default=8, show_default=True, type=click.IntRange(1))
@click.option("--steps", default=6, show_default=True, type=click.IntRange(1),
              help="Timed steps per variant (after the warm-up); the median counts.")
@click.option("--warmup", default=2, show_default=True, type=click.IntRange(0))
@click.option("--device", default=None, help="cpu or cuda[:N]; default: cuda when available.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write the results here.")
def bench_train_step(preset: str, batch_size: int, steps: int, warmup: int, device: str | None,
                     json_path: str | None) -> None:
    """Next-byte vs memory-efficient vs plain multi-token training step."""
    from tqdm import tqdm

    from bytemtp.bench import TRAIN_STEP_VARIANTS, train_step

    with tqdm(total=warmup + steps + len(TRAIN_STEP_VARIANTS), desc="train-step", unit="round") as bar:
        def progress(stage: str) -> None:
            bar.set_postfix_str(stage)
            bar.update()

        res = train_step(preset, batch_size=batch_size, steps=steps, warmup=warmup, device=device,
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
    click.echo(f"preset {preset}, batch {batch_size} x {res['seq_len']} bytes, {res['device']}")
    click.echo(_table(rows, header))
    click.echo(f"time_ratio {res['time_ratio']:.3f}  memory_ratio {res['memory_ratio']:.3f}  "
               f"plain_memory_ratio {res['plain_memory_ratio']:.3f}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(res, f, indent=2)
        click.echo(f"wrote {json_path}")
