"""What the commands print of their own: where a report goes and its JSON, a run's header lines,
a checkpoint's report, and the progress bars of stages.

A command's report goes to stdout, or to stderr when stdout carries its JSON (`--json -`);
`generate` keeps stdout for the generated text and reports on stderr. The library's results render
their own tables (`table()`, or `line()` for one line; a prepared corpus's manifest through
`corpus.corpus_table`), which the commands only print; the aligned-column `table` is the library's
(`bytemtp.tables`). A checkpoint's report stays here: it shares `model_line` with the training
header, and `runtime/checkpoint.py`, where `describe` builds its dict, is near the size limit of a
module.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile

import click

from bytemtp.tables import table


def echo(text: str) -> None:
    """A command's report: on stdout, or on stderr when stdout carries its JSON (--json -)."""
    ctx = click.get_current_context(silent=True)
    click.echo(text, err=ctx is not None and ctx.params.get("json_path") == "-")


def write_json(path: str | None, data, *, report_to_stderr: bool = False) -> None:
    """`data` as JSON, a typed result (or one inside it) in its JSON form (`to_json`), written whole
    or not at all: a file goes to a temporary file beside it, then takes its place; a path that is
    not a file (a pipe, a device) takes the text in one write. A write that fails (a full disk,
    /dev/full) is one line that names the path, and leaves what was there. `report_to_stderr`: the
    "wrote" line on stderr (a command whose stdout carries its output)."""
    if path == "-":
        click.echo(json.dumps(data, indent=2, default=_json_form))
    elif path:
        text = json.dumps(data, indent=2, default=_json_form)
        try:
            _write_whole(path, text)
        except OSError as e:
            raise click.ClickException(f"--json {path} could not be written ({e.strerror or e}); "
                                       "nothing was written there") from None
        click.echo(f"wrote {path}", err=True) if report_to_stderr else echo(f"wrote {path}")


def _write_whole(path: str, text: str) -> None:
    if os.path.exists(path) and not os.path.isfile(path):  # a pipe or a device: nothing to leave half written
        with open(path, "w") as f:
            f.write(text)
        return
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as open() would have made it (mkstemp's is 0600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _json_form(value):
    return value.to_json() if hasattr(value, "to_json") else str(value)


def model_line(m, params: int) -> str:
    """One line that says what a model is."""
    drafts = f" + {m.n_future - 1} {m.draft} draft heads" if m.drafts.heads else ""
    return (f"{params:,} parameters: {m.trunk_layers} trunk layers + {m.n_future} {m.head_type} heads{drafts}, "
            f"width {m.d_model}, context {m.seq_len}")


def train_header(cfg, run_dir, *, resume: bool) -> str:
    """Device, parameters, corpus and run directory; the full config goes to RUN/run-config.json."""
    import torch

    from bytemtp.model.flops import step_flops
    from bytemtp.model.model import ByteMTP
    from bytemtp.runtime.devices import autocast, resolve_device
    from bytemtp.training.runs import RUN_CONFIG

    with torch.device("meta"):
        model = ByteMTP(cfg.model)
    m, world = cfg.model, int(os.environ.get("WORLD_SIZE", "1"))
    device = resolve_device(cfg.train.device)
    step_bytes = cfg.data.batch_size * m.seq_len * cfg.train.grad_accum * world
    flops = step_flops(model, step_bytes, m.seq_len)
    rows = [("run", f"{os.path.abspath(run_dir)} ({'resumed' if resume else 'new'}; all settings in {RUN_CONFIG})"),
            ("corpus", cfg.data.path),
            ("model", model_line(m, model.num_params())),
            ("device", f"{device}" + (f" x {world} processes" if world > 1 else "") +
             (", bf16 autocast" if isinstance(autocast(device, cfg.train.precision), torch.autocast) else ", fp32")),
            ("batch", f"{step_bytes:,} bytes a step"),
            ("compute", compute_line(cfg.train, device, flops=flops, step_bytes=step_bytes, devices=world)),
            ("optim", optimizer_line(cfg.train))]
    return "\n".join(f"{name:8s} {value}" for name, value in rows)


def compute_line(tc, device, *, flops: float, step_bytes: int, devices: int) -> str:
    """Model FLOPs a step and a byte, the peak that MFU is a share of (where known), and whether
    the step is compiled (train.compile) and why. The progress line shows bytes/s (and MFU)."""
    from bytemtp.model.flops import peak_flops
    from bytemtp.training.step import compile_choice

    _, compiled = compile_choice(tc, device, flops_per_step=flops, bytes_per_step=step_bytes)
    peak = peak_flops(device, tc.peak_flops)
    mfu = (f"MFU of {devices} x {peak:.3g} FLOP/s" if peak else
           "no MFU (a peak unknown: set train.peak_flops)")
    return f"{flops:.3g} FLOP a step ({flops / step_bytes:,.0f} a byte), {mfu}; compile {compiled}"


def optimizer_line(tc) -> str:
    """The optimizer, its peak learning rates and the schedule's shape and length."""
    opt = (f"muon lr {tc.muon_lr:g} on the hidden matrices, adamw lr {tc.lr:g} on the rest" if tc.optimizer == "muon"
           else f"adamw lr {tc.lr:g}")
    shape = f"wsd (decay over the last {tc.decay_fraction:.0%})" if tc.schedule == "wsd" else tc.schedule
    if tc.schedule_steps:
        length = f"{tc.schedule_steps} steps"
    elif tc.steps or tc.max_bytes:
        length = f"{tc.steps} steps" if tc.steps else "the bytes budget"
        length += ", or the steps the time budget buys where fewer" if tc.max_time else ""
    elif tc.max_time:
        length = "the steps that the time budget buys (fitted)"
    else:
        length = "none: the peak after warmup"
    return f"{opt}; {tc.warmup_steps} warmup steps, then {shape} to {tc.min_lr_ratio:g} x the peak over {length}"


def checkpoint_report(info: dict) -> str:
    lines = [f"checkpoint  {info['checkpoint']}", f"step        {info['step']}",
             f"model       {model_line(info['config'].model, info['params'])}, "
             f"{info['config'].model.unembed} unembedding",
             f"vocabulary  {info['vocabulary']}",
             f"resumable   {'yes' if info['resumable'] else 'no (no optimizer.pt: inference only)'}",
             table([(name, f"{size:,}") for name, size in info["files"].items()], ("file", "bytes"))]
    extra = {k: v for k, v in info["train_state"].items() if k != "step" and not isinstance(v, (dict, list))}
    if extra:
        lines.append(table(sorted(extra.items()), ("train state", "value")))
    return "\n".join(lines)


class StageBars:
    """One tqdm bar per stage of a `progress(stage, done, total)` callback, each opened when its
    stage starts and the previous one closed (decode over problems, then execute over programs)."""

    def __init__(self, units: dict[str, str]):
        self.units, self.stage, self.bar = units, None, None

    def update(self, stage: str, done: int, total: int) -> None:
        from tqdm import tqdm

        if stage != self.stage:
            self.close()
            self.stage, self.bar = stage, tqdm(total=total, desc=stage, unit=self.units.get(stage, "it"))
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "StageBars":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
