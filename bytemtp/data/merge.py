"""Joining the parts of one prep (`bytemtp prep --part I/N`, run as N independent jobs) into one
prepared corpus (`bytemtp prep --merge PART... --out CORPUS`), without compressing anything again.

Each part's job read every input and kept the documents of its part (`intake.Part`: a function of
each document's bytes), so no document is in two parts, the union of the parts is every document,
and the parts' deduplication is already exact across all of them: copies of a document always fall
in one part, where the first is kept. The split is a function of the document too (a hash, the val
inputs, or a byte tail), so the merged corpus holds, in each split, the same documents as one prep
of the same inputs: the same counts and the same `set_sha256` (a digest that ignores order). What
differs is the order: part 0's documents, then part 1's, and so on, so the shards and the
order-dependent `sha256` of each split differ from a single prep's.

The merge checks that the parts belong together (the same inputs, by names and sizes and by a
digest of each file's documents, so a file edited in place between the jobs is named; the same
split, field, compression and part count, each index once, and the same counts of records and bad
records, which every part sees whole) and that every part's shards are there as recorded (sizes
and index digests: a deleted shard is named before anything is written), then links (or, across
filesystems, copies) each part's shards into place under new names and reads every document once:
the split's `sha256` is computed in the merged order, and each shard's documents are checked
against the part's record on the way, so a damaged part is named rather than merged. The result
is built beside the output and renamed into place like any prep (`prep.build_atomically`).
"""
from __future__ import annotations

import datetime
import hashlib
import os
import pathlib
import shutil
from collections.abc import Callable

import bytemtp
from bytemtp.data.prep import empty_split_error, build_atomically, empty_val_note
from bytemtp.data.integrity import read_shard
from bytemtp.data.shards import (FORMAT_VERSION, CorpusError, check_split, corpus_dir, fsync_dir, read_manifest,
                                 set_digest, write_manifest)

SHARED = ("format_version", "source_field", "frame_bytes", "level", "split", "skipped", "input_files", "records")


def read_parts(parts: list) -> list[tuple[pathlib.Path, dict]]:
    """(folder, manifest) of each part, in part order, once they are checked to belong together."""
    if not parts:
        raise CorpusError("no part given; name the folders that `bytemtp prep --part I/N` wrote")
    found = []
    for path in parts:
        manifest = read_manifest(path)
        if "part" not in manifest:
            raise CorpusError(f"{corpus_dir(path)} is a whole corpus, not a part written by `bytemtp prep --part "
                              f"I/N`; merge only the parts of one prep")
        found.append((corpus_dir(path), manifest))
    for folder, manifest in found:
        if "contents" not in manifest["part"]:
            raise CorpusError(f"{folder} was prepared by a bytemtp that did not record what its inputs held, so a "
                              f"merge cannot tell whether every part read the same files; prepare the parts again "
                              f"with `bytemtp prep --part I/N`")
    first_dir, first = found[0]
    n = first["part"]["of"]
    for folder, manifest in found[1:]:
        for key in ("of", "inputs"):
            if manifest["part"][key] != first["part"][key]:
                raise CorpusError(f"{folder} is a part of another prep than {first_dir} (its part {key} is "
                                  f"{manifest['part'][key]!r}, not {first['part'][key]!r}): merge the parts of one "
                                  f"`bytemtp prep --part I/N` of the same inputs")
        _same_contents(folder, manifest, first_dir, first)
        for key in SHARED:
            if manifest.get(key) != first.get(key):
                raise CorpusError(f"{folder} and {first_dir} differ in {key} ({manifest.get(key)!r} against "
                                  f"{first.get(key)!r}): every part must be prepared with the same options from "
                                  f"the same inputs")
    by_index = {}
    for folder, manifest in found:
        index = manifest["part"]["index"]
        if index in by_index:
            raise CorpusError(f"part {index}/{n} is given twice ({by_index[index][0]} and {folder}); give each once")
        by_index[index] = (folder, manifest)
    if missing := sorted(set(range(n)) - set(by_index)):
        raise CorpusError(f"parts {', '.join(f'{i}/{n}' for i in missing)} are missing: a merge needs all {n} parts "
                          f"of the prep (run `bytemtp prep --part I/{n}` for each)")
    for folder, manifest in found:  # every shard there, at its recorded size and index, before any work
        for name, split in manifest["splits"].items():
            top = folder / name
            files = [f for f in top.rglob("*") if f.is_file() and not f.name.startswith(".")] if top.is_dir() else []
            check_split(folder, name, split, files)
    return [by_index[i] for i in range(n)]


def _same_contents(folder: pathlib.Path, manifest: dict, first_dir: pathlib.Path, first: dict) -> None:
    """Refuse a part whose inputs (the same names and sizes: `inputs` agrees) held other documents
    than the first part's, naming the first file that differs (edited in place between the jobs)."""
    ours, theirs = manifest["part"]["contents"], first["part"]["contents"]
    for (path, digest), (first_path, first_digest) in zip(ours.items(), theirs.items()):
        if digest != first_digest:
            raise CorpusError(f"{folder} and {first_dir} read different documents from the input {path} (their "
                              f"digests {digest[:12]}... and {first_digest[:12]}..., though its name and size "
                              f"are the same{'' if path == first_path else f' as {first_path}'}): it changed "
                              f"between the jobs; prepare every part again from the same files")


def _place(src: pathlib.Path, dst: pathlib.Path) -> None:
    """The shard at dst, as a hard link to src where the filesystem allows, else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        try:
            shutil.copyfile(src, dst)
        except OSError as e:  # gone since the parts were checked, or no room for the copy
            raise CorpusError(f"cannot copy {src} into the merged corpus: {e.strerror or e}; check the part with "
                              f"`bytemtp verify {src.parent.parent}` and that {dst.parent} has room") from None


def _merge_split(name: str, parts: list[tuple[pathlib.Path, dict]], top: pathlib.Path,
                 progress: Callable[[int], None] | None) -> dict:
    """Place the parts' shards of split `name` in `top` and read them; return the split's entry."""
    top.mkdir(parents=True)
    entry = {"documents": 0, "bytes": 0, "compressed_bytes": 0, "shards": [], "shard_files": {}}
    sha, total, recorded = hashlib.sha256(), 0, 0
    for folder, manifest in parts:
        split = manifest["splits"][name]
        recorded += int(split["set_sha256"], 16)
        for shard in split["shards"]:
            src, new = folder / name / shard, f"shard-{len(entry['shards']):05d}.zst"
            record = split["shard_files"].get(shard)
            _place(src, top / new)
            read = read_shard(src, sha, with_set=True, progress=progress)  # src: named if damaged
            entry["documents"] += read.documents
            entry["bytes"] += read.bytes
            total += read.set_total
            if record is None or read.sha256 != record["sha256"]:
                raise CorpusError(f"{src}: its documents do not match the part's manifest (sha256 "
                                  f"{read.sha256[:12]}...); check the part with `bytemtp verify "
                                  f"{folder}` and prepare it again")
            entry["shards"].append(new)
            entry["shard_files"][new] = dict(record)
            entry["compressed_bytes"] += (top / new).stat().st_size
    entry["sha256"], entry["set_sha256"] = sha.hexdigest(), set_digest(total)
    if entry["set_sha256"] != set_digest(recorded):
        raise CorpusError(f"the {name} split's documents do not sum to the parts' recorded set_sha256; check the "
                          f"parts with `bytemtp verify`")
    fsync_dir(top)
    return entry


def merge(parts: list, out_dir, *, progress: Callable[[int], None] | None = None,
          say: Callable[[str], None] | None = None) -> dict:
    """Join the parts of one prep into a prepared corpus at out_dir; return its manifest (see the
    module doc). `progress(n)` gets the document bytes read since its last call."""
    parts = read_parts(parts)
    out = pathlib.Path(out_dir)
    if any(out.resolve() == folder.resolve() for folder, _ in parts):
        raise CorpusError(f"--out {out} is one of the parts; merge into a new folder")
    first = parts[0][1]

    def build(tmp: pathlib.Path) -> dict:
        splits = {name: _merge_split(name, parts, tmp / name, progress) for name in first["splits"]}
        train, val = splits["train"]["documents"], splits["val"]["documents"]
        bad = sum(first["skipped"].values())
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(first["skipped"].items()) if v) or "none"
        if train + val == 0:
            raise CorpusError(f"the {len(parts)} parts hold no document ({bad} bad records: {reasons}); check the "
                              f"inputs and --field")
        if error := empty_split_error(first["split"], train=train, val=val, reasons=reasons):
            raise CorpusError(error)
        manifest = {key: first[key] for key in ("source", "licence")} | {key: first[key] for key in SHARED}
        manifest |= {
            "format_version": FORMAT_VERSION,
            "bytemtp_version": bytemtp.__version__,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "splits": splits,
            "duplicates": sum(m["duplicates"] for _, m in parts),
            "merged": {"parts": len(parts), "inputs": first["part"]["inputs"]},
        }
        write_manifest(tmp, manifest)
        return manifest

    manifest = build_atomically(out, build, say=say)
    if say is not None and (note := empty_val_note(out, manifest)):
        say(note)
    return manifest
