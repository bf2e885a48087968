"""The loader's benchmark (`bench loader`), measured as ratios within one run (shared machines are
noisy): the loader against `zstd -dc` on the same prepared shard, and against the loader on
another corpus with the same documents (`loader_throughput`). The result is a `LoaderThroughput`,
whose JSON form (`to_json`, read back by `from_json`) is what `bench loader --json` writes, key
for key and in order, and whose `table` is what the command prints; a ratio is a `Spread`, best
against best with the runs' range (`ratio` and `pair_ratios` in the JSON).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import time

from bytemtp.config import DataConfig, ModelConfig
from bytemtp.data.compression import decompressed_size
from bytemtp.data.corpus import corpus_files
from bytemtp.data.loader import ByteLoader
from bytemtp.data.shards import CorpusError
from bytemtp.spread import Spread
from bytemtp.tables import table


@dataclasses.dataclass(frozen=True)
class VsThroughput:
    """The loader's epochs of another corpus with the same documents, beside it on the shard."""
    path: str
    files: int
    document_bytes: int  # an epoch's document bytes, as the loader counts them
    s: float  # the fastest epoch's seconds
    mb_s: float  # document MB a second in that epoch
    # mb_s over the loader's on the shard, best against best (mid), and run by run (runs: its time as if it
    # had the shard's bytes, sorted)
    ratio: Spread

    def to_json(self) -> dict:
        return {"path": self.path, "files": self.files, "document_bytes": self.document_bytes, "s": self.s,
                "mb_s": self.mb_s, **_ratio_json(self.ratio)}

    @classmethod
    def from_json(cls, data: dict) -> VsThroughput:
        return cls(**{k: data[k] for k in ("path", "files", "document_bytes", "s", "mb_s")}, ratio=_ratio(data))


@dataclasses.dataclass(frozen=True)
class LoaderThroughput:
    """The loader on one prepared shard beside `zstd -dc` of it (`loader_throughput`)."""
    shard: str
    decompressed_bytes: int
    compressed_bytes: int
    seq_len: int
    batch_size: int
    batches: int  # batches of the last epoch timed (the vs corpus's, where there is one)
    repeats: int
    loader_s: float  # the fastest epoch
    zstd_s: float  # the fastest `zstd -dc`
    loader_mb_s: float  # decompressed MB a second
    zstd_mb_s: float
    # loader_mb_s / zstd_mb_s (mid), and zstd's time over the loader's run by run (runs, sorted)
    ratio: Spread
    vs: VsThroughput | None = None

    def to_json(self) -> dict:
        """The figures, the ratio as `ratio` (best against best) and `pair_ratios` (run by run)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)[:11]}
        out.update(_ratio_json(self.ratio))
        if self.vs is not None:
            out["vs"] = self.vs.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict) -> LoaderThroughput:
        vs = data.get("vs")
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)[:11]}, ratio=_ratio(data),
                   vs=None if vs is None else VsThroughput.from_json(vs))

    def table(self) -> str:
        """What `bench loader` prints: the shard, each reader's MB/s, then the ratios best against
        best and the range of their runs."""
        rows = [("bytemtp loader (one process)", f"{self.loader_mb_s:.1f}"),
                ("zstd -dc > /dev/null", f"{self.zstd_mb_s:.1f}")]
        if self.vs is not None:
            rows.append((f"bytemtp loader on {self.vs.path}", f"{self.vs.mb_s:.1f}"))
        lines = [f"shard {self.shard}: {self.decompressed_bytes:,} bytes decompressed, "
                 f"{self.batches:,} batches of {self.batch_size} x {self.seq_len}",
                 table(rows, ("reader", "MB/s")),
                 f"ratio {self.ratio.mid:.3f} (best against best; run by run {self.ratio.low:.2f} to "
                 f"{self.ratio.high:.2f})"]
        if self.vs is not None:
            r = self.vs.ratio
            lines.append(f"{self.vs.path} / shard {r.mid:.3f} (document bytes a second, best against best; run by "
                         f"run {r.low:.2f} to {r.high:.2f})")
        return "\n".join(lines)


def _ratio_json(ratio: Spread) -> dict:
    """A ratio's JSON form, as `bench loader` has always written it: `ratio` and `pair_ratios`."""
    return {"ratio": ratio.mid, "pair_ratios": list(ratio.runs)}


def _ratio(data: dict) -> Spread:
    """`_ratio_json` read back."""
    return Spread.around(data["ratio"], data["pair_ratios"], keep_runs=True)



def loader_throughput(path: str, *, seq_len: int = 2048, n_future: int = 8, batch_size: int = 8,
                      repeats: int = 3, vs: str | None = None, progress=None) -> LoaderThroughput:
    """Decompressed MB/s that one process delivers as packed batches from one prepared shard,
    beside `zstd -dc` of the same file to /dev/null in the same run. Both divide the shard's
    decompressed size by their time, the best of `repeats` runs each, interleaved: the loader's for
    one whole epoch of the shard (read, decode, place EOS, pack, shuffle, batch) after a first
    epoch that warms it up (threads started, buffers allocated), zstd's for decompressing it.

    With `vs` (any corpus spec: a Parquet file with the same documents, say), the loader also runs
    whole epochs of it, interleaved with the others, and `vs` reports its document bytes a second
    (counted by the loader) and its ratio to the loader on the shard, best against best and run by
    run (the spread)."""
    files = [f for f in corpus_files(path, split="train") if str(f).endswith(".zst")]
    if not files:
        raise CorpusError(f"{path} holds no .zst shard; prepare one with `bytemtp prep`")
    shard = max(files, key=lambda f: f.stat().st_size)
    size = decompressed_size(shard)
    zstd = shutil.which("zstd")
    if zstd is None:
        raise CorpusError("the zstd command is not installed (apt-get install zstd); "
                          "the benchmark compares the loader against it")
    model = ModelConfig(seq_len=seq_len, n_future=n_future)  # the windows of such a model
    loaders = {"loader": ByteLoader(DataConfig(path=str(shard), batch_size=batch_size), model)}
    if vs is not None:
        loaders["vs"] = ByteLoader(DataConfig(path=vs, batch_size=batch_size), model)
    for loader in loaders.values():
        while loader.epoch == 0:  # the warm-up epoch
            next(loader)
    zstd_s, took, nbytes = [], {name: [] for name in loaders}, {}
    for _ in range(repeats):  # interleaved, so that a busy moment hits all of them
        with open(os.devnull, "wb") as sink:
            t0 = time.perf_counter()
            subprocess.run([zstd, "-dcq", str(shard)], stdout=sink, check=True)
            zstd_s.append(time.perf_counter() - t0)
        for name, loader in loaders.items():
            epoch, batches, before, t0 = loader.epoch, 0, loader.stats()["bytes"], time.perf_counter()
            while loader.epoch == epoch:
                next(loader)
                batches += 1
            took[name].append(time.perf_counter() - t0)
            # the document bytes of the epoch (the last batch may hold a few of the next one's)
            nbytes[name] = loader.stats()["bytes"] - before
        if progress is not None:
            progress()
    loader_s = took["loader"]
    loader_mb_s, zstd_mb_s = size / min(loader_s) / 1e6, size / min(zstd_s) / 1e6
    vs_figures = None
    if vs is not None:
        per_byte = size / nbytes["vs"]  # a vs run's time as if it had the shard's bytes
        vs_mb_s = nbytes["vs"] / min(took["vs"]) / 1e6
        vs_figures = VsThroughput(path=vs, files=len(corpus_files(vs, split="train")), document_bytes=nbytes["vs"],
                                  s=min(took["vs"]), mb_s=vs_mb_s, ratio=Spread.around(
                                      vs_mb_s / loader_mb_s, sorted(t / (v * per_byte) for t, v in
                                                                    zip(loader_s, took["vs"])), keep_runs=True))
    return LoaderThroughput(shard=str(shard), decompressed_bytes=size, compressed_bytes=shard.stat().st_size,
                            seq_len=seq_len, batch_size=batch_size, batches=batches, repeats=repeats,
                            loader_s=min(loader_s), zstd_s=min(zstd_s), loader_mb_s=loader_mb_s, zstd_mb_s=zstd_mb_s,
                            ratio=Spread.around(loader_mb_s / zstd_mb_s,  # run by run: the spread
                                                sorted(z / t for z, t in zip(zstd_s, loader_s)), keep_runs=True),
                            vs=vs_figures)
