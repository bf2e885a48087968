"""`bytemtp lm-eval`: lm-evaluation-harness's own command line, with the bytemtp model registered.

lm_eval finds models only inside its own package, so its `lm_eval` command cannot see a model
that another package provides; this command imports `bytemtp.interop.harness` (which registers the model
as `bytemtp`) and hands every argument to lm_eval's command line unchanged.
"""

from __future__ import annotations

import sys

import click


@click.command("lm-eval", context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                            "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def lm_eval_cmd(args: tuple[str, ...]) -> None:
    """Run lm-evaluation-harness (`lm_eval ARGS`) with the bytemtp model: --model bytemtp
    --model_args ckpt=RUN[,device=...,dtype=...,batch_size=N,max_gen_toks=N,draft=auto,seed=N].

    Every argument is lm_eval's (`bytemtp lm-eval --help` shows them). Needs the harness extra:
    pip install 'bytemtp[harness]'.
    """
    try:
        import bytemtp.interop.harness  # noqa: F401  # isort: skip  (registers the model; names the extra)
        from lm_eval.__main__ import cli_evaluate
    except ModuleNotFoundError as e:
        raise click.ClickException(str(e)) from None
    sys.argv = ["lm-eval", *args]
    cli_evaluate()
