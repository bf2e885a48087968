"""Plain decoding (`decode.generate`, the reference) against a full recompute of every byte, and the
decoder against it: the sliding window, and the steps of a pass (verify, accept) each on its own."""

import types

import pytest
import torch
from doubles import FITTED, FLAT, SONGS, fitted_model, generate_batch, rare_eos_model

from bytemtp.decoding import decode
from bytemtp.decoding.batch import Row
from bytemtp.decoding.drafting import DraftTree
from bytemtp.decoding.generation import Output, SpeculativeStats
from bytemtp.decoding.picks import Picks, greedy_picks
from bytemtp.decoding.sampling import Sampling, next_byte
from bytemtp.decoding.strategy import Draft
from bytemtp.vocab import emitted
from bytemtp.model.kvcache import KVCache, window_start
from bytemtp.model.layout import build_layout
from bytemtp.vocab import EOS


def _greedy_without_cache(model, prompt: bytes, max_bytes: int) -> bytes:
    """Greedy decoding that runs the whole context again for every byte, the context starting
    where the window rule puts it (past seq_len it keeps the newest half)."""
    ids, start = [EOS, *prompt], 0
    out = bytearray()
    while len(out) < max_bytes:
        start = window_start(len(ids), start, model.config.seq_len)
        window = torch.tensor([ids[start:]])
        logits = model.logits(window, heads=1, layout=build_layout(model, window))[0, -1, 0]
        byte = next_byte(logits, Sampling())
        if byte == EOS:
            break
        out.append(byte)
        ids.append(byte)
    return bytes(out)


@pytest.mark.parametrize("head_type", ["transformer", "causal"])
@pytest.mark.parametrize("prompt", [b"", b"d", b"def main():\n    "])
def test_cached_greedy_equals_full_recompute(head_type, prompt):
    model = rare_eos_model(head_type=head_type)
    got = decode.generate(model, prompt, max_bytes=30)
    assert got.output == _greedy_without_cache(model, prompt, 30)
    eos = got.stats.stopped_by == "eos"
    assert got.stats.forward_passes == len(got.output) + eos


@pytest.mark.parametrize("draft", [pytest.param("tree-all", marks=pytest.mark.slow), "chain-all"])
def test_a_doc_masked_models_speculative_greedy_equals_its_plain_greedy(draft):
    """Draft passes stay causal under model.doc_mask (the rows hold EOS at slot 0 only), and the
    prefill's EOS padding moves no row's document start that a later pass reads: right-padded
    prompts of different lengths, windows that slide."""
    model = rare_eos_model(doc_mask=True, n_future=4)
    prompts = [b"def f(x):", b"ab", b"x" * 70]
    got = decode.Decoder(model, compile="off", costs=FLAT).generate(prompts, max_bytes=80, draft=draft)
    assert [g.output for g in got] == [decode.generate(model, p, max_bytes=80).output for p in prompts]
    assert decode.generate(model, b"ab", max_bytes=80).output == _greedy_without_cache(model, b"ab", 80)


@pytest.mark.parametrize("draft", ["tree-all", "chain-all"])
def test_an_ngram_models_speculative_greedy_equals_its_plain_greedy(draft):
    """Hashed n-gram tables (model.ngram_embeds) read the ids before each node: from the pass, the
    tree's path, the cache's ids after a prefill, an accepted path and a slide."""
    model = rare_eos_model(ngram_embeds=4, ngram_rows=64, n_future=4)
    prompts = [b"def f(x):", b"ab", b"x" * 70]
    got = decode.Decoder(model, compile="off", costs=FLAT).generate(prompts, max_bytes=80, draft=draft)
    assert [g.output for g in got] == [decode.generate(model, p, max_bytes=80).output for p in prompts]
    assert got[2].output == _greedy_without_cache(model, prompts[2], 80)


def test_limits_and_stops():
    model = rare_eos_model()
    full = decode.generate(model, b"x", max_bytes=40).output
    assert decode.generate(model, b"x", max_bytes=0).output == b""
    assert decode.generate(model, b"x", max_bytes=1).output == full[:1]
    stop = full[5:7]
    cut = decode.generate(model, b"x", max_bytes=40, stop=(stop,))
    assert cut.output.endswith(stop) and cut.stats.stopped_by == "stop"
    assert full.startswith(cut.output)
    # no context wall: a prompt near or past the context of 64 slides the window (twice here);
    # weights large enough that each byte depends on the whole window, not on the last few bytes
    model = rare_eos_model(init_std=0.3)
    for prompt in (b"y" * 60, b"y" * 100):
        long = decode.generate(model, prompt, max_bytes=40)
        assert long.output == _greedy_without_cache(model, prompt, 40) and len(long.output) == 40
        assert long.stats.forward_passes == 40 and long.stats.stopped_by == "max_bytes"


# --- no context wall ------------------------------------------------------------------------------

@pytest.mark.slow
@FITTED
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("head_type", ["transformer", "causal"])
@pytest.mark.parametrize("prompt_len", [0, 10, 63, 150])
def test_the_window_slides_and_speculative_equals_plain(head_type, prompt_len):
    """seq_len is 64: 200 bytes need several slides, and a 150-byte prompt starts beyond the
    context; plain and speculative greedy follow the same window rule and agree byte for byte."""
    model = fitted_model(0, head_type)
    prompt = (b"".join(SONGS) * 4)[:prompt_len]
    plain = decode.generate(model, prompt, max_bytes=200)
    assert plain.stats.bytes_out == 200 or plain.stats.stopped_by == "eos"
    for heads, draft in ((None, "auto"), (8, "chain"), (4, "tree")):
        got = generate_batch(model, [prompt, prompt[:5]], max_bytes=200, draft=Draft(heads, draft),
                                    costs=FLAT)
        assert got[0].output == plain.output
        assert got[1].output == decode.generate(model, prompt[:5], max_bytes=200).output
        if plain.stats.bytes_out == 200:
            assert got[0].stats.slides >= 2


# --- the steps of a pass, each on its own ---------------------------------------------------------

def _row(cand):
    row = Row(b"", Output(SpeculativeStats(), max_bytes=100, stop=(), on_bytes=None))
    row.nxt, row.cand = ord("a"), cand
    return row


def _logits(picks_TK):
    """Logits (1, T, K, V) whose argmax at node t, head k is picks_TK[t][k]."""
    T, K = len(picks_TK), len(picks_TK[0])
    out = torch.zeros(1, T, K, 264)
    for t in range(T):
        for k in range(K):
            out[0, t, k, picks_TK[t][k]] = 5.0
    return out


@pytest.mark.usefixtures("one_thread")
def test_verify_greedy_walks_the_tree_along_head_1():
    tree = DraftTree.from_paths([(0,), (1,), (1, 0), (0, 0)])  # nodes: root, (0), (0,0), (1), (1,0)
    assert tree.ranks == (0, 0, 0, 1, 0) and tree.parents == (-1, 0, 1, 0, 3)
    row = _row([[ord("x"), ord("b")], [ord("c"), ord("y")]])  # head 2: x, b; head 3: c, y
    # head 1 after the root says b (rank 1 of head 2: node 3), after b says c (node 4), then d
    logits = _logits([[ord("b"), 1, 2], [ord("q"), 1, 2], [ord("q"), 1, 2], [ord("c"), 1, 2], [ord("d"), 7, 8]])
    picks = Picks.read(greedy_picks(logits, torch.tensor(emitted(264))), [row], heads=3)  # one transfer
    assert row.stats.host_reads == 1
    state = types.SimpleNamespace(active=[0], finished=set())
    (path, nxt), = decode.verify(picks, state, [row], tree, offered=[2])
    assert path == [0, 3, 4] and nxt == ord("d") and [c[0] for c in picks.cands(0, path[-1])] == [7, 8]
    (path, nxt), = decode.verify(picks, state, [row], tree, offered=[1])  # depth 2 not usable
    assert path == [0, 3] and nxt == ord("c")


@FITTED
@pytest.mark.usefixtures("one_thread")
def test_accept_emits_counts_and_compacts_the_path():
    model = fitted_model(0, "transformer")
    cache = KVCache.for_model(model, 1, max_len=80)
    cache.k[:, 0, :, 10:15] = torch.arange(5, dtype=cache.k.dtype)[:, None]  # slot s holds s - 10
    cache.lengths = [10]
    tree = DraftTree.from_paths([(0,), (1,), (1, 0), (0, 0)])
    row = _row([[ord("x"), ord("b")], [ord("c"), ord("y")]])
    dec = decode.Decoder.__new__(decode.Decoder)
    done = dec.accept(row, 0, [0, 3, 4], tree, cache, start=10, layers=model.config.total_layers, offered=2)
    assert not done and bytes(row.out.data) == b"bc"
    assert row.stats.drafted == [1, 1] and row.stats.accepted == [1, 1] and row.stats.forward_passes == 1
    assert cache.lengths == [13] and cache.k[0, 0, 0, 10:13, 0].tolist() == [0.0, 3.0, 4.0]
