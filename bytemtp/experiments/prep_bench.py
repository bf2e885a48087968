"""`bytemtp bench prep`: prep's speed on one core and on several, checked to write the same corpus;
prep of other inputs holding the same records (Parquet against JSONL, say); and N part jobs plus
their merge, checked against one prep of the whole.

Speeds are the document bytes a prep writes (both splits, duplicates not counted) over its wall
time, the variants taking turns round by round so a busy moment hits each; ratios are given round by
round, for the spread. Each number of workers runs as `prep --workers N` does (`intake.plan`): one
worker reads and compresses in one thread, one core, the baseline. Outputs go to `scratch` and are removed
once measured. The result is a `PrepSpeed`, whose JSON form (`to_json`, read back by `from_json`) is what
`bench prep --json` writes, and whose `table` is what the command prints; a figure taken round by round
is a `Spread` (median and range; nested in the JSON, `{"median": ..., "min": ..., "max": ...}`).
"""
from __future__ import annotations

import dataclasses
import pathlib
import shutil
import time
from collections.abc import Callable

from bytemtp.data.corpus import corpus_files
from bytemtp.data.intake import Part, plan
from bytemtp.data.merge import merge
from bytemtp.data.prep import prepare
from bytemtp.data.shards import CorpusError
from bytemtp.spread import Spread
from bytemtp.tables import table

KEYS = ("documents", "bytes", "sha256", "set_sha256", "shard_files")  # what equal corpora share, split by split


def _written(manifest: dict) -> int:
    return sum(split["bytes"] for split in manifest["splits"].values())


def _same(a: dict, b: dict, keys=KEYS) -> bool:
    return all(a["splits"][s][k] == b["splits"][s][k] for s in a["splits"] for k in keys) \
        and a["duplicates"] == b["duplicates"] and a["skipped"] == b["skipped"]


@dataclasses.dataclass(frozen=True)
class PrepArm:
    """One variant of prep: a number of workers on the inputs, or on the `vs` inputs."""
    workers: int
    seconds: list[float]  # each round's wall time
    mb_s: Spread  # document bytes written a second, MB, round by round: median and range
    same_corpus: bool  # writes what the first arm writes, split by split
    speedup: Spread | None = None  # the first arm's time over this one's, round by round (None: the first)

    def to_json(self) -> dict:
        out = {"workers": self.workers, "seconds": list(self.seconds), "mb_s": self.mb_s.to_dict(),
               "same_corpus": self.same_corpus}
        if self.speedup is not None:
            out["speedup"] = self.speedup.to_dict()
        return out

    @classmethod
    def from_json(cls, data: dict) -> PrepArm:
        return cls(workers=data["workers"], seconds=list(data["seconds"]), mb_s=Spread.from_dict(data["mb_s"]),
                   same_corpus=data["same_corpus"],
                   speedup=Spread.from_dict(data["speedup"]) if "speedup" in data else None)


@dataclasses.dataclass(frozen=True)
class PartsRun:
    """`prep --part I/N` jobs one after another, then their merge, against one prep of the whole."""
    parts: int
    workers: int  # of each part job
    part_seconds: list[float]
    merge_seconds: float
    merge_mb_s: float  # document bytes merged a second, MB
    same_documents: bool  # the merged corpus has the whole prep's documents, bytes and set digests
    same_order: bool  # and in the same order (its sha256 of the content)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> PartsRun:
        return cls(**data)


@dataclasses.dataclass(frozen=True)
class PrepSpeed:
    """What `prep_speed` measures."""
    input_files: int
    input_bytes: int  # on disk
    written_bytes: int  # document bytes that one prep writes, both splits
    rounds: int
    arms: dict[str, PrepArm]  # "workers N" (and "vs") in the order timed
    parts: PartsRun | None = None  # None when no part jobs were asked for

    def to_json(self) -> dict:
        out = {"input_files": self.input_files, "input_bytes": self.input_bytes, "written_bytes": self.written_bytes,
               "rounds": self.rounds, "arms": {name: arm.to_json() for name, arm in self.arms.items()}}
        if self.parts is not None:
            out["parts"] = self.parts.to_json()
        return out

    def table(self) -> str:
        """What `bench prep` prints: the inputs, each arm's MB/s (median and range) and speedup over
        the first, whether it wrote the same corpus, then the part jobs and their merge."""
        lines = [f"{self.input_files} input file(s), {self.input_bytes:,} bytes on disk; each prep writes "
                 f"{self.written_bytes:,} document bytes"]
        rows = [(name, arm.workers, f"{arm.mb_s.mid:.1f}", f"{arm.mb_s.low:.1f}-{arm.mb_s.high:.1f}",
                 arm.speedup.format() if arm.speedup else "1", "yes" if arm.same_corpus else "no")
                for name, arm in self.arms.items()]
        lines.append(table(rows, ("prep", "workers", "MB/s", "range", "x first", "same corpus")))
        if self.parts is not None:
            p = self.parts
            lines.append(f"{p.parts} parts ({p.workers} workers each): {sum(p.part_seconds):.1f} s in all, merge "
                         f"{p.merge_seconds:.1f} s ({p.merge_mb_s:.0f} MB/s); the same documents, split and set "
                         f"digests as one prep: {'yes' if p.same_documents else 'NO'}")
        return "\n".join(lines)

    @classmethod
    def from_json(cls, data: dict) -> PrepSpeed:
        return cls(input_files=data["input_files"], input_bytes=data["input_bytes"],
                   written_bytes=data["written_bytes"], rounds=data["rounds"],
                   arms={name: PrepArm.from_json(arm) for name, arm in data["arms"].items()},
                   parts=PartsRun.from_json(data["parts"]) if "parts" in data else None)


def prep_speed(sources: list, *, scratch, workers=(1, 2), rounds: int = 2, parts: int = 4, vs: list | None = None,
               field: str = "text", progress: Callable[[str], None] | None = None) -> PrepSpeed:
    """Time prep of `sources` with each number of `workers` (and of `vs` with the last), `rounds`
    times interleaved, then `parts` part jobs (the last number of workers each) and their merge."""
    scratch = pathlib.Path(scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    files = corpus_files(sources, split=None)
    input_bytes = sum(f.stat().st_size for f in files)
    arms = [(f"workers {w}", sources, w) for w in workers]
    if vs is not None:
        arms.append(("vs", vs, workers[-1]))
    times, manifests = {name: [] for name, _, _ in arms}, {}

    def run(name, given, n, out, **kw) -> dict:
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        readers, threads = plan(n)
        manifest = prepare(given, out, field=field, readers=readers, threads=threads, **kw)
        seconds = time.perf_counter() - t0
        if progress is not None:
            progress(f"{name}: {_written(manifest) / seconds / 1e6:.1f} MB/s")
        return manifest | {"seconds": seconds}

    for r in range(rounds):
        for name, given, n in arms:
            manifest = run(name, given, n, scratch / "bench-prep-out")
            times[name].append(manifest["seconds"])
            manifests.setdefault(name, manifest)
            if not _same(manifest, manifests[name]):
                raise CorpusError(f"prep of the same inputs ({name}) wrote another corpus in round {r + 1}")
    shutil.rmtree(scratch / "bench-prep-out", ignore_errors=True)
    base, first = manifests[arms[0][0]], arms[0][0]
    result = {}
    for i, (name, _, n) in enumerate(arms):
        mb_s = [_written(manifests[name]) / t / 1e6 for t in times[name]]
        result[name] = PrepArm(
            workers=n, seconds=times[name], mb_s=Spread.of(mb_s), same_corpus=_same(manifests[name], base),
            speedup=Spread.ratios(times[first], times[name]) if i else None)
    return PrepSpeed(input_files=len(files), input_bytes=input_bytes, written_bytes=_written(base), rounds=rounds,
                     arms=result, parts=_parts(sources, scratch, parts, workers[-1], field, base, progress) if parts
                     else None)


def _parts(sources, scratch: pathlib.Path, n: int, workers: int, field: str, whole: dict, progress) -> PartsRun:
    """n part jobs one after another, then their merge, against the whole prep's manifest."""
    outs, seconds = [scratch / f"bench-prep-part{i}" for i in range(n)], []
    try:
        for i, out in enumerate(outs):
            shutil.rmtree(out, ignore_errors=True)
            t0 = time.perf_counter()
            readers, threads = plan(workers)
            prepare(sources, out, field=field, readers=readers, threads=threads, part=Part(i, n))
            seconds.append(time.perf_counter() - t0)
            if progress is not None:
                progress(f"part {i}/{n}: {seconds[-1]:.1f} s")
        merged_dir = scratch / "bench-prep-merged"
        shutil.rmtree(merged_dir, ignore_errors=True)
        t0 = time.perf_counter()
        merged = merge(outs, merged_dir)
        merge_s = time.perf_counter() - t0
        shutil.rmtree(merged_dir, ignore_errors=True)
    finally:
        for out in outs:
            shutil.rmtree(out, ignore_errors=True)
    return PartsRun(parts=n, workers=workers, part_seconds=seconds, merge_seconds=merge_s,
                    merge_mb_s=_written(merged) / merge_s / 1e6,
                    same_documents=_same(merged, whole, keys=("documents", "bytes", "set_sha256")),
                    same_order=_same(merged, whole, keys=("sha256",)))
