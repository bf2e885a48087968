"""Load on a server, from clients that stream over HTTP, and what they saw: `bytemtp bench serve`.

Each client is an asyncio task on an aiohttp session, streaming greedy completions of the prompts
it is given one after another, as a user's client would. Each completion is checked against the
output that prompt must have (decoded alone, beforehand): a byte lost, duplicated or changed on
its way through the batch or the stream counts as a mismatch, an HTTP or stream fault as an
error. Figures: bytes a second over all clients (wall time of the whole load), time to the first
byte (p50, p95) and to the end of each completion. Prompts are sent as byte ids, so any bytes
travel exactly; outputs are compared as the text the server writes (U+FFFD for invalid UTF-8).

A mixed load (`malformed`, a fraction) sends that share of its requests malformed, from a rotating
set of bad bodies (`MALFORMED`: bad JSON, a NaN temperature, a seed past 64 bits, an unknown field,
wrong types, a thousand stop strings, no prompt, ...), each of which a server must
refuse with a 4xx JSON error while the good completions beside them go on unharmed: the answers
are counted by kind, status and error type, and every 5xx (a refusal's, or a good request's, in
its status or in an error event of its stream) counts as a server error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import statistics
import time

import aiohttp


@dataclasses.dataclass
class Completed:
    client: int
    prompt: int
    text: str
    ttfb_s: float
    total_s: float
    bytes_out: int  # completion bytes by the server's usage count
    error: str = ""
    status: int = 200  # the HTTP status, or an error event's code


@dataclasses.dataclass
class Refused:
    """What a server answered to one malformed request."""
    kind: str  # its name in MALFORMED
    status: int  # 0: no answer in time (a hang) or the connection dropped
    error_type: str  # the JSON error's type; "accepted" for a 2xx, "not-json", or the client's fault


class ServerSaid(RuntimeError):
    """A server's error for a good request: its status (or an error event's code) and message."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message[:200]}")
        self.status = status


def _body(**fields) -> bytes:
    return json.dumps({"prompt": "a", "max_tokens": 4, "temperature": 0, **fields}).encode()


# a rotating set of bodies that a server must refuse (4xx), each small enough to cost little if taken
MALFORMED: dict[str, bytes] = {
    "bad-json": b'{"prompt": "a", "max_tokens": 4',
    "not-utf8": b'\xff\xfe{"prompt": "a"}',
    "not-an-object": b"[1, 2, 3]",
    "nan-temperature": b'{"prompt": "a", "max_tokens": 4, "temperature": NaN}',
    "infinite-top-p": b'{"prompt": "a", "max_tokens": 4, "temperature": 1, "top_p": Infinity}',
    "huge-seed": _body(temperature=1, seed=2 ** 70),
    "unknown-field": _body(frobnicate=1),
    "wrong-types": b'{"prompt": 5, "max_tokens": "many"}',
    "many-stops": _body(stop=[f"stop {i}" for i in range(1000)]),
    "no-prompt": b'{"max_tokens": 4}',
    "id-past-a-byte": _body(prompt=[97, 300]),
    "negative-max-tokens": _body(max_tokens=-1),
    "other-model": _body(model="no-such-model"),
    "stream-bad-n": _body(stream=True, n=0),
}


@dataclasses.dataclass
class LoadReport:
    clients: int
    wall_s: float
    completions: list[Completed]
    mismatches: int
    errors: int
    refused: list[Refused] = dataclasses.field(default_factory=list)  # the malformed requests' answers

    @property
    def server_errors(self) -> int:
        """5xx answers, to good and malformed requests alike."""
        return sum(c.status >= 500 for c in self.completions) + sum(r.status >= 500 for r in self.refused)

    def by_kind(self) -> dict[str, dict[str, int]]:
        """For each malformed kind sent: how many got each answer ("400 invalid_request_error", ...)."""
        out: dict[str, dict[str, int]] = {}
        for r in self.refused:
            answer = f"{r.status} {r.error_type}" if r.status else r.error_type
            out.setdefault(r.kind, {})[answer] = out.get(r.kind, {}).get(answer, 0) + 1
        return {kind: dict(sorted(answers.items())) for kind, answers in sorted(out.items())}

    @property
    def bytes_out(self) -> int:
        return sum(c.bytes_out for c in self.completions)

    @property
    def bytes_per_s(self) -> float:
        return self.bytes_out / self.wall_s

    def to_json(self) -> dict:
        ttfb = sorted(c.ttfb_s for c in self.completions if not c.error)
        return {"clients": self.clients, "wall_s": round(self.wall_s, 3), "completions": len(self.completions),
                "bytes_out": self.bytes_out, "bytes_per_s": round(self.bytes_per_s, 1),
                "ttfb_p50_s": round(_quantile(ttfb, 0.5), 4), "ttfb_p95_s": round(_quantile(ttfb, 0.95), 4),
                "mismatches": self.mismatches, "errors": self.errors,
                **({"malformed_sent": len(self.refused), "server_errors": self.server_errors,
                    "malformed_by_kind": self.by_kind()} if self.refused else {})}


def _quantile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[min(98, max(0, round(q * 100) - 1))]


async def stream_completion(session: aiohttp.ClientSession, url: str, *, model: str, prompt: bytes,
                            max_tokens: int) -> tuple[str, float, float, int]:
    """One streamed greedy completion: its text, seconds to the first text and to the end, and
    the completion bytes the server counted (its usage chunk)."""
    body = {"model": model, "prompt": list(prompt), "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first, pieces, usage, done = None, [], None, False
    async with session.post(f"{url}/v1/completions", json=body) as response:
        if response.status != 200:
            raise ServerSaid(response.status, await response.text())
        async for line in response.content:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                code = chunk["error"].get("code")  # the HTTP status the error would have had
                status = code if isinstance(code, int) else 500 * (chunk["error"].get("type") == "server_error")
                raise ServerSaid(status, chunk["error"].get("message", ""))
            for choice in chunk["choices"]:
                if choice["text"]:
                    first = first or time.perf_counter()
                    pieces.append(choice["text"])
            usage = chunk.get("usage") or usage
    if not done:
        raise RuntimeError("the stream ended without [DONE]")
    end = time.perf_counter()
    return "".join(pieces), (first or end) - t0, end - t0, (usage or {}).get("completion_tokens", 0)


async def send_malformed(session: aiohttp.ClientSession, url: str, kind: str, *, timeout_s: float) -> Refused:
    """One malformed request (`MALFORMED[kind]`) and what the server answered: its status and the
    error type of its JSON body; status 0 when no answer came within `timeout_s` (a hang)."""
    try:
        async with session.post(f"{url}/v1/completions", data=MALFORMED[kind],
                                headers={"Content-Type": "application/json"},
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            text = await response.read()
            if response.status < 400:
                return Refused(kind, response.status, "accepted")
            try:
                return Refused(kind, response.status, str(json.loads(text)["error"]["type"]))
            except (ValueError, KeyError, TypeError):
                return Refused(kind, response.status, "not-json")
    except asyncio.TimeoutError:
        return Refused(kind, 0, "no answer (timeout)")
    except aiohttp.ClientError as e:
        return Refused(kind, 0, type(e).__name__)


class _Mix:
    """Which requests of a load are malformed: request i (counted over all clients) is when
    floor((i + 1) * fraction) passes floor(i * fraction), so the share is exact, and the kinds
    come in turn."""

    def __init__(self, fraction: float):
        self.fraction, self.count = fraction, itertools.count()

    def next_kind(self) -> str | None:
        i = next(self.count)
        m = int(i * self.fraction)
        if int((i + 1) * self.fraction) == m:
            return None
        return list(MALFORMED)[m % len(MALFORMED)]


async def _client(session, url: str, *, model: str, client: int, prompts: list[bytes], order: list[int],
                  max_tokens: int, until: float | None, out: list[Completed], mix: _Mix | None = None,
                  refused: list[Refused] | None = None, refusal_timeout_s: float = 10.0) -> None:
    k = 0
    while k < len(order) or until is not None and time.perf_counter() < until:
        kind = mix.next_kind() if mix is not None else None
        if kind is not None:  # a malformed request takes this turn
            refused.append(await send_malformed(session, url, kind, timeout_s=refusal_timeout_s))
            continue
        p = order[k % len(order)]
        k += 1
        try:
            text, ttfb, total, n = await stream_completion(session, url, model=model, prompt=prompts[p],
                                                           max_tokens=max_tokens)
            out.append(Completed(client, p, text, ttfb, total, n))
        except Exception as e:  # counted, never raised: the load goes on
            out.append(Completed(client, p, "", 0.0, 0.0, 0, error=f"{type(e).__name__}: {e}",
                                 status=getattr(e, "status", 0)))
        if until is None and k >= len(order):
            break


def run_load(url: str, *, model: str, prompts: list[bytes], expected: list[str], clients: int,
             max_tokens: int, per_client: int = 1, duration_s: float | None = None, malformed: float = 0.0,
             refusal_timeout_s: float = 10.0) -> LoadReport:
    """`clients` clients at once, each streaming `per_client` completions (or, with `duration_s`,
    completions until that time is up), client c starting at prompt c; every completion checked
    against `expected` (the text each prompt must give). With `malformed` (a fraction below 1),
    that share of the requests are malformed ones (`MALFORMED`, in turn) in place of completions,
    each given `refusal_timeout_s` to be answered."""
    if not 0.0 <= malformed < 1.0:
        raise ValueError(f"malformed={malformed} is not allowed; expected a fraction 0 <= malformed < 1")
    mix, refused = (_Mix(malformed) if malformed else None), []

    async def main() -> tuple[list[Completed], float]:
        out: list[Completed] = []
        until = None if duration_s is None else time.perf_counter() + duration_s
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            t0 = time.perf_counter()
            await asyncio.gather(*[
                _client(session, url, model=model, client=c, prompts=prompts, max_tokens=max_tokens, until=until,
                        order=[(c + i) % len(prompts) for i in range(per_client)], out=out, mix=mix,
                        refused=refused, refusal_timeout_s=refusal_timeout_s)
                for c in range(clients)])
            return out, time.perf_counter() - t0

    completions, wall = asyncio.run(main())
    mismatches = sum(1 for c in completions if not c.error and c.text != expected[c.prompt])
    errors = sum(1 for c in completions if c.error)
    return LoadReport(clients, wall, completions, mismatches, errors, refused)
