"""`bytemtp serve`: an OpenAI-compatible HTTP server over a trained model (`bytemtp.serving`)."""

from __future__ import annotations

import dataclasses
import pathlib

import click

from bytemtp.decoding.strategy import DECODE_MODES, Draft

from .options import device_option, dtype_option


def _draft(ctx: click.Context, param: click.Parameter, value: str) -> Draft:
    try:
        return Draft.parse(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@click.command("serve")
@click.option("--ckpt", required=True, help="A run directory (its newest checkpoint) or a checkpoint.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface; there is no authentication).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="0: any free port.")
@click.option("--max-batch", default=8, show_default=True, type=click.IntRange(1),
              help="Requests decoded together at most; more wait in the queue.")
@click.option("--max-queue", default=64, show_default=True, type=click.IntRange(0),
              help="Requests that may wait beyond the running batch; past it a request gets 503.")
@click.option("--max-prompt-bytes", default=65536, show_default=True, type=click.IntRange(1),
              help="Longest prompt accepted (413 past it); the window slides past the context.")
@click.option("--draft", "draft", default="auto", show_default=True, callback=_draft,
              help=f"How decoding drafts: {', '.join(DECODE_MODES)}, plain, chain-K or tree-K.")
@click.option("--lookup/--no-lookup", default=True, show_default=True,
              help="Also draft prompt-lookup bytes (what followed the last earlier occurrence of a row's newest "
                   "bytes in its prompt and output), verified in the same pass as the heads' drafts.")
@click.option("--model-name", default=None, help="The model's id in the API (default: the run directory's name).")
@click.option("--compile", "compile_mode", default="auto", show_default=True,
              type=click.Choice(["auto", "on", "off"]),
              help="Decode on the compiled static-shape step, as generate does (inductor on a CPU, CUDA graphs on a "
                   "GPU): on compiles every batch bucket's shapes when the server starts (minutes on a CPU the "
                   "first time, seconds from the compile cache); auto runs compiled when the compile cache holds "
                   "every bucket's step already, else eagerly.")
@device_option()
@dtype_option()
def serve_cmd(ckpt: str, host: str, port: int, max_batch: int, max_queue: int, max_prompt_bytes: int, draft: Draft,
              lookup: bool, model_name: str | None, compile_mode: str, device: str, dtype: str) -> None:
    """Serve a model over HTTP: OpenAI-compatible /v1/completions (stream, echo, logprobs),
    /v1/models, /health, and /tokenize with /tokenizer_info for lm-evaluation-harness.

    Requests are batched continuously (they join and leave the running batch between passes) and
    decoded self-speculatively; every greedy output equals that prompt decoded alone. Needs the
    serve extra: pip install 'bytemtp[serve]'.
    """
    try:
        from bytemtp.serving.app import Server, serve
    except ModuleNotFoundError as e:
        if e.name == "aiohttp":
            raise click.ClickException("bytemtp serve needs aiohttp: pip install 'bytemtp[serve]'") from None
        raise
    from bytemtp.decoding.decode import Decoder
    from bytemtp.runtime.checkpoint import load_model
    from bytemtp.runtime.devices import resolve_device
    from bytemtp.serving.engine import Engine

    draft = dataclasses.replace(draft, lookup=draft.lookup or lookup)
    model, _ = load_model(ckpt, device=resolve_device(device), dtype=dtype, bytes_only="serve")
    draft.for_model(model.config.n_future)  # a draft of more heads than the model has: one line
    path = pathlib.Path(ckpt).resolve()
    name = model_name or (path.parent.name if path.name.startswith("step") else path.name)
    engine = Engine(model, max_batch=max_batch, max_queue=max_queue, draft=draft,
                    decoder=Decoder(model, compile=compile_mode))
    engine.start(progress=lambda line: click.echo(line, err=True))
    try:
        serve(Server(engine, model_name=name, max_prompt_bytes=max_prompt_bytes), host=host, port=port,
              announce=lambda url: click.echo(f"serving {name} on {url}/v1 (Ctrl-C stops)", err=True))
    finally:
        engine.close()
