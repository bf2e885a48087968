"""Corpora: finding the files a corpus is made of, reading each by its format, describing them.

The prepared-shard format (writer, reader, index, manifest, checks) lives in `bytemtp.data.shards`,
decompression (strict zstd, gzip, plain; lines) in `bytemtp.data.compression`, the file formats
(prepared shard, JSONL, raw document: one reader class each) in `bytemtp.data.readers` (Parquet and
Arrow in `bytemtp.data.columnar`), and the policy of preparing a corpus (dedup, split, bad records)
in `bytemtp.data.prep`. This module turns a corpus spec into files and files into documents;
`CorpusError` comes from `bytemtp.data.shards` (the lowest of them) and is the same class everywhere.

Finding. `corpus_files` turns a spec (paths, directories, globs, prepared corpora, Hugging Face
`save_to_disk` folders, lists of them) into a sorted list of files. A prepared corpus is opened
here, and only here: its split's files are checked against the manifest's record
(`shards.check_split`: sizes and index digests, no decompression), so a replaced shard is refused
before it is read, and a split that holds no document is named as empty (with the way to get one)
rather than reported as a missing corpus.

Reading. `iter_documents` reads one file through its format's reader (`readers.reader_for`); bad
JSONL lines and null table rows are skipped and counted by reason, never dropped silently.
`describe` is what `bytemtp corpus-info` shows; a prepared corpus's manifest renders as the table
that it, `prep` and `prep --merge` print (`corpus_table`).
"""
from __future__ import annotations

import fnmatch
import glob
import json
import os
import pathlib
from collections.abc import Iterator

from bytemtp.data.readers import SKIP_REASONS, reader_for
from bytemtp.data.shards import MANIFEST, CorpusError, check_split, corpus_dir, read_manifest
from bytemtp.tables import table

# --- finding files --------------------------------------------------------------------------------


def _walk(directory: pathlib.Path) -> list[pathlib.Path]:
    """Every regular, non-hidden file below directory, sorted by relative path."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [pathlib.Path(root, f) for f in files if not f.startswith(".")]
    return sorted((p for p in found if p.is_file()), key=lambda p: p.relative_to(directory).parts)


def _saved_dataset(directory: pathlib.Path) -> list[pathlib.Path] | None:
    """The Arrow files of a Hugging Face `save_to_disk` folder, in order, or None for another folder.

    A Dataset's folder holds `state.json`, whose `_data_files` name its Arrow files in order (beside
    them lie JSON files of metadata, no documents); a DatasetDict's holds `dataset_dict.json`, whose
    `splits` name its splits' folders, each a Dataset's (every split is read, in that order: name a
    split's folder to read one)."""
    if (directory / "dataset_dict.json").is_file():
        splits = _json(directory / "dataset_dict.json").get("splits")
        if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
            raise CorpusError(f"{directory / 'dataset_dict.json'} has no list of \"splits\"; save the dataset again")
        files = []
        for name in splits:
            found = _saved_dataset(directory / name)
            if found is None:
                raise CorpusError(f"split {name!r} of the saved DatasetDict {directory} has no "
                                  f"{directory / name / 'state.json'}; save the dataset again")
            files += found
        return files
    if not (directory / "state.json").is_file():
        return None
    data_files = _json(directory / "state.json").get("_data_files")
    if not isinstance(data_files, list) or not all(isinstance(f, dict) and "filename" in f for f in data_files):
        raise CorpusError(f"{directory / 'state.json'} lists no \"_data_files\"; save the dataset again")
    files = [directory / f["filename"] for f in data_files]
    for file in files:
        if not file.is_file():
            raise CorpusError(f"{file}, listed in {directory / 'state.json'}, does not exist; save the dataset again")
    return files


def _json(path: pathlib.Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CorpusError(f"{path} is not readable JSON ({e}); save the dataset again") from None
    return value if isinstance(value, dict) else {}


def _expand(path: pathlib.Path, split: str | None) -> list[pathlib.Path]:
    corpus = corpus_dir(path)
    if not (corpus / MANIFEST).is_file():
        if path.is_file():
            return [path]
        saved = _saved_dataset(path)
        return _walk(path) if saved is None else saved
    splits = read_manifest(corpus)["splits"]
    files = []
    for name in (list(splits) if split is None else [split]):
        if name not in splits or not (corpus / name).is_dir():
            raise CorpusError(f"prepared corpus {corpus} has no split {name!r} (no directory {corpus / name}); "
                              f"choose one of {', '.join(splits)}")
        found = _walk(corpus / name)
        check_split(corpus, name, splits[name], found)
        if split is not None and not found:
            raise CorpusError(_empty_split(corpus, name, splits))
        files += found
    return files


def _empty_split(corpus: pathlib.Path, name: str, splits: dict) -> str:
    others = " or ".join([*(s for s in splits if s != name), "all files"])
    total = sum(s.get("documents", 0) for s in splits.values())
    fraction = "a larger" if name == "val" else "a smaller"
    return (f"the {name} split of the prepared corpus {corpus} is empty (prep put none of its {total:,} "
            f"documents there); read another split ({others}), or prepare the corpus again with {fraction} "
            "`bytemtp prep --val-fraction` or more documents")


def spec_items(spec) -> list:
    """The items of a corpus spec: its paths, directories and globs, as a list."""
    items = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    if not items:
        raise CorpusError("no corpus given; name a file, directory, glob or prepared corpus")
    return items


def corpus_files(spec, *, split: str | None = "train") -> list[pathlib.Path]:
    """The files a corpus spec names, de-duplicated, in a deterministic order.

    Each item of `spec` (a path, or a list of them) is one of: a prepared corpus directory or its
    manifest (the files of its `split`, or of every split if split is None), a Hugging Face
    `save_to_disk` folder (its Arrow files, in the dataset's order), another directory (every
    non-hidden file below it), a glob pattern (its sorted matches, directories expanded), or a file.
    """
    result, seen = [], set()
    for item in spec_items(spec):
        text = os.fspath(item)
        if os.path.exists(text):
            paths = _expand(pathlib.Path(text), split)
        elif any(c in text for c in "*?["):
            matches = sorted(glob.glob(text, recursive=True))
            if not matches:
                raise CorpusError(f"no file matches the pattern {text}; check the path")
            paths = [f for m in matches for f in _expand(pathlib.Path(m), split)]
        else:
            raise CorpusError(f"{text} does not exist; check the path")
        for path in paths:
            if (key := os.path.realpath(path)) not in seen:
                seen.add(key)
                result.append(path)
    if not result:
        raise CorpusError(f"no files found in {', '.join(os.fspath(i) for i in spec_items(spec))}; "
                          f"point at a directory or pattern that holds corpus files")
    return result


def select_files(files: list[pathlib.Path], *, include=(), exclude=()) -> list[pathlib.Path]:
    """The files that match an include pattern (all if none is given) and no exclude pattern.

    A glob pattern matches a file when it matches its path or any trailing part of it, so `*.py`
    matches by name and `site-packages/*` everything below a directory of that name.
    """
    def matches(path: pathlib.Path, patterns) -> bool:
        parts = pathlib.Path(path).parts
        return any(fnmatch.fnmatchcase("/".join(parts[i:]), p) for p in patterns for i in range(len(parts)))

    kept = [f for f in files if (not include or matches(f, include)) and not matches(f, exclude)]
    if not kept:
        raise CorpusError(f"no file is left of {len(files)} after include {list(include)} and exclude "
                          f"{list(exclude)}; loosen the patterns")
    return kept


def iter_documents(path, *, field: str = "text", counts: dict[str, int] | None = None) -> Iterator[bytes]:
    """Every document of one file, read by its format's reader (`readers.reader_for`): a raw file is
    one (its exact bytes, even if empty), a prepared shard holds those its index lists, a JSONL file
    one a line; skips add to counts[reason]."""
    yield from reader_for(path, field=field).documents(counts=counts)


# --- description ----------------------------------------------------------------------------------


def describe(path, *, field: str = "text") -> dict:
    """What `bytemtp corpus-info` shows: for a prepared corpus its manifest and per-split figures;
    for any other spec the documents, bytes, file bytes and skipped records found by reading it."""
    ratio = lambda n, c: round(n / c, 3) if c else None  # noqa: E731
    if not isinstance(path, (list, tuple)) and (corpus_dir(path) / MANIFEST).is_file():
        manifest = read_manifest(path)
        splits = {name: {key: s[key] for key in ("documents", "bytes", "compressed_bytes")}
                  | {"ratio": ratio(s["bytes"], s["compressed_bytes"])} for name, s in manifest["splits"].items()}
        return {"path": str(corpus_dir(path)), "prepared": True, "manifest": manifest, "splits": splits}
    files = corpus_files(path, split=None)
    counts, documents, nbytes = {}, 0, 0
    for file in files:
        for doc in iter_documents(file, field=field, counts=counts):
            documents, nbytes = documents + 1, nbytes + len(doc)
    compressed = sum(file.stat().st_size for file in files)
    return {"path": ", ".join(os.fspath(i) for i in spec_items(path)), "prepared": False,
            "files": len(files), "documents": documents, "bytes": nbytes, "compressed_bytes": compressed,
            "ratio": ratio(nbytes, compressed), "skipped": {r: counts.get(r, 0) for r in SKIP_REASONS}}


def split_line(manifest: dict) -> str:
    """How a prepared corpus was split, from its manifest's record."""
    split = manifest.get("split")
    if split is None:
        return "split: by document hash (not recorded: prepared before the manifest kept it)"
    if split["method"] == "inputs":
        return (f"split: val is {split.get('val_files', '?')} val input file(s) whole "
                f"({', '.join(split['val_inputs'])}), train every other input")
    if split["method"] == "tail":
        return f"split: the last {split['val_tail']:g} of each document's bytes to val, the rest to train"
    return f"split: by document hash, val fraction {split['val_fraction']:g}"


def corpus_table(manifest: dict) -> str:
    """A prepared corpus from its manifest: documents, bytes, compression and shards per split, how
    it was split, the duplicates and bad records left out, and what its integrity record checks."""
    rows = []
    for name, split in manifest["splits"].items():
        ratio = split["bytes"] / split["compressed_bytes"] if split["compressed_bytes"] else 0.0
        rows.append((name, f"{split['documents']:,}", f"{split['bytes']:,}",
                     f"{split['compressed_bytes']:,}", f"{ratio:.2f}", len(split["shards"])))
    lines = [table(rows, ("split", "documents", "bytes", "compressed", "ratio", "shards")), split_line(manifest)]
    skipped = {k: v for k, v in manifest.get("skipped", {}).items() if v}
    lines.append(f"duplicates removed: {manifest.get('duplicates', 0):,}; skipped: "
                 + (", ".join(f"{k} {v:,}" for k, v in sorted(skipped.items())) or "none"))
    if all("shard_files" in split for split in manifest["splits"].values()):
        lines.append("integrity: each shard's size and index sha256 recorded (checked whenever the corpus is "
                     "opened); bytemtp verify checks every document")
    else:
        lines.append("integrity: no per-shard record (prepared before it was kept), so opening the corpus checks "
                     "nothing; bytemtp verify checks its splits' documents, and prep again records it")
    return "\n".join(lines)
