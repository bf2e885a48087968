"""Tree drafts against plain greedy decoding (`decode.generate`, the reference), on a scripted
model that computes every node's outputs from that node's own path.

`PathModel` (in tests/doubles.py) has the interface the decoder calls (`logits` with a cache, heads and a layout,
`decode_heads`, `config`, `embed`, the rotary tables) and goes through the real `KVCache`,
`Layout` and `attend`: each layer that runs writes the pass's ids into its cache slots as
attention writes its keys, and each node then reads back the ids it attends to (the cached past
and the nodes its layout's mask lets it see) and its rotary position. From that context alone
it predicts: head 1 the document's next byte, head j the byte j - 1 after that, placed at the
rank its document's script says among head j's top candidates. A node whose context is wrong
(a wrong ancestor, a slot not rewound or not compacted, a head's cache left behind, a position
off its path) predicts '?', so a bug in the decoder's tree bookkeeping changes the output.

Legend: B batch, T nodes of a pass, K heads, V vocabulary, L cache slots.
"""

from __future__ import annotations

import pytest
from doubles import CPU_LIKE, FITTED, FLAT, SONGS, Doc, PathModel, SpyDecoder, fitted_model

from bytemtp.decoding import decode
from bytemtp.decoding.generation import Generation
from bytemtp.decoding.strategy import Draft
from bytemtp.vocab import EOS


def _mixed(depth: int, index: int) -> int | None:
    return (0, 1, 2, None, 0, 1, 0)[(index + 2 * depth) % 7]


DOCS = [
    Doc(b"A", b"always: the top candidate of every head is the byte to come.", lambda d, i: 0),
    Doc(b"Bb second", b" ranks win here, so only a tree has drafts accepted.", lambda d, i: 1),
    Doc(b"Cmixed ranks and a prompt of some length: ", b"zero one two or none by index", _mixed),
    Doc(b"Dnever", b" right: each draft is rejected, plain bytes come one a pass.", lambda d, i: None),
    Doc(b"E", b"deeper heads are wrong", lambda d, i: {1: 0, 2: 1}.get(d)),
]


def _plain(model_docs: list[Doc], prompts: list[bytes], **kw) -> list[Generation]:
    model = PathModel(model_docs, **{k: v for k, v in kw.items() if k in ("n_future", "seq_len")})
    gen = {k: v for k, v in kw.items() if k not in ("n_future", "seq_len")}
    return [decode.generate(model, p, **gen) for p in prompts]


def _assert_equal_rows(got: list[Generation], want: list[Generation], key) -> None:
    assert len(got) == len(want)
    for r, (g, w) in enumerate(zip(got, want)):
        assert (g.output, g.stats.stopped_by) == (w.output, w.stats.stopped_by), (key, r)
        assert g.stats.bytes_out == len(g.output)
        assert min(1, w.stats.forward_passes) <= g.stats.forward_passes <= w.stats.forward_passes, (key, r)
        assert all(0 <= a <= d for a, d in zip(g.stats.accepted, g.stats.drafted)), (key, r)


def test_the_scripted_model_knows_its_documents():
    """The reference itself: plain greedy decoding of each prompt gives its document's text."""
    prompts = [d.prompt for d in DOCS]
    for doc, got in zip(DOCS, _plain(DOCS, prompts, max_bytes=100)):
        assert got.output == doc.text and got.stats.stopped_by == "eos"


@pytest.mark.parametrize("draft,costs", [(Draft(4, "tree"), FLAT), (Draft(3, "tree"), FLAT),
                                         (Draft(None, "auto"), CPU_LIKE), (Draft(4, "chain"), FLAT)],
                         ids=["tree-4", "tree-3", "auto", "chain-4"])
def test_tree_rows_of_different_lengths_equal_plain_greedy(draft, costs):
    prompts = [d.prompt for d in DOCS]
    want = _plain(DOCS, prompts, max_bytes=100)
    model = PathModel(DOCS)
    decoder = SpyDecoder(model, costs)
    got = decoder.generate(prompts, max_bytes=100, draft=draft)
    _assert_equal_rows(got, want, draft)
    assert model.calls == max(g.stats.forward_passes for g in got)
    always, second, never = got[0].stats, got[1].stats, got[3].stats
    assert never.accepted == [0] * len(never.accepted)
    assert sum(always.accepted) > 0
    if draft.shape == "chain":  # a rank-2 byte is never drafted
        assert second.accepted == [0] * len(second.accepted) and not decoder.branches()
    else:  # trees were drafted, and bytes came from second-ranked branches
        assert any(s.startswith("tree") for g in got for s in g.stats.shapes)
        assert second.accepted[0] > 0 and decoder.branches()
        assert always.bytes_per_forward > 2.0


@pytest.mark.parametrize("max_bytes", [0, 1, 2, 3, 4, 5, 6, 9, 13])
def test_tree_max_bytes_cuts_drafts_exactly(max_bytes):
    prompts = [d.prompt for d in DOCS]
    want = _plain(DOCS, prompts, max_bytes=max_bytes)
    model = PathModel(DOCS)
    got = SpyDecoder(model).generate(prompts, max_bytes=max_bytes, draft=Draft(4, "tree"))
    _assert_equal_rows(got, want, max_bytes)
    for doc, g in zip(DOCS, got):
        assert g.output == doc.text[:max_bytes] and g.stats.stopped_by == "max_bytes"
        assert sum(g.stats.accepted) <= max(0, max_bytes - 1)  # no draft past the limit counts
    if max_bytes == 0:
        assert model.calls == 0
        return
    # the always-right row: the prefill gives a byte, each pass up to 4; drafts are offered
    # (counted) only where they may still become output, and every one offered is used
    always = got[0].stats
    assert always.forward_passes == 1 + -(-(max_bytes - 1) // 4)
    n, drafted = 1, [0, 0, 0]
    while n < max_bytes:
        offered = min(3, max_bytes - n)
        drafted[:offered] = [d + 1 for d in drafted[:offered]]
        n += offered + 1
    assert always.drafted == always.accepted == drafted


def test_tree_stop_strings_inside_accepted_branches():
    stops = (b"only a", b"two or", b"one a p", b"heads a")
    prompts = [d.prompt for d in DOCS]
    want = _plain(DOCS, prompts, max_bytes=100, stop=stops)
    assert [w.stats.stopped_by for w in want] == ["eos", "stop", "stop", "stop", "stop"]
    decoder = SpyDecoder(PathModel(DOCS))
    got = decoder.generate(prompts, max_bytes=100, draft=Draft(4, "tree"), stop=stops)
    _assert_equal_rows(got, want, stops)
    # the row whose drafts are right only when second-ranked stops on the last byte of such a
    # branch, and the last row inside a path whose second-ranked byte after the stop is dropped
    assert decoder.paths[DOCS[1].prompt][-1] == [(1, ord("a"))]
    assert decoder.paths[DOCS[4].prompt][-1] == [(0, ord("a")), (1, ord("r"))]
    for g in (got[1], got[4]):  # drafts after a stop string are not counted as used
        assert sum(g.stats.accepted) + g.stats.forward_passes == len(g.output) + 1


def test_tree_eos_inside_an_accepted_second_branch():
    docs = [
        Doc(b"S", b"ab", lambda d, i: {1: 1, 2: 0}.get(d)),  # 'b' second-ranked, then EOS top-ranked
        Doc(b"T", b"xyz", lambda d, i: {1: 0, 2: 1, 3: 0}.get(d)),  # EOS three deep, after a second-ranked 'z'
        Doc(b"Long", b" goes on after the others end", _mixed),
    ]
    prompts = [d.prompt for d in docs]
    want = _plain(docs, prompts, max_bytes=100)
    assert [w.output for w in want] == [d.text for d in docs]
    decoder = SpyDecoder(PathModel(docs))
    got = decoder.generate(prompts, max_bytes=100, draft=Draft(4, "tree"))
    _assert_equal_rows(got, want, "eos")
    assert [g.stats.stopped_by for g in got] == ["eos"] * 3
    assert got[0].stats.forward_passes == got[1].stats.forward_passes == 2  # prefill, one pass to EOS
    ends = [p for p in decoder.branches() if p[-1][1] == EOS]
    assert [(1, ord("b")), (0, EOS)] in ends and [(0, ord("y")), (1, ord("z")), (0, EOS)] in ends
    # the EOS drafts end the output and are not counted as used
    assert got[0].stats.accepted[:2] == [1, 0] and got[1].stats.accepted == [1, 1, 0]


LONG = [
    Doc(b"W", b"a window of sixteen bytes slides many times over this longer text.", _mixed),
    Doc(b"Xa prompt longer than the context", b" starts slid and keeps going.", lambda d, i: 0),
    Doc(b"Y", b"second ranks only, also slid across several windows", lambda d, i: 1),
]


@pytest.mark.parametrize("draft,costs", [(Draft(4, "tree"), FLAT), (Draft(None, "auto"), CPU_LIKE)],
                         ids=["tree-4", "auto"])
def test_tree_decoding_slides_its_window_as_plain_decoding_does(draft, costs):
    prompts = [d.prompt for d in LONG]
    want = _plain(LONG, prompts, max_bytes=100, seq_len=16)
    assert [w.output for w in want] == [d.text for d in LONG]
    decoder = SpyDecoder(PathModel(LONG, seq_len=16), costs)
    got = decoder.generate(prompts, max_bytes=100, draft=draft)
    _assert_equal_rows(got, want, draft)
    assert all(g.stats.slides >= 3 for g in got)
    assert decoder.branches() and sum(got[1].stats.accepted) > 0


# --- the same comparison through a real model ------------------------------------------------------

@FITTED
@pytest.mark.parametrize("head_type", ["transformer", *(pytest.param(t, marks=pytest.mark.slow) for t in ("linear", "causal"))])
def test_tree_decoding_of_a_fitted_model_equals_plain_greedy(head_type):
    """Through the real model's tree masks, rotary positions and stacked heads (the fitted
    models of doubles.py, whose drafts are often right as their heads' top byte and sometimes as the
    second); the last prompt nearly fills the context of 64, so its window slides."""
    model = fitted_model(0, head_type)
    prompts = [b"one two", b"la la", b"0123", (b"".join(SONGS) * 2)[:60]]
    want = [decode.generate(model, p, max_bytes=40) for p in prompts]
    decoder = SpyDecoder(model)
    got = decoder.generate(prompts, max_bytes=40, draft=Draft(4, "tree"))
    _assert_equal_rows(got, want, head_type)
    assert decoder.branches() and got[-1].stats.slides >= 1
