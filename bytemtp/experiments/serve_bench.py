"""The server's benchmark (`bench serve`): streaming clients against `bytemtp serve` on loopback,
in this process, each completion checked against its prompt decoded alone; `ServeSpeed` (a frozen
dataclass) is what `bench serve --json` writes, key for key and in order (`to_json`, `from_json`).
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time

import torch

from bytemtp.decoding import decode
from bytemtp.decoding.strategy import Draft
from bytemtp.evaluation.evaluate import evaluate, held_out_split, val_continuations
from bytemtp.runtime.checkpoint import load_model


@dataclasses.dataclass(frozen=True)
class LoadFigures:
    """One load of streaming clients, in the figures of `serving.load.LoadReport.to_json`."""
    clients: int
    wall_s: float
    completions: int
    bytes_out: int
    bytes_per_s: float  # over all clients
    ttfb_p50_s: float  # time to the first byte
    ttfb_p95_s: float
    mismatches: int  # completions that differ from the prompt decoded alone
    errors: int


@dataclasses.dataclass(frozen=True)
class ServeCase:
    """One count of clients over the rounds (`serve_speed`)."""
    runs: list[LoadFigures]  # one a round
    bytes_per_s: float  # median over the rounds
    ratio: float  # bytes a second over the first count's in the same round: median, min, max
    ratio_min: float
    ratio_max: float
    ttfb_p50_s: float  # medians over the rounds
    ttfb_p95_s: float
    mismatches: int  # summed over the rounds
    errors: int

    @classmethod
    def from_json(cls, data: dict) -> ServeCase:
        return cls(**{**data, "runs": [LoadFigures(**r) for r in data["runs"]]})


@dataclasses.dataclass(frozen=True)
class ServeLoad(LoadFigures):
    """The timed load after the rounds, and the process's memory around it (MB)."""
    rss_mb_before: float
    rss_mb_after: float
    rss_mb_settled_min_max: list[float]  # after the first quarter of the load
    rss_mb_samples: list[list[float]]  # [seconds, MB] every few seconds
    engine_requests: int
    engine_errors: int


@dataclasses.dataclass(frozen=True)
class ServeSpeed:
    """Streaming clients against `bytemtp serve` on loopback (`serve_speed`)."""
    ckpt: str
    device: str
    prompts: int
    max_bytes: int
    rounds: int
    draft: str  # the server's draft, by its name
    max_batch: int  # the engine's
    cases: dict[int, ServeCase]  # by count of clients, the first the baseline
    load: ServeLoad | None  # None: no timed load asked for
    mean_batch: float  # the engine's rows a pass, over the whole run
    bytes_per_row_pass: float
    val_bpb: float | None  # the model's held-out bits per byte, next-byte head (None: not evaluated)

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        if self.load is None:
            del out["load"]
        return out

    @classmethod
    def from_json(cls, data: dict) -> ServeSpeed:
        load = data.get("load")
        return cls(**{**data, "cases": {int(n): ServeCase.from_json(c) for n, c in data["cases"].items()},
                      "load": None if load is None else ServeLoad(**load)})


def _rss_mb() -> float:
    """This process's resident memory, MB (Linux; NaN elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration, ValueError):
        return float("nan")


def serve_speed(ckpt: str, *, clients=(1, 8), n_prompts: int = 16, prompt_bytes: int = 128, max_bytes: int = 256,
                rounds: int = 3, load_s: float = 0.0, load_clients: int = 16, draft: Draft = Draft(lookup=True),
                device: str = "cpu", eval_batches: int = 10, progress=None) -> ServeSpeed:
    """Streaming clients against `bytemtp serve` on loopback, in this process: for each count of
    clients, every held-out prompt streamed once (the prompts shared out among the clients, each
    client's in turn), in interleaved rounds; bytes a second over all clients, the ratio to the
    first count in the same round, time to first byte, and every completion checked against that
    prompt decoded alone (plain greedy). With `load_s`, then `load_clients` clients stream for
    that long, and the process's memory is read before and after."""
    from bytemtp.serving.app import Running, Server
    from bytemtp.serving.engine import Engine
    from bytemtp.serving.load import run_load

    say = progress or (lambda line: None)
    dev = torch.device(device)
    model, cfg = load_model(ckpt, device=dev)
    pairs = val_continuations(cfg.data.path, n=n_prompts, prompt_bytes=prompt_bytes, continuation_bytes=max_bytes)
    prompts = [p for p, _ in pairs]
    say(f"decoding {len(prompts)} prompts alone (plain greedy), the reference")
    expected = [decode.generate(model, p, max_bytes=max_bytes).output.decode("utf-8", "replace") for p in prompts]
    engine = Engine(model, max_batch=max(*clients, load_clients if load_s else 1), max_queue=4 * load_clients,
                    draft=draft)
    engine.start(progress=say)
    cases, figures = {}, None
    with Running(Server(engine, model_name="bench")) as server:
        def load(n, **kw):
            return run_load(server.url, model="bench", prompts=prompts, expected=expected, clients=n,
                            max_tokens=max_bytes, **kw)

        say("warm-up")
        load(max(clients), per_client=1)
        by_count: dict[int, list[LoadFigures]] = {n: [] for n in clients}
        for r in range(rounds):
            for n in clients:
                say(f"round {r + 1}: {n} clients")
                by_count[n].append(LoadFigures(**load(n, per_client=-(-len(prompts) // n)).to_json()))
        for n, runs in by_count.items():
            ratios = [a.bytes_per_s / b.bytes_per_s for a, b in zip(runs, by_count[clients[0]])]
            cases[n] = ServeCase(runs=runs, bytes_per_s=statistics.median(x.bytes_per_s for x in runs),
                                 ratio=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios),
                                 ttfb_p50_s=statistics.median(x.ttfb_p50_s for x in runs),
                                 ttfb_p95_s=statistics.median(x.ttfb_p95_s for x in runs),
                                 mismatches=sum(x.mismatches for x in runs), errors=sum(x.errors for x in runs))
        if load_s:
            say(f"load: {load_clients} clients for {load_s:.0f} s")
            rss, done = [(0.0, _rss_mb())], threading.Event()
            t0 = time.perf_counter()

            def sample() -> None:  # the memory every few seconds while the load runs
                while not done.wait(min(5.0, load_s / 10)):
                    rss.append((time.perf_counter() - t0, _rss_mb()))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            report = load(load_clients, duration_s=load_s)
            done.set()
            sampler.join()
            rss.append((time.perf_counter() - t0, _rss_mb()))
            settled = [mb for t, mb in rss if t >= load_s / 4] or [rss[-1][1]]  # after the first quarter
            figures = ServeLoad(**report.to_json(), rss_mb_before=round(rss[0][1], 1),
                                rss_mb_after=round(rss[-1][1], 1),
                                rss_mb_settled_min_max=[round(min(settled), 1), round(max(settled), 1)],
                                rss_mb_samples=[[round(t, 1), round(mb, 1)] for t, mb in rss],
                                engine_requests=engine.stats.requests, engine_errors=engine.stats.errors)
        mean_batch = round(engine.stats.mean_batch, 2)
        bytes_per_row_pass = round(engine.stats.bytes_out / max(1, engine.stats.rows_in_passes), 3)
    ev = (evaluate(model, cfg.data.path, split=held_out_split(cfg.data.path), batches=eval_batches, device=dev)
          if eval_batches else None)
    return ServeSpeed(ckpt=str(ckpt), device=str(dev), prompts=len(prompts), max_bytes=max_bytes, rounds=rounds,
                      draft=str(draft), max_batch=engine.max_batch, cases=cases, load=figures, mean_batch=mean_batch,
                      bytes_per_row_pass=bytes_per_row_pass, val_bpb=ev.bpb[0] if ev else None)
