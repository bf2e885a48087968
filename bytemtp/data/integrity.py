"""Reading a prepared corpus whole against its manifest: `verify` (what `bytemtp verify` runs)
and `read_shard`, the read of one shard it and the merge of parts (`bytemtp.data.merge`) share;
`refuse_lost_manifest` keeps a prepared corpus whose manifest is gone from passing as unprepared.

The format, the manifest and the cheap check made whenever a corpus is opened (`check_split`: sizes
and index digests) live in `bytemtp.data.shards`; this module decodes every frame and hashes every
document, the price the module doc there describes.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import NamedTuple

from bytemtp.data.corpus import corpus_files
from bytemtp.data.shards import (MANIFEST, REDO_PREP, CorpusError, Shard, check_record, corpus_dir, doc_value,
                                 has_index, hash_document, read_manifest, set_digest)


class ShardRead(NamedTuple):
    """What reading one shard whole found (`read_shard`)."""

    sha256: str  # of its documents, as the manifest's shard_files record it
    set_total: int  # the sum of its documents' sha256 (set_digest's), 0 when not asked for
    documents: int
    bytes: int


def read_shard(path, sha, *, with_set: bool, progress: Callable[[int], None] | None = None) -> ShardRead:
    """Decode every frame of a shard and hash every document: into the split's running `sha` (in
    shard order), the shard's own sha256, and, `with_set`, the set digest's sum. `progress(n)` gets
    the document bytes read, about a MiB at a time. Shared by `verify` and the merge of parts."""
    shard_sha, total, documents, nbytes, pending = hashlib.sha256(), 0, 0, 0, 0
    with Shard(path) as reader:
        for doc in reader.documents():
            hash_document(sha, doc)
            hash_document(shard_sha, doc)
            if with_set:
                total += doc_value(hashlib.sha256(doc).digest())
            documents, nbytes, pending = documents + 1, nbytes + len(doc), pending + len(doc)
            if progress is not None and pending >= 1 << 20:
                progress(pending)
                pending = 0
    if progress is not None and pending:
        progress(pending)
    return ShardRead(shard_sha.hexdigest(), total, documents, nbytes)


def refuse_lost_manifest(spec) -> None:
    """Refuse, in one line, a corpus spec that holds the shards of a prepared corpus without its
    manifest: a shard (a file that ends with a shard index) in a `train/` or `val/` folder beside which
    there is no manifest.json. Read through their readers, its documents would pass `bytemtp verify`
    as an unprepared corpus's, the missing record taken for a clean bill."""
    for path in corpus_files(spec, split=None):
        split = path.parent
        if split.name in ("train", "val") and not (split.parent / MANIFEST).is_file() and has_index(path):
            raise CorpusError(f"{split.parent} has no {MANIFEST} but holds a prepared corpus's shards ({path}): its "
                              f"record of the content is missing, so there is nothing to verify them against; "
                              f"re-prepare it with bytemtp prep or restore the manifest")


def verify(corpus, *, progress: Callable[[int], None] | None = None) -> dict:
    """Re-read every document of a prepared corpus and check it against the manifest; return a
    summary (splits, shards, documents, bytes, and whether per-shard records were checked).

    Per split: the files below it are the shards listed; per shard (where the manifest records
    them) its size, index digest and documents' sha256; per split the document and byte counts,
    the compressed size and the documents' sha256. Frames are decoded strictly, so a damaged one
    names its documents. `progress(n)` gets the document bytes hashed since its last call. A
    format-1 corpus (JSONL shards) is refused: re-prepare it to verify it.
    """
    manifest, root = read_manifest(corpus), corpus_dir(corpus)
    if manifest["format_version"] == 1:
        raise CorpusError(f"{root} is a format-1 corpus (JSONL shards), which bytemtp verify does not check; "
                          f"prepare its sources again with bytemtp prep to verify it")
    summary = {"corpus": str(root), "splits": len(manifest["splits"]), "shards": 0, "documents": 0, "bytes": 0,
               "per_shard": all("shard_files" in s for s in manifest["splits"].values())}
    for name, split in manifest["splits"].items():
        top = root / name
        found = sorted(p.relative_to(top).as_posix() for p in top.rglob("*")
                       if p.is_file() and not any(part.startswith(".") for part in p.relative_to(top).parts))
        if found != sorted(split["shards"]):
            raise CorpusError(f"{top} holds {found} but the manifest lists {split['shards']}; {REDO_PREP}")
        records = split.get("shard_files", {})
        sha, documents, nbytes, compressed, total = hashlib.sha256(), 0, 0, 0, 0
        for shard in split["shards"]:
            path = top / shard
            if shard in records:
                check_record(path, records[shard], REDO_PREP)
            compressed += path.stat().st_size
            read = read_shard(path, sha, with_set="set_sha256" in split, progress=progress)
            documents, nbytes, total = documents + read.documents, nbytes + read.bytes, total + read.set_total
            if shard in records and read.sha256 != records[shard]["sha256"]:
                raise CorpusError(f"{path}: its documents' sha256 is {read.sha256[:12]}..., not the "
                                  f"recorded {records[shard]['sha256'][:12]}...: their bytes changed although "
                                  f"every frame decodes and the index is the recorded one; {REDO_PREP}")
        got = {"documents": documents, "bytes": nbytes, "compressed_bytes": compressed, "sha256": sha.hexdigest()}
        if "set_sha256" in split:  # recorded since prep --merge
            got["set_sha256"] = set_digest(total)
        for key, value in got.items():
            if split.get(key) != value:
                raise CorpusError(f"split {name} of {root} has {key} {value} but its manifest says "
                                  f"{split.get(key)}; {REDO_PREP}")
        summary["shards"] += len(split["shards"])
        summary["documents"] += documents
        summary["bytes"] += nbytes
    return summary
