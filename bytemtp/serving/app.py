"""The HTTP side of `bytemtp serve`: an OpenAI-compatible completions endpoint on aiohttp.

aiohttp is the stack: one well-kept package that is both an asyncio HTTP server and a client,
with server-sent events as a plain streamed response, a body-size limit, and handler
cancellation when a client disconnects, which is how a gone client cancels its rows. It parses
HTTP; this module only routes, checks requests (`protocol`) and bridges to the decoding thread
(`engine.Engine`): a job's callbacks, called on that thread, hand its events to the event loop
with `call_soon_threadsafe`.

Routes: `POST /v1/completions` (plain, `stream`, `echo`, `logprobs`, `n`, a list of prompts),
`GET /v1/models`, `GET /health`, and the tokenizer pair that lm-evaluation-harness's remote
tokenizer asks for, `GET /tokenizer_info` and `POST /tokenize` (with `POST /detokenize`): ids
are bytes, and the special names in the text `/tokenize` reads become their ids, as a Hugging Face
tokenizer parses special tokens. Every error is an OpenAI-style JSON body: 400 for a bad field
(named), 401 without a valid API key, 404 for an unknown model or route, 413 past the prompt
limit, 503 when the queue is full; an unexpected fault is a 500 whose body says what failed,
never a traceback.

With API keys (`Server(api_keys=...)`, `serve --api-key`), every route but the open ones
(`OPEN_ROUTES`: `/health` and the tokenizer routes, which read no model; as vLLM leaves its
`/tokenize` open, so lm-evaluation-harness's remote tokenizer needs no key) answers 401 unless
the request carries `Authorization: Bearer KEY` with one of them: the `/v1` routes, and any path
that matches no route, so that no spelling of a path gets past the check. A request's choices
are queued as a unit (`Engine.submit`), so a request of more prompts than the queue holds is
taken whole when nothing waits, its rows joining the batch as room frees.

Stopping (`serve`): the first SIGTERM or Ctrl-C closes the listening socket and answers new
requests on open connections with 503; the requests in flight go on until they finish or the grace
period (`shutdown_timeout`) is nearly over, when each still open ends with an error (a stream: an
error event, then `data: [DONE]`); then the process exits. A second signal ends them at once. The
port is bound before the model loads (`listen`), so a port in use fails in one line, at once.

Log-probabilities are those of the next-byte head at temperature 1 (the model's own
distribution, whatever the sampling settings), scored over the prompt and the output once the
output is done; with `stream` they come in the last chunk of each choice.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import secrets
import signal
import socket
import threading
import time
from typing import Any

from aiohttp import web

import torch

from bytemtp.decoding.generation import Generation
from bytemtp.decoding.sampling import SEED_RANGE, Sampling
from bytemtp.serving.engine import Engine, GenerateJob, QueueFull, ScoreJob
from bytemtp.serving.protocol import (ApiError, Completion, StreamText, authorized, error_body, finish_reason,
                                      logprobs_body, parse_completion, trim_stop)
from bytemtp.vocab import EOS, SPECIAL_NAMES

log = logging.getLogger("bytemtp.serve")


class Server:
    """The routes over one engine (see the module docstring)."""

    def __init__(self, engine: Engine, *, model_name: str, max_prompt_bytes: int = 65536,
                 api_keys: tuple[str, ...] = ()):
        self.engine, self.model_name, self.max_prompt_bytes = engine, model_name, max_prompt_bytes
        self.api_keys = tuple(api_keys)
        self.created = int(time.time())
        self.stopping = False  # set when the server stops: new requests get 503
        self._open: set[_Run] = set()  # the choices of the completions requests in flight

    async def drained(self) -> None:
        """Return once no completions request is in flight."""
        while self._open:
            await asyncio.sleep(0.05)

    def abort(self, message: str) -> None:
        """End every choice in flight now with a 503 error (a stream: an error event, then [DONE])."""
        for run in list(self._open):
            run.abort(ApiError(503, message, kind="server_shutting_down"))

    def app(self) -> web.Application:
        middlewares = [_errors] + ([_bearer(self.api_keys)] if self.api_keys else [])
        app = web.Application(middlewares=middlewares, client_max_size=8 * self.max_prompt_bytes + (1 << 20))
        app.add_routes([web.post("/v1/completions", self.completions), web.get("/v1/models", self.models),
                        web.get("/health", self.health), web.get("/tokenizer_info", self.tokenizer_info),
                        web.post("/tokenize", self.tokenize), web.post("/detokenize", self.detokenize)])
        return app

    # --- small routes ---------------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        cfg = self.engine.model.config
        return web.json_response({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self.created, "owned_by": "bytemtp",
            "max_model_len": cfg.seq_len, "n_future": cfg.n_future}]})

    async def health(self, request: web.Request) -> web.Response:
        st = self.engine.stats
        return web.json_response({"status": "stopping" if self.stopping else "ok",
                                  "running": self.engine.running, "queued": self.engine.queued,
                                  "requests": st.requests, "bytes_out": st.bytes_out, "passes": st.passes,
                                  "mean_batch": round(st.mean_batch, 3)})

    async def tokenizer_info(self, request: web.Request) -> web.Response:
        return web.json_response({"tokenizer": "bytes", "vocab_size": 256 + len(SPECIAL_NAMES),
                                  "eos_token": SPECIAL_NAMES[EOS], "bos_token": None, "pad_token": None,
                                  "model_max_length": self.engine.model.config.seq_len})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await _json(request)
        text = body.get("prompt", body.get("text")) if isinstance(body, dict) else None
        if not isinstance(text, str):
            raise ApiError(400, "the field 'prompt' (a string) is required", param="prompt")
        ids: list[int] = []
        for k, part in enumerate(text.split(SPECIAL_NAMES[EOS])):
            ids += [EOS] * (k > 0) + list(part.encode("utf-8", "surrogatepass"))
        return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": self.engine.model.config.seq_len})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await _json(request)
        ids = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not all(isinstance(i, int) and (0 <= i < 256 or i in SPECIAL_NAMES) for i in ids):
            raise ApiError(400, "the field 'tokens' is a list of ids (0..255 and the special ids)", param="tokens")
        data = bytearray()
        out = []
        for i in ids:  # bytes as UTF-8, special ids by name
            if i in SPECIAL_NAMES:
                out.append(data.decode("utf-8", "replace") + SPECIAL_NAMES[i])
                data = bytearray()
            else:
                data.append(i)
        text = "".join(out) + data.decode("utf-8", "replace")
        return web.json_response({"prompt": text})

    # --- completions ----------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        if self.stopping:
            raise ApiError(503, "the server is shutting down", kind="server_shutting_down")
        req = parse_completion(await _json(request), model_name=self.model_name,
                               max_prompt_bytes=self.max_prompt_bytes)
        rid, created = f"cmpl-{secrets.token_hex(12)}", int(time.time())
        runs = [_Run(self, req, index=p * req.n + j, prompt=p, seed=_seed(req.seed, j))
                for p in range(len(req.prompts)) for j in range(req.n)]
        self._open.update(runs)
        try:
            _submit(self.engine, [run.make_job() for run in runs])  # all or none
            if req.stream:
                return await self._stream(request, req, runs, rid, created)
            results = [await run.finish() for run in runs]
        finally:
            self._open.difference_update(runs)
            for run in runs:
                run.cancel()  # a client gone mid-request (the handler is cancelled) frees its rows
        usage = _usage(req, runs)
        return web.json_response({"id": rid, "object": "text_completion", "created": created,
                                  "model": self.model_name, "choices": results, "usage": usage})

    async def _stream(self, request: web.Request, req: Completion, runs: list[_Run], rid: str,
                      created: int) -> web.StreamResponse:
        merged: asyncio.Queue = asyncio.Queue()
        for run in runs:  # before the first await: no event is missed
            run.forward_to(merged)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        head = {"id": rid, "object": "text_completion", "created": created, "model": self.model_name}

        async def send(choice: dict | None, usage: dict | None = None) -> None:
            chunk = {**head, "choices": [] if choice is None else [choice]}
            if usage is not None:
                chunk["usage"] = usage
            await response.write(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode())

        if req.echo:
            for run in runs:
                await send({"index": run.index, "text": run.prompt_text(), "logprobs": None, "finish_reason": None})
        open_runs = len(runs)
        while open_runs:
            run, kind, value = await merged.get()
            if kind == "bytes":
                if run.aborted:  # stopping: its error event goes out now, not after a backlog
                    continue
                text = run.stream.push(value)
                if text:
                    await send({"index": run.index, "text": text, "logprobs": None, "finish_reason": None})
                continue
            open_runs -= 1
            try:
                choice = await run.finish()  # with logprobs, those of the whole choice come in its last chunk
            except ApiError as e:  # the headers are out: the fault goes in the stream
                await response.write(f"data: {json.dumps(error_body(e.status, e.message, kind=e.kind))}\n\n".encode())
                continue
            await send({"index": run.index, "text": run.stream.finish(run.generation.stats.stopped_by),
                        "logprobs": choice["logprobs"], "finish_reason": choice["finish_reason"]})
        if req.include_usage:
            await send(None, _usage(req, runs))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


class _Run:
    """One choice of a request: its job in the engine and the events it has heard."""

    def __init__(self, server: Server, req: Completion, *, index: int, prompt: int, seed: int):
        self.server, self.req, self.index, self.p, self.seed = server, req, index, prompt, seed
        self.loop = asyncio.get_running_loop()
        self.done: asyncio.Future = self.loop.create_future()
        self.sink: asyncio.Queue | None = None
        self.stream = StreamText(req.stop)
        self.generation: Generation | None = None
        self.job: GenerateJob | ScoreJob | None = None
        self.scored: asyncio.Future | None = None  # the scoring of logprobs, while it runs
        self.aborted = False  # ended by `abort`: its stream skips the bytes still queued
        self.completion_bytes = 0  # the output's bytes, stop string cut, once finished

    @property
    def prompt(self) -> bytes:
        return self.req.prompts[self.p]

    def prompt_text(self) -> str:
        return self.prompt.decode("utf-8", "replace")

    def _call(self, fn, *args) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: the server is stopping
            pass

    def make_job(self) -> GenerateJob:
        req = self.req
        generator = torch.Generator(device=self.server.engine.model.embed.weight.device).manual_seed(self.seed)
        sampling = Sampling(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, generator=generator)
        self.job = GenerateJob(self.prompt, req.max_tokens, sampling, req.stop,
                               on_bytes=lambda piece: self._call(self._piece, piece),
                               on_done=lambda g: self._call(self._settle, g, None),
                               on_error=lambda message: self._call(self._settle, None, message))
        return self.job

    def forward_to(self, sink: asyncio.Queue) -> None:
        self.sink = sink

    def _piece(self, piece: bytes) -> None:
        if self.sink is not None:
            self.sink.put_nowait((self, "bytes", piece))

    def _settle(self, generation: Generation | None, message: str | None) -> None:
        if self.done.done():
            return
        if message is not None:
            self.done.set_exception(ApiError(500, message))
        else:
            self.generation = generation
            self.done.set_result(generation)
        if self.sink is not None:
            self.sink.put_nowait((self, "done", None))

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()

    def abort(self, error: ApiError) -> None:
        """End the choice now with this error, its job cancelled (the server is stopping)."""
        self.aborted = True
        self.cancel()
        for future in (self.done, self.scored):
            if future is not None and not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: a request that ends at another choice's error never awaits it
                if future is self.done and self.sink is not None:
                    self.sink.put_nowait((self, "done", None))

    async def finish(self) -> dict:
        """The choice's body, once its generation (and, when asked, its scoring) is done."""
        generation = await self.done
        req = self.req
        out = trim_stop(generation.output, req.stop, generation.stats.stopped_by)
        self.completion_bytes = len(out)
        text = (self.prompt_text() if req.echo else "") + out.decode("utf-8", "replace")
        logprobs = None
        if req.logprobs is not None:
            logprobs = await self._logprobs(out)
        return {"index": self.index, "text": text, "logprobs": logprobs,
                "finish_reason": finish_reason(generation.stats.stopped_by)}

    async def _logprobs(self, out: bytes) -> dict:
        req, prompt = self.req, self.prompt
        scored: asyncio.Future = self.loop.create_future()
        self.scored = scored

        def settle(result, message):
            if not scored.done():
                scored.set_exception(ApiError(500, message)) if message else scored.set_result(result)

        self.job = ScoreJob([prompt + out], req.logprobs, on_done=lambda r: self._call(settle, r, None),
                            on_error=lambda m: self._call(settle, None, m))
        _submit(self.server.engine, [self.job], follow_up=True)  # the request is in already: never refused for room
        result = (await scored)[0]
        first = 0 if req.echo else len(prompt)
        ids = list((prompt + out)[first:])
        values: list[float | None] = result.logprobs[first:]
        top: list = [list(t) for t in result.top[first:]]
        text = (prompt if req.echo else b"") + out
        if req.echo and req.leading_eos[self.p]:  # the EOS the client sent first: no prediction
            ids, values, top = [EOS] + ids, [None] + values, [None] + top
        return logprobs_body(ids, values, top, text=text)


def _submit(engine: Engine, jobs: list, *, follow_up: bool = False) -> None:
    try:
        engine.submit(*jobs, follow_up=follow_up)
    except QueueFull as e:
        raise ApiError(503, f"the server is busy: {e}; try again later") from None


def _seed(seed: int | None, j: int) -> int:
    """Choice j's seed: the request's plus j, kept within a generator's 64 bits."""
    if seed is None:
        return secrets.randbelow(2 ** 62)
    return seed + j - (2 ** 64 if seed + j > SEED_RANGE[1] else 0)


def _usage(req: Completion, runs: list[_Run]) -> dict:
    prompt = sum(len(p) + lead for p, lead in zip(req.prompts, req.leading_eos))
    completion = sum(run.completion_bytes for run in runs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _json(request: web.Request) -> Any:
    try:
        return json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not JSON: {e}") from None


OPEN_ROUTES = frozenset({"/health", "/tokenizer_info", "/tokenize", "/detokenize"})  # no API key needed


def _bearer(keys: tuple[str, ...]):
    """The middleware that lets in only requests with one of the keys (see the module docstring)."""

    @web.middleware
    async def check(request: web.Request, handler) -> web.StreamResponse:
        route = request.match_info.route.resource
        if route is not None and route.canonical in OPEN_ROUTES:
            return await handler(request)
        header = request.headers.get("Authorization")
        if authorized(header, keys):
            return await handler(request)
        message = ("this server needs an API key: send it as 'Authorization: Bearer KEY'" if not header else
                   "the API key is not valid (expected 'Authorization: Bearer KEY' with a key this server accepts)")
        return web.json_response(error_body(401, message, kind="invalid_request_error", code="invalid_api_key"),
                                 status=401, headers={"WWW-Authenticate": "Bearer"})

    return check


@web.middleware
async def _errors(request: web.Request, handler) -> web.StreamResponse:
    """Every refusal and fault as an OpenAI-style JSON error body."""
    try:
        return await handler(request)
    except ApiError as e:
        return web.json_response(error_body(e.status, e.message, kind=e.kind, param=e.param), status=e.status)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        kind = "invalid_request_error" if e.status < 500 else "server_error"
        return web.json_response(error_body(e.status, e.reason or "error", kind=kind), status=e.status)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as e:
        log.exception("request failed")
        return web.json_response(error_body(500, f"{type(e).__name__}: {e}", kind="server_error"), status=500)


class Running:
    """A server on a background thread (tests, benchmarks, notebooks): `url` once started."""

    def __init__(self, server: Server, *, host: str = "127.0.0.1", port: int = 0):
        self.server, self.host, self.port = server, host, port
        self.url = ""
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, name="bytemtp-http", daemon=True)

    def _main(self) -> None:
        self._loop = asyncio.new_event_loop()
        runner = web.AppRunner(self.server.app(), handler_cancellation=True, access_log=None)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, self.host, self.port)
        self._loop.run_until_complete(site.start())
        port = runner.addresses[0][1]
        self.url = f"http://{self.host}:{port}"
        self._stop = asyncio.Event()
        self._started.set()
        self._loop.run_until_complete(self._stop.wait())
        self._loop.run_until_complete(runner.cleanup())
        self._loop.close()

    def __enter__(self) -> Running:
        self.server.engine.start() if self.server.engine._thread is None else None
        self._thread.start()
        self._started.wait(30)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        self.server.engine.close()


class ListenError(Exception):
    """The server cannot listen where it was asked to (one line: the address and why)."""


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port (port 0: any free port), made before the model loads, so
    that a port in use or an address not on this host fails at once (`ListenError`); `serve`
    serves on it. Connections made while the model loads wait until it serves."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise ListenError(f"cannot listen on {where}: unknown host ({e.strerror})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart while old connections linger
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        reason = {errno.EADDRINUSE: "address already in use",
                  errno.EADDRNOTAVAIL: "the address is not on this host",
                  errno.EACCES: "permission denied (ports below 1024 need privileges)"}.get(e.errno)
        raise ListenError(f"cannot listen on {where}: {reason or e.strerror or e}") from None
    return sock


def serve(server: Server, *, sock: socket.socket | None = None, host: str = "127.0.0.1", port: int = 0,
          shutdown_timeout: float = 5.0, announce=lambda url: None, say=lambda line: None) -> None:
    """Serve on `sock` (from `listen`; without it, listen on host:port now) until SIGTERM or Ctrl-C,
    then stop within `shutdown_timeout` seconds (see the module docstring): the requests in flight
    finish meanwhile, or end with an error a little before it is over; a second signal ends them
    at once. `announce(url)` once serving (with port 0, on the port the system chose); `say(line)`
    tells what stopping does."""
    sock = sock or listen(host, port)
    margin = min(1.0, shutdown_timeout / 4)  # to end what is still open and close the connections

    async def main() -> None:
        runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None,
                               shutdown_timeout=margin / 4)  # per connection, twice at most
        await runner.setup()
        site = web.SockSite(runner, sock)
        await site.start()
        bound = sock.getsockname()
        announce(f"http://{f'[{bound[0]}]' if ':' in bound[0] else bound[0]}:{bound[1]}")
        signals: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, signals.put_nowait, sig)
        try:
            await signals.get()
            server.stopping = True
            await site.stop()  # no new connections; new requests on open ones get 503
            if server._open:
                say(f"stopping: {len(server._open)} requests in flight may finish within "
                    f"{shutdown_timeout - margin:g} s (a second signal ends them now)")
            drained = asyncio.ensure_future(server.drained())
            second = asyncio.ensure_future(signals.get())
            await asyncio.wait([drained, second], timeout=shutdown_timeout - margin,
                               return_when=asyncio.FIRST_COMPLETED)
            if not drained.done():
                say(f"stopping: {len(server._open)} requests still in flight end with an error")
                server.abort("the server is shutting down")
                await asyncio.wait([drained], timeout=margin / 2)  # their error events and [DONE] go out
            drained.cancel()
            second.cancel()
        finally:
            await runner.cleanup()

    asyncio.run(main())
