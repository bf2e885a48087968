"""The options that several commands share, and the parsing of what users type into them.

Every check here runs while click reads the options, before a command starts its work: a bad
value leaves as one line (ValueError, click.BadParameter) and a non-zero exit.

The decoding vocabulary is one set of options, each with one name and one help text in every
command that decodes (`generate`, `serve`, `eval-task humaneval`, `bench decode`, `bench serve`,
`bench tokens`): `decoding_options` (`--draft`, a `Draft` in its text form, or a comma-separated
list of them where several are timed), `sampling_options` (`--temperature`, `--top-k`, `--top-p`,
`--seed`), `compile_option`, `dtype_option` and `prompt_options` (`--prompts FILE`, `--n-prompts
N`). Older spellings (`--heads`, `--lookup/--no-lookup`, `--no-speculative`, `--modes`, `--prompts
N` for a count) still work, hidden from --help: each is read into the new one and a one-line note
on stderr says how (`note: --modes is now --draft; read as --draft auto,chain-4`).
"""

from __future__ import annotations

import functools
import math
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


def fresh_option():
    """`--fresh` of the commands that train runs into --out as the sweep does (`bench sweep`, `bench
    quality`, `bench tokens`): a run found there that was trained with other settings is trained
    anew instead of refused (`sweep.run_sweep`'s `fresh`)."""
    return click.option("--fresh", is_flag=True,
                        help="Train anew each run in --out that was trained with other settings than asked for now "
                             "(its folder and tune removed first), instead of refusing it.")


def empty_split_error(e: ValueError, instead: str) -> ValueError:
    """An empty-split error (bytemtp.data.corpus) told for a command without --split: the split and the
    corpus as the library names them, then what this command can do instead; other errors as they are."""
    if "split of the prepared corpus" not in str(e) or "is empty" not in str(e):
        return e
    return ValueError(f"{str(e).split('; ')[0]}; {instead}, or prepare the corpus again with a larger "
                      "`bytemtp prep --val-fraction` or more documents")



def note(text: str) -> None:
    """A one-line note on stderr (stdout may carry a command's output)."""
    click.echo(f"note: {text}", err=True)


def _given(name: str) -> bool:
    """Whether the current command's parameter `name` was given (not its default)."""
    source = click.get_current_context().get_parameter_source(name)
    return source not in (None, click.core.ParameterSource.DEFAULT)


def _wrapped(f, adapt):
    """`f` called with its keyword arguments passed through `adapt` first; the click options
    already attached to `f` stay attached (`functools.wraps` copies them)."""
    @functools.wraps(f)
    def command(*args, **kwargs):
        return f(*args, **adapt(kwargs))
    return command


# --- how decoding drafts ----------------------------------------------------------------------

DRAFT_FORMS = ("auto (the heads and the draft's shape chosen each pass from measured pass costs and the "
               "heads' acceptance), chain or tree (automatic, within that shape), chain-K or tree-K (K heads "
               "every pass, K a number or all), plain (one byte a pass, the next-byte head alone), each maybe "
               "with +lookup (prompt-lookup bytes drafted too: what followed the last earlier occurrence of a "
               "row's newest bytes). Trees are for greedy decoding. Output never depends on the draft: greedy "
               "output is plain greedy output, and a seed repeats sampled bytes under every draft.")


def _parse_drafts(text: str, *, several: bool):
    """--draft's text as a Draft, or with `several` a tuple of them (comma-separated; a draft named
    twice, in any spelling, is timed once: `auto,auto` measured and reported auto twice)."""
    from bytemtp.decoding.strategy import Draft

    names = [t.strip() for t in text.split(",") if t.strip()] if several else [text]
    try:
        drafts = tuple(Draft.parse(name) for name in names)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--draft") from None
    if not drafts:
        raise click.BadParameter(f"{text!r} names no draft", param_hint="--draft")
    return tuple(dict.fromkeys(drafts)) if several else drafts[0]


def _draft_value(ctx: click.Context, param: click.Parameter, value: str | None):
    return None if value is None else _parse_drafts(value, several=param.metavar == "DRAFT[,DRAFT...]")


_OLD_DRAFT_OPTIONS = {
    "heads": click.option("--heads", "old_heads", type=click.IntRange(1), default=None, hidden=True),
    "lookup": click.option("--lookup/--no-lookup", "old_lookup", default=None, hidden=True),
    "no-speculative": click.option("--no-speculative", "old_no_speculative", is_flag=True, hidden=True),
    "modes": click.option("--modes", "old_modes", default=None, hidden=True),
}


def decoding_options(*, default: str | None = "auto+lookup", several: bool = False, old: tuple[str, ...] = (),
                     default_text: str | None = None):
    """--draft: one draft in `Draft`'s text form (`several`: a comma-separated list, each timed),
    passed to the command as `draft` (a Draft, a tuple of them, or None where `default` is None).
    `old` names the older spellings this command took (heads, lookup, no-speculative, modes):
    hidden, each read into --draft with a note."""
    help_text = ("Comma-separated drafts, each timed against plain decoding; a draft is " if several
                 else "How decoding drafts: ") + DRAFT_FORMS
    if default_text:
        help_text += f"  [default: {default_text}]"

    def adapt(kwargs: dict) -> dict:
        given = {name: kwargs.pop(f"old_{name.replace('-', '_')}") for name in old}
        kwargs["draft"] = _read_old_drafts(kwargs["draft"], given, several=several)
        return kwargs

    def decorate(f):
        command = _wrapped(f, adapt)
        for name in old:
            command = _OLD_DRAFT_OPTIONS[name](command)
        return click.option("--draft", default=default, show_default=default is not None and not default_text,
                            metavar="DRAFT[,DRAFT...]" if several else "DRAFT", callback=_draft_value,
                            help=help_text)(command)
    return decorate


def _read_old_drafts(draft, given: dict, *, several: bool):
    """--draft with the older spellings given (`given`: their values, None or False when not
    given) read into it, with a note naming the new spelling."""
    from bytemtp.decoding.strategy import Draft

    used = {name: value for name, value in given.items() if value is not None and value is not False
            or name == "lookup" and value is False}  # --no-lookup: False, given
    if not used:
        return draft
    explicit = _given("draft")
    if explicit and ("modes" in used or several or "heads" in used and draft.heads is not None):
        raise click.UsageError(f"give --draft alone: {', '.join('--' + n for n in used)} "
                               f"{'is' if len(used) == 1 else 'are'} its older spelling")
    if "modes" in used:
        new = _parse_drafts(used["modes"], several=several)
        note(f"--modes is now --draft; read as --draft {','.join(map(str, new)) if several else new}")
        return new
    if "no-speculative" in used:
        new = Draft.plain()
    else:  # on the older commands' draft (automatic) or the one given; lookup on where --lookup/--no-lookup was
        base = draft if explicit else Draft()
        new = Draft(heads=used.get("heads", base.heads), shape=base.shape,
                    lookup=base.lookup or used.get("lookup", "lookup" in given))
    spelt = [("--no-lookup" if n == "lookup" and not v else f"--{n}" + ("" if v is True else f" {v}"))
             for n, v in used.items()]
    spelt += [f"--draft {draft}"] if explicit else []
    note(f"{', '.join(spelt)} {'is' if len(spelt) == 1 else 'are'} now --draft; read as --draft {new}")
    return new


def check_draft(draft, n_future: int) -> None:
    """A draft against the model's heads (the check is `Draft.for_model`'s), as one line naming
    --draft."""
    try:
        draft.for_model(n_future)
    except ValueError:
        raise click.ClickException(
            f"--draft {draft}: {draft.heads} is more than the model's {n_future} heads; choose "
            + (f"1 to {n_future} heads (plain decodes with 1)" if n_future > 1 else "plain (it has no draft heads)")
        ) from None


# --- how bytes are chosen ---------------------------------------------------------------------

def _temperature(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """A temperature as decoding reads it: below `Sampling.GREEDY_BELOW`, 0 (greedy); nan and inf
    refused (FloatRange lets them through)."""
    if not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a temperature; expected a finite number >= 0 (0 = greedy)")
    if value > 0:
        from bytemtp.decoding.sampling import Sampling

        value = Sampling.effective_temperature(value)
    return value


def _seed(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """A seed within what a generator takes (`sampling.SEED_RANGE`, the server's range too)."""
    from bytemtp.decoding.sampling import SEED_RANGE

    if value is not None and not SEED_RANGE[0] <= value <= SEED_RANGE[1]:
        raise click.BadParameter(f"{value} is not a seed; a seed is an integer from -2**63 to 2**64-1",
                                 param_hint="--seed")
    return value


def sampling_options(*, seed_default: int | None = 0):
    """--temperature, --top-k, --top-p and --seed (`seed_default` None: drawn, and printed, when
    sampling), passed as `temperature`, `top_k`, `top_p` and `seed`."""
    options = [
        click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0), callback=_temperature,
                     help="0 = greedy, as is any temperature below 1e-5; above, every byte is sampled."),
        click.option("--top-k", default=0, show_default=True, type=click.IntRange(0),
                     help="Sample from the k likeliest bytes only (0 = all bytes)."),
        click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True),
                     help="Sample from the smallest set of likeliest bytes whose probability reaches this (1 = all)."),
        click.option("--seed", default=seed_default, show_default=seed_default is not None, type=int,
                     callback=_seed,
                     help="Seed of the sampler (an integer from -2**63 to 2**64-1). A seed repeats the sampled bytes "
                          "whatever the draft (each byte is drawn by its position), on the same device and dtype."
                          + ("  [default: drawn, and printed to stderr]" if seed_default is None else "")),
    ]

    def decorate(f):
        for option in reversed(options):
            f = option(f)
        return f
    return decorate


# --- how passes run, and the model's dtype ----------------------------------------------------

def compile_option(default: str = "auto"):
    return click.option("--compile", "compile_mode", default=default, show_default=True,
                        type=click.Choice(["auto", "on", "off"]),
                        help="Run decoding passes as a compiled static-shape step (inductor on a CPU, CUDA graphs "
                             "on a GPU): on compiles every shape the work needs before it starts (minutes on a CPU "
                             "the first time, seconds from the compile cache); off runs them eagerly; auto compiles "
                             "where the work repays the compile time or the compile cache holds the steps already.")


def dtype_option():
    return click.option("--dtype", default="float32", show_default=True,
                        type=click.Choice(["float32", "bfloat16", "float16"]),
                        help="Weights and activations of the loaded model (bfloat16 halves the memory on a GPU).")


# --- which prompts ----------------------------------------------------------------------------

def prompt_options(*, n_default: int | None = 16, prompt_bytes: int | None = 128, from_file: bool = True,
                   default_text: str = "the starts of val documents of the run's corpus (text it did not train on)"):
    """--prompts FILE and --n-prompts N (and --prompt-bytes where prompts are cut from val
    documents), passed as `prompts_path`, `n_prompts` (and `prompt_bytes`). `from_file` False:
    the command cuts its prompts from the corpus alone, and --prompts is only the older spelling
    of a count. A --prompts that is a number and not a file is read as --n-prompts, with a note."""
    def adapt(kwargs: dict) -> dict:
        path = kwargs.pop("prompts_path")
        if path is not None and path.isdigit() and not os.path.exists(path):
            if _given("n_prompts"):
                raise click.UsageError(f"give --n-prompts alone: --prompts {path} is its older spelling")
            note(f"--prompts {path} is now --n-prompts {path}; read as --n-prompts {path}")
            kwargs["n_prompts"], path = int(path), None
        elif path is not None and not from_file:
            raise click.BadParameter(f"{path!r}: this command cuts its prompts from the corpus's val split; "
                                     "--n-prompts N says how many", param_hint="--n-prompts")
        elif path is not None and not os.path.isfile(path):
            raise click.BadParameter(f"{path} is not a file" if os.path.exists(path) else f"{path} does not exist",
                                     param_hint="--prompts")
        if from_file:
            kwargs["prompts_path"] = path
        return kwargs

    n_help = "Prompts to decode" + (" (the first N of --prompts FILE)." if from_file else ", cut from val documents.")
    options = [click.option("--prompts", "prompts_path", default=None, metavar="FILE", hidden=not from_file,
                            help='Prompts, one JSON object a line: {"prompt": "text"}, or {"prompt_b64": "..."} with '
                                 "the prompt's exact bytes in base64 (for bytes that are not UTF-8)."
                                 + (f"  [default: {default_text}]" if default_text else "")),
               click.option("--n-prompts", default=n_default, show_default=n_default is not None,
                            type=click.IntRange(1), help=n_help + ("" if n_default is not None else "  [default: all]"))]
    if prompt_bytes is not None:
        options.append(click.option("--prompt-bytes", default=prompt_bytes, show_default=True, type=click.IntRange(1),
                                    help="Length of the prompts cut from val documents."))

    def decorate(f):
        command = _wrapped(f, adapt)
        for option in reversed(options):
            command = option(command)
        return command
    return decorate


def renamed(old_value, new_value, old: str, new: str):
    """An option given by its older name (`old`) read as its new one, with a note; both: one line."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise click.UsageError(f"give {new} alone: {old} is its older spelling")
    note(f"{old} is now {new}; read as {new} {old_value}")
    return old_value
