"""The decoding cache and its window rule (bytemtp.model.kvcache): the context left, where a slide
starts the window, and rewinding as a pointer move."""

import pytest
import torch
from doubles import tiny_model

from bytemtp.model.kvcache import KVCache, context_left, window_start
from bytemtp.model.layout import build_layout
from bytemtp.vocab import EOS


def test_context_left_is_what_the_window_slides_by():
    seq_len = 8
    assert context_left(5, 0, seq_len) == 3 and context_left(8, 0, seq_len) == 0
    for n in range(1, 40):
        start = window_start(n, 0, seq_len)
        assert context_left(n, start, seq_len) >= 0  # after a slide the context fits again
        assert (start == 0) == (context_left(n, 0, seq_len) >= 0)


def test_window_rule():
    assert window_start(64, 0, 64) == 0
    assert window_start(65, 0, 64) == 65 - 32
    assert window_start(33 + 64, 33, 64) == 33  # 64 positions: still fits
    assert window_start(200, 0, 64) == 200 - 32


def test_cache_rewind_is_a_pointer_move():
    model = tiny_model()
    cache = KVCache.for_model(model, batch_size=1)
    k_ptr = cache.k.data_ptr()
    ids = torch.randint(0, 256, (1, 8))
    model.logits(ids, cache, layout=build_layout(model, ids, cache))
    cache.rewind(3)
    assert cache.k.data_ptr() == k_ptr and cache.length == 5
    with pytest.raises(AssertionError):
        cache.rewind(6)


def test_each_rows_document_start_goes_with_the_row():
    model = tiny_model(doc_mask=True)
    cache = KVCache.for_model(model, batch_size=3)
    ids = torch.randint(0, 256, (3, 8), generator=torch.Generator().manual_seed(0))
    ids[0, 2], ids[2, 6] = EOS, EOS
    model.logits(ids, cache, layout=build_layout(model, ids, cache))
    assert cache.doc_starts == [2, 0, 6]
    assert cache.row(2).doc_starts == [6]
    cache.keep([2, 0])
    assert cache.doc_starts == [6, 2] and cache.lengths == [8, 8]
    cache.reset()
    assert cache.doc_starts == [0, 0] and cache.lengths == [0, 0]


def test_grow_appends_empty_rows_and_keeps_the_old_ones():
    cache = KVCache(n_layers=2, batch_size=2, max_len=5, n_attn_heads=1, head_dim=3, device="cpu", dtype=torch.float32)
    cache.k.normal_(), cache.v.normal_()
    cache.lengths, cache.doc_starts = [3, 4], [0, 2]
    old_k = cache.k.clone()
    cache.grow(2)
    assert cache.k.shape[1] == cache.v.shape[1] == 4
    assert torch.equal(cache.k[:, :2], old_k) and not cache.k[:, 2:].any() and not cache.v[:, 2:].any()
    assert cache.lengths == [3, 4, 0, 0] and cache.doc_starts == [0, 2, 0, 0]
