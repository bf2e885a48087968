"""`bytemtp serve`: an OpenAI-compatible HTTP server over a trained model (`bytemtp.serving`)."""

from __future__ import annotations

import ipaddress
import pathlib

import click

from bytemtp.decoding.strategy import Draft

from .options import check_draft, compile_option, decoding_options, device_option, dtype_option


def _api_keys(given: tuple[str, ...], path: str | None) -> tuple[str, ...]:
    """The keys of --api-key (or BYTEMTP_API_KEY) and of --api-key-file; a bad one is one line."""
    from bytemtp.serving.protocol import check_api_key, read_api_keys

    try:
        keys = [check_api_key(key, source="--api-key") for key in given]
        if path is not None:
            keys += read_api_keys(path)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    return tuple(dict.fromkeys(keys))


def _loopback(host: str) -> bool:
    """Whether an address to listen on is reachable from this host only (127.0.0.0/8, ::1, localhost)."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve off the loopback
        return False


@click.command("serve")
@click.option("--ckpt", required=True, help="A run directory (its newest checkpoint) or a checkpoint.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface). Off the loopback, set an API key: without "
                   "one, anyone who reaches the port may use the model (a warning says so at start).")
@click.option("--api-key", "api_keys", multiple=True, envvar="BYTEMTP_API_KEY", show_envvar=True, metavar="KEY",
              help="Require 'Authorization: Bearer KEY' (the openai client's api_key) on every /v1 route, which "
                   "answer 401 without it; /health and the tokenizer routes stay open. Repeat for several keys; "
                   "BYTEMTP_API_KEY gives them (split at spaces) when no --api-key is given.")
@click.option("--api-key-file", default=None, metavar="FILE",
              help="Accept the keys in FILE too: one a line, blank lines and # comments skipped.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="0: any free port.")
@click.option("--max-batch", default=8, show_default=True, type=click.IntRange(1),
              help="Requests decoded together at most; more wait in the queue.")
@click.option("--max-queue", default=64, show_default=True, type=click.IntRange(0),
              help="Requests that may wait beyond the running batch; past it a request gets 503. A request's "
                   "choices (prompts x n) queue as a unit: one larger than the queue is taken whole when nothing "
                   "waits.")
@click.option("--max-prompt-bytes", default=65536, show_default=True, type=click.IntRange(1),
              help="Longest prompt accepted (413 past it); the window slides past the context.")
@decoding_options(old=("lookup",))
@click.option("--model-name", default=None, help="The model's id in the API (default: the run directory's name).")
@click.option("--shutdown-timeout", default=5.0, show_default=True, type=click.FloatRange(0.1, 3600),
              help="Seconds from SIGTERM or Ctrl-C to exit: the requests in flight may finish meanwhile, and those "
                   "still open then end with an error (a stream: an error event, then [DONE]); a second signal "
                   "ends them at once. Under Docker's 10 s and Kubernetes' 30 s.")
@compile_option()
@device_option()
@dtype_option()
def serve_cmd(ckpt: str, host: str, api_keys: tuple[str, ...], api_key_file: str | None, port: int,
              max_batch: int, max_queue: int, max_prompt_bytes: int, draft: Draft, model_name: str | None, shutdown_timeout: float, compile_mode: str, device: str,
              dtype: str) -> None:
    """Serve a model over HTTP: OpenAI-compatible /v1/completions (stream, echo, logprobs),
    /v1/models, /health, and /tokenize with /tokenizer_info for lm-evaluation-harness.

    Requests are batched continuously (they join and leave the running batch between passes) and
    decoded self-speculatively; every greedy output equals that prompt decoded alone. Needs the
    serve extra: pip install 'bytemtp[serve]'.
    """
    try:
        from bytemtp.serving.app import ListenError, Server, listen, serve
    except ModuleNotFoundError as e:
        if e.name == "aiohttp":
            raise click.ClickException("bytemtp serve needs aiohttp: pip install 'bytemtp[serve]'") from None
        raise
    from bytemtp.decoding.decode import Decoder
    from bytemtp.runtime.checkpoint import load_model
    from bytemtp.runtime.devices import resolve_device
    from bytemtp.serving.engine import Engine

    keys = _api_keys(api_keys, api_key_file)
    if not keys and not _loopback(host):
        click.echo(f"warning: serving on {host} without an API key: anyone who reaches the port may use the model "
                   "(--api-key, --api-key-file or BYTEMTP_API_KEY sets one)", err=True)

    try:  # before the model loads: a port in use fails at once
        sock = listen(host, port)
    except ListenError as e:
        raise click.ClickException(str(e)) from None
    with sock:  # closed when the server stops, or when the model fails to load
        model, _ = load_model(ckpt, device=resolve_device(device), dtype=dtype, bytes_only="serve")
        check_draft(draft, model.config.n_future)  # a draft of more heads than the model has: one line
        path = pathlib.Path(ckpt).resolve()
        name = model_name or (path.parent.name if path.name.startswith("step") else path.name)
        engine = Engine(model, max_batch=max_batch, max_queue=max_queue, draft=draft,
                        decoder=Decoder(model, compile=compile_mode))
        engine.start(progress=lambda line: click.echo(line, err=True))
        try:
            serve(Server(engine, model_name=name, max_prompt_bytes=max_prompt_bytes, api_keys=keys), sock=sock,
                  shutdown_timeout=shutdown_timeout, say=lambda line: click.echo(line, err=True),
                  announce=lambda url: click.echo(f"serving {name} on {url}/v1 (Ctrl-C stops)", err=True))
        finally:
            engine.close(timeout=1.0)  # a pass in progress ends by itself; the thread dies with the process
