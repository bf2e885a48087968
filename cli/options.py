"""The options that several commands share, and the parsing of what users type into them.

Every check here runs while click reads the options, before a command starts its work: a bad
value leaves as one line (ValueError, click.BadParameter) and a non-zero exit.
"""

from __future__ import annotations

import os
import re
from decimal import Decimal

import click

from bytemtp import config as config_lib
from bytemtp import config_io
from bytemtp.decoding.strategy import Draft


class OneLineErrors(click.Group):
    """A command group whose commands' ValueErrors (user errors) leave as one line, exit status 1."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ValueError as e:
            raise click.ClickException(str(e)) from None


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_duration(text: str, option: str = "--time") -> float:
    """Seconds in '90', '90s', '10m', '1h30m', '2h' (`option` names the option in the error)."""
    if not re.fullmatch(r"\s*(?:\d+(?:\.\d+)?[smhd]?\s*)+", text):
        raise ValueError(f"{option} {text!r} is not a duration; write e.g. 90s, 10m, 1h30m")
    return sum(float(number) * _UNITS[unit or "s"] for number, unit in re.findall(r"(\d+(?:\.\d+)?)([smhd]?)", text))


def parse_size(text: str) -> int:
    """Bytes in '5000000', '50M', '2G' (decimal units)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)[bB]?\s*", text)
    if not match:
        raise ValueError(f"--bytes {text!r} is not a size; write e.g. 5000000, 50M, 2G")
    return int(Decimal(match[1]) * _SIZES[match[2].lower()])


def parse_counts(text: str, *, param_hint: str = "--counts") -> range:
    """Numbers of operations in '3' or '1-10'."""
    low, _, high = text.partition("-")
    try:
        counts = range(int(low), int(high or low) + 1)
    except ValueError:
        counts = range(0)
    if len(counts) == 0 or counts.start < 1:
        raise click.BadParameter(f"{text!r} is not a count or a range such as 1-10", param_hint=param_hint)
    return counts


def parse_batch_sizes(text: str, *, param_hint: str = "--batch-sizes") -> tuple[int, ...]:
    """Batch sizes (or other counts) in '1,8'."""
    try:
        sizes = tuple(int(b) for b in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of counts of 1 or more",
                                 param_hint=param_hint)
    return sizes


def parse_modes(text: str) -> tuple[str, ...]:
    """Drafting modes in 'auto,chain-2,tree-all'."""
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    for m in modes:
        try:
            Draft.parse(m)
        except ValueError:
            raise click.BadParameter(f"{m!r} is not a mode; use auto, chain-K or tree-K (K a number or all), "
                                     "each maybe with +lookup",
                                     param_hint="--modes") from None
    return modes


def one_target(argument: str | None, ckpt: str | None, what: str) -> str:
    """A command's RUN argument or its --ckpt, whichever was given (exactly one)."""
    if (argument is None) == (ckpt is None):
        raise click.UsageError(f"give the {what} once: as an argument or with --ckpt")
    return argument or ckpt


def preset_option(default: str):
    return click.option("--preset", default=default, show_default=True,
                        type=click.Choice(list(config_io.PRESETS)), help="Starting configuration.")


def _check_device(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        config_lib.check_device(param.opts[0], value)  # the one check train.device has too
    return value


def device_option(default: str | None = "auto"):
    return click.option("--device", default=default, show_default=default is not None, callback=_check_device,
                        help="auto (CUDA when available), cpu, cuda or cuda:N.")


def check_heads(heads: int | None, n_future: int) -> None:
    """--heads against the model's heads (the check is `Draft.for_model`'s), as one line naming the option."""
    try:
        Draft(heads=heads).for_model(n_future)
    except ValueError:
        raise click.ClickException(
            f"--heads {heads}: {heads} is more than the model's {n_future} heads; choose "
            + (f"1 to {n_future} (1 decodes plainly)" if n_future > 1 else "1 (it has no draft heads)")) from None


def compile_option():
    return click.option("--compile", "compile_mode", default="auto", show_default=True,
                        type=click.Choice(["auto", "on", "off"]),
                        help="Run decoding passes as a compiled static-shape step (inductor on a CPU, CUDA "
                             "graphs on a GPU): auto compiles when the work repays the compile time or the "
                             "step is already in the compile cache.")


def dtype_option():
    return click.option("--dtype", default="float32", show_default=True,
                        type=click.Choice(["float32", "bfloat16", "float16"]),
                        help="Weights and activations of the loaded model (bfloat16 halves the memory on a GPU).")


def check_output_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
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


def check_output_dir(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
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


def json_option(default: str | None = None):
    return click.option("--json", "json_path", default=default, show_default=default is not None,
                        type=click.Path(allow_dash=True), callback=check_output_file,
                        help="Also write the results here as JSON ('-': stdout, and the table goes to stderr).")


def empty_split_error(e: ValueError, instead: str) -> ValueError:
    """An empty-split error (bytemtp.data.corpus) told for a command without --split: the split and the
    corpus as the library names them, then what this command can do instead; other errors as they are."""
    if "split of the prepared corpus" not in str(e) or "is empty" not in str(e):
        return e
    return ValueError(f"{str(e).split('; ')[0]}; {instead}, or prepare the corpus again with a larger "
                      "`bytemtp prep --val-fraction` or more documents")

