"""Load on a server, from clients that stream over HTTP, and what they saw: `bytemtp bench serve`.

Each client is an asyncio task on an aiohttp session, streaming greedy completions of the prompts
it is given one after another, as a user's client would. Each completion is checked against the
output that prompt must have (decoded alone, beforehand): a byte lost, duplicated or changed on
its way through the batch or the stream counts as a mismatch, an HTTP or stream fault as an
error. Figures: bytes a second over all clients (wall time of the whole load), time to the first
byte (p50, p95) and to the end of each completion. Prompts are sent as byte ids, so any bytes
travel exactly; outputs are compared as the text the server writes (U+FFFD for invalid UTF-8).
"""

from __future__ import annotations

import asyncio
import dataclasses
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


@dataclasses.dataclass
class LoadReport:
    clients: int
    wall_s: float
    completions: list[Completed]
    mismatches: int
    errors: int

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
                "mismatches": self.mismatches, "errors": self.errors}


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
    first, pieces, usage = None, [], None
    async with session.post(f"{url}/v1/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:200]}")
        async for line in response.content:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            for choice in chunk["choices"]:
                if choice["text"]:
                    first = first or time.perf_counter()
                    pieces.append(choice["text"])
            usage = chunk.get("usage") or usage
    end = time.perf_counter()
    return "".join(pieces), (first or end) - t0, end - t0, (usage or {}).get("completion_tokens", 0)


async def _client(session, url: str, *, model: str, client: int, prompts: list[bytes], order: list[int],
                  max_tokens: int, until: float | None, out: list[Completed]) -> None:
    k = 0
    while k < len(order) or until is not None and time.perf_counter() < until:
        p = order[k % len(order)]
        k += 1
        try:
            text, ttfb, total, n = await stream_completion(session, url, model=model, prompt=prompts[p],
                                                           max_tokens=max_tokens)
            out.append(Completed(client, p, text, ttfb, total, n))
        except Exception as e:  # counted, never raised: the load goes on
            out.append(Completed(client, p, "", 0.0, 0.0, 0, error=f"{type(e).__name__}: {e}"))
        if until is None and k >= len(order):
            break


def run_load(url: str, *, model: str, prompts: list[bytes], expected: list[str], clients: int,
             max_tokens: int, per_client: int = 1, duration_s: float | None = None) -> LoadReport:
    """`clients` clients at once, each streaming `per_client` completions (or, with `duration_s`,
    completions until that time is up), client c starting at prompt c; every completion checked
    against `expected` (the text each prompt must give)."""
    async def main() -> tuple[list[Completed], float]:
        out: list[Completed] = []
        until = None if duration_s is None else time.perf_counter() + duration_s
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            t0 = time.perf_counter()
            await asyncio.gather(*[
                _client(session, url, model=model, client=c, prompts=prompts, max_tokens=max_tokens, until=until,
                        order=[(c + i) % len(prompts) for i in range(per_client)], out=out)
                for c in range(clients)])
            return out, time.perf_counter() - t0

    completions, wall = asyncio.run(main())
    mismatches = sum(1 for c in completions if not c.error and c.text != expected[c.prompt])
    errors = sum(1 for c in completions if c.error)
    return LoadReport(clients, wall, completions, mismatches, errors)
