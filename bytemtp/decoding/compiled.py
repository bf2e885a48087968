"""The static decode step: one decoding pass whose shapes depend only on (batch, heads, nodes),
compiled, so that a pass costs what its arithmetic costs (as in gpt-fast).

An eager pass is about a thousand small PyTorch ops, and on a CPU (or a GPU launching one kernel
per op) most of its time is the framework's, not the arithmetic's. `StaticStep` runs the same
model code with static shapes instead: the cache is the preallocated `KVCache`, whose new keys and
values the step writes by index in its own graph (after every read of the cache: nothing of a
pass but its picks runs outside the graph, so a GPU replays it as one launch); positions and
the mask come from device tensors (`layout.StaticLayout`), so no host number enters the graph;
the nodes of a pass are padded up to a bucket (`NODE_BUCKETS`) and the heads run are rounded up
to a few counts (`head_buckets`), so that ten graphs a batch size (one per bucket of heads and
of at least as many nodes) serve every draft the decoder may choose, each compiled the first time it runs: inductor
on the CPU, with CUDA graphs on a GPU (`mode="reduce-overhead"`). Static sizes, not symbolic
ones: a symbolic graph served every bucket but took ten times longer to trace from a warm cache. Inductor keeps what it compiled on disk (its FX graph cache, under
TORCHINDUCTOR_CACHE_DIR), so a second process compiles the same graphs in a few seconds each; a
record beside it keeps the pass costs measured on the compiled step, so that a second process
neither measures them again nor compiles a shape before the decoder chooses it, and `auto` knows
that the cache is warm. The cache is outside this process's control, so the record is checked
when read (`cached_costs`): one that is unreadable, malformed or written for another machine or
torch counts as absent (the costs are measured again on the step and the record rewritten,
atomically), so no content of the cache can break decoding; the price is that a record moved
between machines is never trusted.

The eager `ByteMTP.logits` path stays the reference: `StaticStep(..., compiled=False)` runs the
static step uncompiled, and the tests compare both with it and with plain decoding.

`Compile` says when decoding uses the compiled step: `on`, `off`, or `auto`: when the work is long
enough to repay compiling (`AUTO_MIN_BYTES` of output), or the step is compiled already (in this
process or, by its record, in the disk cache); `CompilePolicy` applies it for one decoder and
holds the step it made.

Legend: B batch, T nodes (padded to a bucket), K heads run, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import os
import pathlib
import platform
import tempfile
import time

import torch

from bytemtp.decoding.drafting import TREE_RANKS
from bytemtp.decoding.picks import greedy_picks
from bytemtp.model.kvcache import KVCache
from bytemtp.model.layout import build_layout
from bytemtp.model.transfer import batch_to_device, to_device
from bytemtp.vocab import emitted

NODE_BUCKETS = (1, 2, 4, 8, 16)  # nodes a pass is padded to (the last is drafting.MAX_NODES)

# Bytes of output (rows x max_bytes) from which `auto` compiles a step that is not yet in the
# disk cache: about what the eager step decodes in the time that compiling takes (on two CPU
# cores, a minute or two for the `small` model; on a GPU, tens of seconds).
AUTO_MIN_BYTES = {"cpu": 32768, "cuda": 8192}


class Compile(enum.Enum):
    """When decoding runs the compiled static step."""

    AUTO = "auto"  # when the work repays compiling, or the step is compiled already
    ON = "on"
    OFF = "off"

    @classmethod
    def parse(cls, value: Compile | str | bool) -> Compile:
        if isinstance(value, Compile):
            return value
        if isinstance(value, bool):
            return cls.ON if value else cls.OFF
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"compile={value!r} is not allowed; choose auto, on or off") from None


def node_bucket(T: int) -> int:
    """The nodes a pass of T nodes runs as."""
    return next(b for b in NODE_BUCKETS if b >= T)


def head_buckets(n_future: int) -> tuple[int, ...]:
    """The head counts a compiled pass runs (1, 2, 4, ... and all); a pass that needs k heads
    runs the next count up, and the extra heads' logits go unused."""
    return tuple(sorted({min(2 ** i, n_future) for i in range(n_future.bit_length() + 1)}))


def head_bucket(k: int, n_future: int) -> int:
    return next(b for b in head_buckets(n_future) if b >= k)


class StaticStep:
    """One decoding pass of a model with static shapes, compiled per (batch, heads, nodes) shape
    (see the module docstring). `pass_heads` is what the pass runs after the trunk (`ByteMTP.decode_heads`,
    a `PassHeads`): the graph runs its `in_pass`, and `drafts_at` its `after_picks`. Counts what compiling cost: `graphs` compiled and `compile_s`, the
    seconds of the calls that compiled them."""

    def __init__(self, model, pass_heads, *, compiled: bool = True):
        self.model, self.pass_heads, self.compiled = model, pass_heads, compiled
        self.n_future = model.config.n_future
        self.states: torch.Tensor | None = None  # the states of the last pass that `after_picks` reads
        self.device = model.embed.weight.device
        self._fn, self._after = self._pass, pass_heads.after_picks
        if compiled:  # torch.compile compiles a function the first time it runs (never: no graph)
            mode = "reduce-overhead" if self.device.type == "cuda" else None
            self._fn = torch.compile(self._pass, dynamic=False, fullgraph=True, mode=mode)
            self._after = torch.compile(pass_heads.after_picks, dynamic=False, fullgraph=True, mode=mode)
        self._shapes: set[tuple] = set()  # (B, K, T) run so far, and ("drafts", B, K)
        self._plans: dict[tuple, tuple] = {}  # a call's shape and tree -> what its pass passes besides ids and starts
        self._index: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.compile_s, self.graphs = 0.0, 0
        self.last_was_new = False  # whether the last call ran a shape for the first time (compiling it)
        self.allowed = to_device(emitted(model.config.vocab_size), self.device, torch.bool)  # the ids greedy picks may be
        if compiled and self.device.type == "cuda":  # CUDA graphs read it where it is, not a copy a pass
            torch._dynamo.mark_static_address(self.allowed)
        self.picks: torch.Tensor | None = None  # the greedy picks of the last pass (`picks.greedy_picks`)
        self.last_s = 0.0  # seconds of the last call of the step itself (the compiled graph)

    def _pass(self, ids_BT: torch.Tensor, starts_B: torch.Tensor, depths_T: torch.Tensor, see_TT: torch.Tensor,
              cache_k: torch.Tensor, cache_v: torch.Tensor, cache_ids: torch.Tensor, allowed_V: torch.Tensor,
              layers_N11: torch.Tensor, rows_B1: torch.Tensor, nodes_T: torch.Tensor,
              heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What the heads run in a pass (`PassHeads.in_pass`: the logits (B, T, j, V) of its first
        j = graph_heads(heads) heads and the states that `after_picks` reads), with the greedy picks
        at every node (`picks.greedy_picks`) between them; the keys and values of the layers that
        ran are written into the cache's slots after each row's start (`_indices`: their layers,
        the rows and the nodes' offsets), in the graph, after every read of the cache."""
        model = self.model
        cache = _Buffers(cache_k, cache_v, cache_ids)
        layout = build_layout(model, ids_BT, cache, depths=depths_T, ancestors=see_TT, starts_B=starts_B)
        logits, states = self.pass_heads.in_pass(model(ids_BT, cache, layout=layout), layout, cache, k=heads)
        ks = [k if k.dim() == 5 else k[None] for k, _ in layout.written]  # stacked heads: (K, B, H, T, E)
        vs = [v if v.dim() == 5 else v[None] for _, v in layout.written]
        slots = starts_B[:, None] + nodes_T  # (layers, B, L, H, E) views index them as (N, B, T)
        for cache_t, new in ((cache_k, torch.cat(ks)), (cache_v, torch.cat(vs))):
            cache_t.transpose(2, 3)[layers_N11, rows_B1, slots] = new.transpose(2, 3)
        if layout.history is not None:  # the ids, which the n-gram tables of later passes read
            cache_ids[rows_B1, slots] = ids_BT
        return logits, greedy_picks(logits, allowed_V), states

    def _indices(self, B: int, heads: int, padded: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Where a pass's returned keys and values go, made once per shape: their cache layers
        (N, 1, 1) in the order they come (`PassHeads.cache_layers`), the rows (B, 1) and the nodes' offsets from each row's start (padded,)."""
        key = (B, heads, padded)
        if key not in self._index:
            order = self.pass_heads.cache_layers(heads)
            self._index[key] = (to_device(order, self.device)[:, None, None],
                                torch.arange(B, device=self.device)[:, None],
                                torch.arange(padded, device=self.device))
        return self._index[key]

    def _tree(self, T: int, padded: int, depths: tuple[int, ...] | None,
              ancestors: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The depths (padded,) and ancestry (padded, padded) of a pass on the device, padded
        nodes seeing only themselves (made once a call shape and tree: `__call__`'s plans)."""
        see = torch.eye(padded, dtype=torch.bool, device="cpu")
        see[:T, :T] = torch.ones(T, T, device="cpu").tril().bool() if ancestors is None else ancestors
        depth = torch.zeros(padded, dtype=torch.long, device="cpu")
        depth[:T] = torch.arange(T, device="cpu") if depths is None else torch.tensor(depths, device="cpu")
        return batch_to_device(depth, self.device), batch_to_device(see, self.device)

    def __call__(self, ids_BT: torch.Tensor, cache: KVCache, *, heads: int,
                 depths: tuple[int, ...] | None = None, ancestors: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, heads, V) of the T nodes `ids_BT` after each row's cache (a chain, or
        the tree that `depths` and `ancestors` describe, as `Layout` takes them); advances the
        cache like `ByteMTP.logits`."""
        B, T = ids_BT.shape
        # a tree's ancestry is one tensor for its life (`DraftTree.ancestors`), kept alive in its plan
        key = (B, T, heads, depths, None if ancestors is None else id(ancestors))
        plan = self._plans.get(key)
        if plan is None:  # what a pass of this shape and tree passes besides its ids and starts, made once
            K = head_bucket(self.pass_heads.graph_heads(heads), self.n_future)
            padded = node_bucket(max(T, K))  # k heads over fewer nodes run as k nodes: no graph of their own
            plan = self._plans[key] = (K, padded, (B, K, padded), self._tree(T, padded, depths, ancestors),
                                       (self.allowed, *self._indices(B, K, padded), K),
                                       1 + (min(heads, K) - 1) * TREE_RANKS, ancestors)
        K, padded, shape, tree, rest, width, _ = plan
        assert max(cache.lengths) + padded <= cache.max_len, (cache.lengths, padded, cache.max_len)
        if padded > T:
            ids_BT = torch.cat([ids_BT, ids_BT[:, -1:].expand(B, padded - T)], dim=1)
        if self.device.type == "cuda" and not getattr(cache.k, "_static_address", False):
            for t in (cache.k, cache.v, cache.ids):  # CUDA graphs then read the cache where it is, not a copy
                torch._dynamo.mark_static_address(t)
                t._static_address = True
        args = (ids_BT, to_device(cache.lengths, self.device), *tree, cache.k, cache.v, cache.ids, *rest)
        first = shape not in self._shapes
        t0 = time.perf_counter()
        if first and self.compiled:  # a new shape may compile one more graph of the same code
            from torch._dynamo.utils import counters

            graphs = counters["stats"]["unique_graphs"]
            with torch._dynamo.config.patch(recompile_limit=1024, accumulated_recompile_limit=1 << 16):
                logits, picks, states = self._fn(*args)
            if counters["stats"]["unique_graphs"] > graphs:
                self.graphs += counters["stats"]["unique_graphs"] - graphs
                self.compile_s += time.perf_counter() - t0
        else:
            logits, picks, states = self._fn(*args)
        self.last_s = time.perf_counter() - t0
        self._shapes.add(shape)
        self.last_was_new = first
        cache.advance(T)
        if padded > T:
            logits, picks, states = logits[:, :T], picks[:, :T], states[:, :T]
        self.states, self.picks = states, picks if picks.shape[-1] == width else picks[..., :width]
        return logits if heads == logits.shape[2] else logits[:, :, :heads]

    def drafts_at(self, h_BD: torch.Tensor, first_B: torch.Tensor, heads: int) -> torch.Tensor:
        """The logits (N, heads - graph_heads(heads), V) of the heads after the graph's at N nodes
        (a pass's, every row's: `PassHeads.after_picks`), compiled once per node count and head
        bucket (the heads of the bucket run; those up to `heads` are returned); a call that
        compiles marks the step's time as not a cost."""
        K = head_bucket(heads, self.n_future)
        keep = heads - self.pass_heads.graph_heads(heads)
        shape = ("after", h_BD.shape[0], K)
        if shape not in self._shapes:
            self._shapes.add(shape)
            self.last_was_new = True
            with torch._dynamo.config.patch(recompile_limit=1024, accumulated_recompile_limit=1 << 16):
                return self._after(h_BD, first_B, K)[:, :keep]
        return self._after(h_BD, first_B, K)[:, :keep]

    def ready(self, batch_size: int) -> bool:
        """Whether this batch size has run here, or its step is recorded in the disk cache."""
        return (any(shape[0] == batch_size for shape in self._shapes)
                or cached_costs(self.pass_heads, batch_size=batch_size) is not None)

    def stats(self) -> dict:
        """What compiling cost in this process: graphs, seconds, and the disk cache's hits and misses."""
        from torch._dynamo.utils import counters

        inductor = counters["inductor"]
        return {"graphs": self.graphs, "compile_s": round(self.compile_s, 2),
                "cache_hits": inductor["fxgraph_cache_hit"], "cache_misses": inductor["fxgraph_cache_miss"]}


_RECORD_MAX_BYTES = 1 << 16  # a record is about 1 KB; anything far bigger is not one


def cached_costs(pass_heads, *, batch_size: int) -> dict[str, float] | None:
    """The pass costs (ms by "KxT", `PassCosts.to_dict`) that an earlier process measured on this
    model's compiled step at this batch size, on this machine, when it compiled the step into
    inductor's disk cache; None when it never did, or when its record is not one this process can
    trust: unreadable, truncated, malformed (a grid of costs other than finite positive numbers
    for 1..n_future heads over 1..16 nodes), or foreign (another model shape, torch version,
    device or CPU). The graphs depend on the model's shape (config, dtype, device), not on its
    weights, which are their inputs."""
    model, path = pass_heads.model, record_path(pass_heads, batch_size=batch_size)
    try:
        if not path.is_file():  # absent, or a directory or a pipe in its place
            return None
        with open(path, "rb") as f:
            data = f.read(_RECORD_MAX_BYTES + 1)
        record = json.loads(data) if len(data) <= _RECORD_MAX_BYTES else None
    except (OSError, ValueError, RecursionError):  # unreadable, not UTF-8, not JSON (truncated), nested too deep
        return None
    weight = model.embed.weight
    if (not isinstance(record, dict) or record.get("key") != _key(pass_heads, batch_size=batch_size)
            or record.get("machine") != _machine(weight.device)):
        return None
    costs = record.get("costs_ms")
    return costs if _valid_costs(costs, n_future=model.config.n_future) else None


def _valid_costs(costs, *, n_future: int) -> bool:
    """Whether `costs` is a table that `PassCosts.from_dict` makes a cost for every pass from: a
    full grid of "KxT" keys, heads from 1 to n_future and nodes from 1 to the largest bucket,
    each cost a finite positive number."""
    if not isinstance(costs, dict) or not costs:
        return False
    grid = set()
    for key, ms in costs.items():
        k, x, T = key.partition("x") if isinstance(key, str) else ("", "", "")
        if not (x and k.isdecimal() and T.isdecimal() and k.isascii() and T.isascii()):
            return False
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 < ms < float("inf"):
            return False
        grid.add((int(k), int(T)))
    ks, Ts = sorted({k for k, _ in grid}), sorted({T for _, T in grid})
    return (len(grid) == len(ks) * len(Ts) and (ks[0], ks[-1]) == (1, n_future)
            and (Ts[0], Ts[-1]) == (1, NODE_BUCKETS[-1]))


def record_costs(pass_heads, *, batch_size: int, costs_ms: dict[str, float]) -> None:
    """Record in the disk cache that this model's step at this batch size is compiled there, with
    the pass costs measured on it, this machine's name and the key it is found by (a read-only
    cache is left as it is). Written to a temporary file of its own and renamed over the record,
    so a reader, or a process writing the same record at once, never sees it half written."""
    path = record_path(pass_heads, batch_size=batch_size)
    record = json.dumps({"key": _key(pass_heads, batch_size=batch_size),
                         "machine": _machine(pass_heads.model.embed.weight.device), "costs_ms": costs_ms})
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(record)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            pathlib.Path(tmp).unlink(missing_ok=True)


def record_path(pass_heads, *, batch_size: int) -> pathlib.Path:
    """Where the record of this model's compiled step at this batch size lives: beside inductor's
    disk cache (`TORCHINDUCTOR_CACHE_DIR`), named by a hash of the key it holds."""
    key = json.dumps(_key(pass_heads, batch_size=batch_size), sort_keys=True)
    return _cache_dir() / "bytemtp" / f"static-step-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


# the step's own version: pass costs recorded by a step that ran other code are not this one's
STEP_FORMAT = 3  # 2: the cache written and the greedy picks made inside the graph; 3: keyed by the heads' kind


def _key(pass_heads, *, batch_size: int) -> list:
    """What the compiled step's graphs depend on, as JSON reads it back: the model's config, dtype
    and device, torch, the batch size and what the heads say of themselves (`PassHeads.record_key`)."""
    model = pass_heads.model
    weight = model.embed.weight
    return json.loads(json.dumps([dataclasses.asdict(model.config), str(weight.dtype), weight.device.type,
                                  torch.__version__, batch_size, pass_heads.record_key(), STEP_FORMAT]))


@functools.cache
def _machine(device: torch.device) -> str:
    """The processor a step runs on: the GPU's name, or the CPU's model (pass costs measured on
    another machine that shares the cache are not this one's)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        name = ""
    return f"{device.type}: {name or platform.processor() or platform.machine()}"


def _cache_dir() -> pathlib.Path:
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:  # older torch: the documented default
        return pathlib.Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor"))
    return pathlib.Path(cache_dir())


class _Buffers:
    """The cache tensors as the model's layers read them (`k`, `v`, `ids`), inside the step."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, ids: torch.Tensor):
        self.k, self.v, self.ids = k, v, ids


def worth_compiling(mode: Compile, *, device: torch.device, work_bytes: int, ready: bool) -> bool:
    """Whether decoding `work_bytes` bytes (rows x max_bytes) runs the compiled step."""
    if mode is not Compile.AUTO:
        return mode is Compile.ON
    if os.environ.get("TORCHDYNAMO_DISABLE") == "1":
        return False
    return ready or work_bytes >= AUTO_MIN_BYTES.get(device.type, AUTO_MIN_BYTES["cuda"])


class CompilePolicy:
    """When one decoder's passes run the compiled static step: its `mode`, which `settle` fixes
    once for a job of many calls under auto, and the step itself, made the first time a call
    compiles (`static`; prefills and slides always run eagerly)."""

    def __init__(self, model, pass_heads, mode: Compile | str | bool = Compile.AUTO):
        self.model, self.pass_heads = model, pass_heads
        self.mode = Compile.parse(mode)
        self.static: StaticStep | None = None

    def worth(self, batch_size: int, work_bytes: int) -> bool:
        """Whether `work_bytes` of output in batches of `batch_size` run the compiled step."""
        if self.mode is not Compile.AUTO:  # settled: no need to look for a compiled step (an inductor import)
            return self.mode is Compile.ON
        ready = (self.static.ready(batch_size) if self.static is not None else
                 cached_costs(self.pass_heads, batch_size=batch_size) is not None)
        return worth_compiling(self.mode, device=self.model.embed.weight.device, work_bytes=work_bytes, ready=ready)

    def settle(self, *, batch_size: int, work_bytes: int) -> bool:
        """Under auto, decide once for the whole job; True when it runs compiled."""
        if self.mode is Compile.AUTO:
            self.mode = Compile.ON if self.worth(batch_size, work_bytes) else Compile.OFF
        return self.mode is Compile.ON

    def settle_ready(self, batch_sizes: list[int]) -> bool:
        """Under auto, for work of no known length (a server's): compiled when the step is
        compiled already at every one of these batch sizes; True when it runs compiled."""
        if self.mode is Compile.AUTO:
            self.mode = Compile.ON if all(self.worth(size, 0) for size in batch_sizes) else Compile.OFF
        return self.mode is Compile.ON

    def use(self, batch_size: int, max_bytes: int) -> bool:
        """Whether a call decoding `batch_size` rows of up to `max_bytes` runs the static step
        (made here the first time)."""
        if not self.worth(batch_size, batch_size * max_bytes):
            return False
        if self.static is None:
            self.static = StaticStep(self.model, self.pass_heads)
        return True
