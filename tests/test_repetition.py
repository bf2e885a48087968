"""How repetitive decoded text is (bytemtp.decoding.repetition): distinct 8-grams per text,
pooled, and the zstd ratio of the texts concatenated, beside the real continuation's."""

import pathlib
import textwrap

import pytest
import zstandard

from bytemtp.decoding.repetition import (Repetition, RepetitionFigures, distinct_ngram_share, measure_repetition,
                                         repetition_figures, zstd_ratio)

PYTHON = pathlib.Path(textwrap.__file__).read_bytes()  # real Python text, from the standard library


def test_a_run_of_spaces_is_repetitive_and_real_python_is_not():
    spaces = repetition_figures([b" " * 256] * 16)
    assert spaces.zstd_ratio > 50 and spaces.distinct_8grams < 0.01 and spaces.bytes == 4096
    python = repetition_figures([PYTHON[i * 1024:i * 1024 + 256] for i in range(16)])
    assert python.zstd_ratio < 3 and python.distinct_8grams > 0.8 and python.bytes == 4096


def test_distinct_8grams_are_counted_within_each_text_then_pooled():
    # "abcdefghij" has 3 8-grams, all distinct; "xxxxxxxxxx" 3 of which 1 is distinct; a text of
    # 7 bytes has none. The same text twice repeats nothing within either text.
    assert distinct_ngram_share([b"abcdefghij", b"x" * 10, b"short!!"]) == pytest.approx(4 / 6)
    assert distinct_ngram_share([b"abcdefghij", b"abcdefghij"]) == 1.0
    assert distinct_ngram_share([b"abc", b""]) is None


def test_the_zstd_ratio_is_of_the_texts_concatenated():
    texts = [PYTHON[:300], PYTHON[300:700]]
    assert zstd_ratio(texts) == len(PYTHON[:700]) / len(zstandard.ZstdCompressor(level=3).compress(PYTHON[:700]))
    assert zstd_ratio([b"", b""]) is None


def test_decoded_text_is_judged_against_the_real_continuation_cut_to_its_length():
    decoded = [b" " * 200, b" " * 100]
    real = [PYTHON[:400], PYTHON[1000:1050]]  # the second document ended before 100 bytes
    rep = measure_repetition(decoded, real)
    assert rep.decoded == repetition_figures(decoded)
    assert rep.real == repetition_figures([PYTHON[:200], PYTHON[1000:1050]]) and rep.real.bytes == 250
    assert rep.zstd_ratio_over_real == pytest.approx(rep.decoded.zstd_ratio / rep.real.zstd_ratio)
    assert rep.zstd_ratio_over_real > 5
    assert measure_repetition(decoded) == Repetition(decoded=repetition_figures(decoded))
    assert measure_repetition([b""], [b""]).zstd_ratio_over_real is None
    assert measure_repetition([], []).real == RepetitionFigures(distinct_8grams=None, zstd_ratio=None, bytes=0)
    with pytest.raises(ValueError, match="1 real continuations for 2 decoded texts"):
        measure_repetition(decoded, real[:1])
