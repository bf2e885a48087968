"""`bytemtp bench prep`: prep's speed on one core and on several, checked to write the same corpus;
prep of other inputs holding the same records (Parquet against JSONL, say); and N part jobs plus
their merge, checked against one prep of the whole.

Speeds are the document bytes a prep writes (both splits, duplicates not counted) over its wall
time, the variants taking turns round by round so a busy moment hits each; ratios are given round by
round, for the spread. Each number of workers runs as `prep --workers N` does (`intake.plan`): one
worker reads and compresses in one thread, one core, the baseline. Outputs go to `scratch` and are removed
once measured.
"""
from __future__ import annotations

import pathlib
import shutil
import statistics
import time
from collections.abc import Callable

from bytemtp.data.corpus import corpus_files
from bytemtp.data.intake import Part, plan
from bytemtp.data.merge import merge
from bytemtp.data.prep import prepare
from bytemtp.data.shards import CorpusError

KEYS = ("documents", "bytes", "sha256", "set_sha256", "shard_files")  # what equal corpora share, split by split


def _written(manifest: dict) -> int:
    return sum(split["bytes"] for split in manifest["splits"].values())


def _same(a: dict, b: dict, keys=KEYS) -> bool:
    return all(a["splits"][s][k] == b["splits"][s][k] for s in a["splits"] for k in keys) \
        and a["duplicates"] == b["duplicates"] and a["skipped"] == b["skipped"]


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def prep_speed(sources: list, *, scratch, workers=(1, 2), rounds: int = 2, parts: int = 4, vs: list | None = None,
               field: str = "text", progress: Callable[[str], None] | None = None) -> dict:
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
    base = manifests[arms[0][0]]
    result = {"input_files": len(files), "input_bytes": input_bytes, "written_bytes": _written(base),
              "rounds": rounds, "arms": {}}
    for name, _, n in arms:
        mb_s = [_written(manifests[name]) / t / 1e6 for t in times[name]]
        result["arms"][name] = {"workers": n, "seconds": times[name], "mb_s": _spread(mb_s),
                                "same_corpus": _same(manifests[name], base)}
    first = arms[0][0]
    for name, _, _ in arms[1:]:
        result["arms"][name]["speedup"] = _spread([a / b for a, b in zip(times[first], times[name])])
    if parts:
        result["parts"] = _parts(sources, scratch, parts, workers[-1], field, base, progress)
    return result


def _parts(sources, scratch: pathlib.Path, n: int, workers: int, field: str, whole: dict, progress) -> dict:
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
    return {"parts": n, "workers": workers, "part_seconds": seconds, "merge_seconds": merge_s,
            "merge_mb_s": _written(merged) / merge_s / 1e6,
            "same_documents": _same(merged, whole, keys=("documents", "bytes", "set_sha256")),
            "same_order": _same(merged, whole, keys=("sha256",))}
