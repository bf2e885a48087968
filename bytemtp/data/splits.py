"""What a corpus holds by split, asked in one place: whether it has splits at all, which split holds
text a model did not train on, whether its val split holds documents, the documents of a split, and
the held-out prompts (with their real continuations) that the benchmarks cut from val documents.

A prepared corpus (a directory or manifest that `bytemtp prep` wrote) is split into train and val;
any other corpus (files, folders, globs) is just its files, with no held-out text. Evaluation,
training, the experiments and the command line ask these questions here rather than reading
manifests or corpus files themselves.
"""
from __future__ import annotations

from pathlib import Path

from bytemtp.config import DataConfig
from bytemtp.data.corpus import corpus_files, iter_documents
from bytemtp.data.shards import MANIFEST, CorpusError, read_manifest


def has_splits(data) -> bool:
    """Whether a corpus spec names prepared corpora only (directories or manifests), whose
    documents are split into train and val; any other corpus is just its files."""
    items = data if isinstance(data, (list, tuple)) else [data]
    return all(((Path(i).parent if Path(i).name == MANIFEST else Path(i)) / MANIFEST).is_file() for i in items)


def held_out_split(data) -> str | None:
    """The split that scores a model on text it did not train on: val where the corpus has
    splits, else None (every file: a corpus without splits holds no held-out text)."""
    return "val" if has_splits(data) else None


def has_val_split(data: DataConfig) -> bool:
    """Whether the corpus is a prepared one whose val split holds documents (what validation reads)."""
    try:
        manifest = read_manifest(data.path)
    except CorpusError:
        return False
    return manifest.get("splits", {}).get("val", {}).get("documents", 0) > 0


def documents(path, split: str | None) -> list[bytes]:
    """Every document of a corpus (its `split` where it has splits; None: every file), in order."""
    return [doc for f in corpus_files(path, split=split) for doc in iter_documents(f)]


def val_prompts(data_path: str, *, n: int, prompt_bytes: int) -> list[bytes]:
    """The first `prompt_bytes` bytes of the first n documents of a corpus's val split that are
    at least that long: held-out prompts."""
    return [prompt for prompt, _ in val_continuations(data_path, n=n, prompt_bytes=prompt_bytes, continuation_bytes=0)]


def val_continuations(data_path: str, *, n: int, prompt_bytes: int,
                      continuation_bytes: int) -> list[tuple[bytes, bytes]]:
    """The prompts of `val_prompts`, each with the `continuation_bytes` bytes that follow it in its
    document (fewer where the document ends first): the real continuation, that decoded text is
    judged against."""
    pairs = []
    for path in corpus_files(data_path, split="val"):
        for doc in iter_documents(path):
            if len(doc) >= prompt_bytes:
                pairs.append((doc[:prompt_bytes], doc[prompt_bytes:prompt_bytes + continuation_bytes]))
                if len(pairs) == n:
                    return pairs
    if not pairs:
        raise CorpusError(f"the val split of {data_path} has no document of {prompt_bytes} bytes or more")
    return pairs
