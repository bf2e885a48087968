"""What a corpus holds by split (`bytemtp.data.splits`): prepared corpora have train and val, any
other corpus is its files; held-out prompts and their real continuations come from val documents."""

import pytest

from bytemtp.config import DataConfig
from bytemtp.data.prep import prepare
from bytemtp.data.shards import CorpusError
from bytemtp.data.splits import (documents, has_splits, has_val_split, held_out_split, val_continuations,
                                 val_prompts)


def test_val_continuations_are_the_bytes_after_each_prompt(tmp_path):
    docs = [b"short", b"0123456789abcdefghij", b"ABCDEFGHIJKL"]  # files a directory holds, one document each
    for i, doc in enumerate(docs):
        (tmp_path / f"d{i}.txt").write_bytes(doc)
    pairs = val_continuations(str(tmp_path), n=2, prompt_bytes=6, continuation_bytes=10)
    # the short document is no prompt; the last one ends before its continuation does
    assert pairs == [(b"012345", b"6789abcdef"), (b"ABCDEF", b"GHIJKL")]
    assert val_prompts(str(tmp_path), n=2, prompt_bytes=6) == [b"012345", b"ABCDEF"]
    with pytest.raises(CorpusError, match="no document of 50 bytes or more"):
        val_continuations(str(tmp_path), n=2, prompt_bytes=50, continuation_bytes=0)


def test_a_prepared_corpus_has_splits_and_a_folder_of_files_has_none(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    texts = [f"document {i} " * (3 + i) for i in range(30)]
    for i, text in enumerate(texts):
        (src / f"{i:02d}.txt").write_text(text)
    prepare([src], tmp_path / "corpus", val_fraction=0.3)
    corpus = str(tmp_path / "corpus")
    assert has_splits(corpus) and has_splits(str(tmp_path / "corpus" / "manifest.json"))
    assert held_out_split(corpus) == "val" and has_val_split(DataConfig(path=corpus))
    train, val = documents(corpus, "train"), documents(corpus, "val")
    assert val and sorted(train + val) == sorted(t.encode() for t in texts)
    assert not has_splits(str(src)) and held_out_split(str(src)) is None
    assert not has_val_split(DataConfig(path=str(src)))
    assert not has_splits([corpus, str(src)])  # a list is split only when every item is
    assert sorted(documents(str(src), None)) == sorted(t.encode() for t in texts)
