"""The server's benchmark (`bench serve`): streaming clients against `bytemtp serve` on loopback,
in this process, each completion checked against its prompt decoded alone, and (`vs_plain`) the
same loads against a second server on the same model that decodes plainly, on the same step, so
that the draft's worth is a ratio within one run; `ServeSpeed` (a frozen dataclass) is what `bench
serve --json` writes, key for key and in order (`to_json`, `from_json`), and its `table` what the
command prints. A ratio over the rounds is a `Spread` (median and range), flat in the JSON (`ratio`,
`ratio_min`, `ratio_max`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import threading
import time

import torch

from bytemtp.decoding import decode
from bytemtp.decoding.compiled import Compile
from bytemtp.decoding.generation import load_prompts
from bytemtp.decoding.strategy import Draft
from bytemtp.data.splits import val_continuations
from bytemtp.experiments.bench import EVAL_BATCHES, held_out_bpb, held_out_clause
from bytemtp.runtime.checkpoint import load_model
from bytemtp.spread import Spread
from bytemtp.tables import table


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
    ratio: Spread  # bytes a second over the first count's in the same round: median and range
    ttfb_p50_s: float  # medians over the rounds
    ttfb_p95_s: float
    mismatches: int  # summed over the rounds
    errors: int
    # the plain server's loads of the same rounds (None: no plain arm, or JSON written before it)
    plain_runs: list[LoadFigures] | None = None
    plain_bytes_per_s: float | None = None  # median over the rounds
    over_plain: Spread | None = None  # bytes a second, draft over plain in the same round: median and range
    plain_mismatches: int | None = None  # summed over the rounds
    plain_errors: int | None = None

    def to_json(self) -> dict:
        """The case, its ratios flat (`ratio`, `ratio_min`, `ratio_max`, and `over_plain`'s); the
        plain server's figures only where it ran (the keys of before)."""
        out = {"runs": [dataclasses.asdict(r) for r in self.runs], "bytes_per_s": self.bytes_per_s,
               **self.ratio.flat("ratio"), "ttfb_p50_s": self.ttfb_p50_s, "ttfb_p95_s": self.ttfb_p95_s,
               "mismatches": self.mismatches, "errors": self.errors}
        if self.plain_runs is not None:
            out.update(plain_runs=[dataclasses.asdict(r) for r in self.plain_runs],
                       plain_bytes_per_s=self.plain_bytes_per_s, **self.over_plain.flat("over_plain"),
                       plain_mismatches=self.plain_mismatches, plain_errors=self.plain_errors)
        return out

    @classmethod
    def from_json(cls, data: dict) -> ServeCase:
        plain = data.get("plain_runs")
        given = {k: v for k, v in data.items() if not k.startswith(("ratio", "over_plain"))}
        return cls(**{**given, "runs": [LoadFigures(**r) for r in data["runs"]],
                      "ratio": Spread.from_flat(data, "ratio"),
                      "plain_runs": None if plain is None else [LoadFigures(**r) for r in plain],
                      "over_plain": Spread.from_flat(data, "over_plain") if "over_plain" in data else None})

    @classmethod
    def of(cls, runs: list[LoadFigures], base: list[LoadFigures], plain: list[LoadFigures] | None) -> ServeCase:
        """The case of these rounds' loads, `base` the first count's (the ratio's), `plain` the plain
        server's of the same rounds (or None)."""
        def speeds(loads: list[LoadFigures]) -> list[float]:
            return [x.bytes_per_s for x in loads]

        figures = {}
        if plain is not None:
            figures = dict(plain_runs=plain, plain_bytes_per_s=statistics.median(speeds(plain)),
                           over_plain=Spread.ratios(speeds(runs), speeds(plain)),
                           plain_mismatches=sum(x.mismatches for x in plain), plain_errors=sum(x.errors for x in plain))
        return cls(runs=runs, bytes_per_s=statistics.median(speeds(runs)),
                   ratio=Spread.ratios(speeds(runs), speeds(base)),
                   ttfb_p50_s=statistics.median(x.ttfb_p50_s for x in runs),
                   ttfb_p95_s=statistics.median(x.ttfb_p95_s for x in runs),
                   mismatches=sum(x.mismatches for x in runs), errors=sum(x.errors for x in runs), **figures)


@dataclasses.dataclass(frozen=True)
class ServeLoad(LoadFigures):
    """The timed load after the rounds, and the process's memory around it (MB)."""
    rss_mb_before: float
    rss_mb_after: float
    rss_mb_settled_min_max: list[float]  # after the first quarter of the load
    rss_mb_samples: list[list[float]]  # [seconds, MB] every few seconds
    engine_requests: int
    engine_errors: int
    # a mixed load (`malformed` > 0; JSON written before it reads back with these defaults)
    malformed: float = 0.0  # the share of the requests sent malformed
    malformed_sent: int = 0
    server_errors: int = 0  # 5xx answers (and error events of code 5xx), good and malformed requests alike
    malformed_by_kind: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)  # kind -> answer -> count
    rss_mb_first_quarter: float | None = None  # at the end of the first quarter of the load, against rss_mb_after

    def lines(self) -> list[str]:
        """The load, its memory, and a mixed load's answers by kind, as `bench serve` prints them."""
        lines = [f"load: {self.clients} clients for {self.wall_s:.0f} s: {self.completions} completions, "
                 f"{self.bytes_out} bytes ({self.bytes_per_s:.0f}/s), {self.mismatches} mismatches, {self.errors} "
                 f"errors; memory {self.rss_mb_before:.0f} -> {self.rss_mb_after:.0f} MB (after the first quarter "
                 f"{self.rss_mb_settled_min_max[0]:.0f}-{self.rss_mb_settled_min_max[1]:.0f} MB; at the end of the "
                 f"first quarter {self.rss_mb_first_quarter:.0f} MB, at the end {self.rss_mb_after:.0f} MB)"]
        if self.malformed:
            lines.append(f"malformed: {self.malformed_sent} of the requests ({self.malformed:.0%} asked), answered "
                         f"by kind (status and error type); server errors (5xx): {self.server_errors}")
            lines.append(table([(kind, sum(answers.values()), ", ".join(f"{n} x {a}" for a, n in answers.items()))
                                for kind, answers in self.malformed_by_kind.items()], ("kind", "sent", "answers")))
        return lines


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
    val_bpb: float | None  # head 1's held-out bits/byte on `bytemtp eval`'s bytes, before serving (None: not measured)
    compile: str | None = None  # the compile policy asked for (None: JSON written before it was asked)
    step: str | None = None  # the step both servers ran: "compiled" or "eager" (settled when they started)
    val_bytes: int | None = None  # the val bytes val_bpb is of (None: not measured, or JSON written before)
    dtype: str | None = None  # the model's (None: JSON written before it was asked)

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["cases"] = {n: case.to_json() for n, case in self.cases.items()}
        if self.load is None:
            del out["load"]
        else:  # a load of good requests only, or JSON written before the mixed load: the keys of before
            load = out["load"]
            if not self.load.malformed:
                for key in ("malformed", "malformed_sent", "server_errors", "malformed_by_kind"):
                    del load[key]
            if self.load.rss_mb_first_quarter is None:
                del load["rss_mb_first_quarter"]
        for key in ("compile", "step", "val_bytes", "dtype"):
            if out[key] is None:
                del out[key]
        return out

    def table(self) -> str:
        """What `bench serve` prints: the setting, one row a count of clients (against the plain
        server too where it ran), then the timed load and its memory, and a mixed load's answers."""
        vs_plain = any(c.plain_runs is not None for c in self.cases.values())
        lines = [f"{self.prompts} held-out prompts, {self.max_bytes} bytes each, {self.rounds} interleaved rounds, "
                 f"draft {self.draft}{' against plain' if vs_plain else ''}, max batch {self.max_batch}, "
                 f"{self.device}, {self.step} step (--compile {self.compile})"
                 f"{held_out_clause(self.val_bpb, nbytes=self.val_bytes)}"]
        plain_head = ("plain bytes/s", "draft/plain (spread)") if vs_plain else ()
        checks_head = ("mismatches draft / plain", "errors draft / plain") if vs_plain else ("mismatches", "errors")
        head = ("clients", "bytes/s", f"over {next(iter(self.cases))}", *plain_head, "first byte p50 / p95 ms",
                *checks_head)
        rows = []
        for n, c in self.cases.items():
            plain = (f"{c.plain_bytes_per_s:.0f}", c.over_plain.format()) if vs_plain else ()
            checks = ((f"{c.mismatches} / {c.plain_mismatches}", f"{c.errors} / {c.plain_errors}") if vs_plain
                      else (c.mismatches, c.errors))
            rows.append((n, f"{c.bytes_per_s:.0f}", c.ratio.format(), *plain,
                         f"{c.ttfb_p50_s * 1e3:.0f} / {c.ttfb_p95_s * 1e3:.0f}", *checks))
        lines.append(table(rows, head))
        if self.load is not None:
            lines += self.load.lines()
        return "\n".join(lines)

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


def serve_speed(ckpt: str, *, clients=(1, 8), prompts_path: str | None = None, n_prompts: int = 16,
                prompt_bytes: int = 128, max_bytes: int = 256, rounds: int = 3, load_s: float = 0.0, load_clients: int = 16, malformed: float = 0.0,
                draft: Draft = Draft(lookup=True), eval_batches: int = EVAL_BATCHES,
                vs_plain: bool = True, compile: Compile | str = "off", device: str = "cpu", dtype: str = "float32",
                progress=None) -> ServeSpeed:
    """Streaming clients against `bytemtp serve` on loopback, in this process: for each count of
    clients, every held-out prompt streamed once (the prompts shared out among the clients, each
    client's in turn), in interleaved rounds; bytes a second over all clients, the ratio to the
    first count in the same round, time to first byte, and every completion checked against that
    prompt decoded alone (plain greedy). With `vs_plain`, a second server on the same model
    decodes plainly (`Draft.plain()`) on the same step, and in every round each count's load runs
    against the draft's server and then against the plain one (the same prompts): the draft's
    bytes a second over plain's, round by round. `compile` (auto, on, off: as `serve --compile`)
    is the draft server's policy; the plain server runs the step it settled on. With `load_s`,
    then `load_clients` clients stream for that long against the draft's server, `malformed` of
    their requests malformed ones (`serving.load.MALFORMED`, each of which must get a 4xx), and
    the process's memory (server and clients: one process) is sampled throughout. The prompts are
    the first `n_prompts` of `prompts_path` (`generation.load_prompts`) where given, else cut from
    val documents of the run's corpus (`prompt_bytes` each)."""
    from bytemtp.decoding.decode import Decoder
    from bytemtp.serving.app import Running, Server
    from bytemtp.serving.engine import Engine
    from bytemtp.serving.load import run_load

    say = progress or (lambda line: None)
    dev = torch.device(device)
    model, cfg = load_model(ckpt, device=dev, dtype=dtype, bytes_only="bench serve")
    if prompts_path is not None:
        prompts = load_prompts(prompts_path)[:n_prompts]
    else:
        pairs = val_continuations(cfg.data.path, n=n_prompts, prompt_bytes=prompt_bytes, continuation_bytes=max_bytes)
        prompts = [p for p, _ in pairs]
    held = held_out_bpb(model, cfg.data.path, batches=eval_batches, device=dev)  # before any serving
    say(f"decoding {len(prompts)} prompts alone (plain greedy), the reference")
    expected = [decode.generate(model, p, max_bytes=max_bytes).output.decode("utf-8", "replace") for p in prompts]

    def engine_of(policy: Draft, mode: Compile | str) -> Engine:
        return Engine(model, max_batch=max(*clients, load_clients if load_s else 1), max_queue=4 * load_clients,
                      draft=policy, decoder=Decoder(model, compile=mode))

    engine = engine_of(draft, compile)
    engine.start(progress=say)
    step = "compiled" if engine.static else "eager"
    say(f"the draft's server ({draft}) runs the {step} step")
    figures = None
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(Running(Server(engine, model_name="bench")))
        plain = None
        if vs_plain:  # the same step as the draft's server, settled already
            say("starting the plain server")
            plain_engine = engine_of(Draft.plain(), Compile.ON if engine.static else Compile.OFF)
            plain_engine.start(progress=say)
            plain = stack.enter_context(Running(Server(plain_engine, model_name="bench")))

        def load(n, at=server, **kw):
            return run_load(at.url, model="bench", prompts=prompts, expected=expected, clients=n,
                            max_tokens=max_bytes, **kw)

        cases = _rounds(load, clients=clients, rounds=rounds, prompts=len(prompts), plain=plain, say=say)
        if load_s:
            figures = _timed_load(load, engine, clients=load_clients, load_s=load_s, malformed=malformed, say=say)
        mean_batch = round(engine.stats.mean_batch, 2)
        bytes_per_row_pass = round(engine.stats.bytes_out / max(1, engine.stats.rows_in_passes), 3)
    return ServeSpeed(ckpt=str(ckpt), device=str(dev), prompts=len(prompts), max_bytes=max_bytes, rounds=rounds,
                      draft=str(draft), max_batch=engine.max_batch, cases=cases, load=figures, mean_batch=mean_batch,
                      bytes_per_row_pass=bytes_per_row_pass, val_bpb=held.bpb,
                      compile=Compile.parse(compile).value, step=step, val_bytes=held.bytes, dtype=dtype)


def _rounds(load, *, clients, rounds: int, prompts: int, plain, say) -> dict[int, ServeCase]:
    """After a warm-up, `rounds` interleaved rounds of every count of clients streaming the prompts
    (shared out among them) from the draft's server, each followed by the plain server's (`plain`,
    or None) on the same prompts; the case of each count (`ServeCase.of`). `load(n, at=...)` runs
    one load of n clients against a server (the draft's by default)."""
    say("warm-up")
    load(max(clients), per_client=1)
    if plain is not None:
        load(max(clients), at=plain, per_client=1)
    by_count: dict[int, list[LoadFigures]] = {n: [] for n in clients}
    plain_by_count: dict[int, list[LoadFigures]] = {n: [] for n in clients}
    for r in range(rounds):
        for n in clients:
            say(f"round {r + 1}: {n} clients")
            per_client = -(-prompts // n)
            by_count[n].append(LoadFigures(**load(n, per_client=per_client).to_json()))
            if plain is not None:
                say(f"round {r + 1}: {n} clients, plain")
                plain_by_count[n].append(LoadFigures(**load(n, at=plain, per_client=per_client).to_json()))
    return {n: ServeCase.of(runs, by_count[clients[0]], plain_by_count[n] if plain is not None else None)
            for n, runs in by_count.items()}


def _timed_load(load, engine, *, clients: int, load_s: float, malformed: float, say) -> ServeLoad:
    """`clients` clients streaming for `load_s` seconds against the draft's server (`malformed` of
    their requests malformed ones), the process's memory sampled every few seconds throughout."""
    say(f"load: {clients} clients for {load_s:.0f} s")
    rss, done = [(0.0, _rss_mb())], threading.Event()
    t0 = time.perf_counter()

    def sample() -> None:  # the memory every few seconds while the load runs
        while not done.wait(min(5.0, load_s / 10)):
            rss.append((time.perf_counter() - t0, _rss_mb()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    report = load(clients, duration_s=load_s, malformed=malformed)
    done.set()
    sampler.join()
    rss.append((time.perf_counter() - t0, _rss_mb()))
    settled = [mb for t, mb in rss if t >= load_s / 4] or [rss[-1][1]]  # after the first quarter
    return ServeLoad(**report.to_json(), rss_mb_before=round(rss[0][1], 1), rss_mb_after=round(rss[-1][1], 1),
                     rss_mb_settled_min_max=[round(min(settled), 1), round(max(settled), 1)],
                     rss_mb_samples=[[round(t, 1), round(mb, 1)] for t, mb in rss],
                     engine_requests=engine.stats.requests, engine_errors=engine.stats.errors,
                     malformed=malformed, rss_mb_first_quarter=round(settled[0], 1))
