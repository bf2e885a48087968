
import pytest
import torch
from doubles import tiny_model

from bytemtp import config_io
from bytemtp.model.kvcache import KVCache
from bytemtp.model.layout import build_layout, ngram_history
from bytemtp.model.pass_heads import HeadsInTurn, StackedHeads
from bytemtp.vocab import VOCAB_SIZE

HEAD_TYPES = ["transformer", "linear", "causal"]


@pytest.mark.parametrize("head_type", HEAD_TYPES)
@pytest.mark.parametrize("unembed", ["shared", "replicated"])
def test_shapes(head_type, unembed):
    model = tiny_model(head_type=head_type, unembed=unembed, n_future=4)
    ids = torch.randint(0, 258, (3, 17))
    z = model(ids, layout=build_layout(model, ids))
    assert z.shape == (3, 17, model.config.d_model)
    h = model.head_state(0, z, layout=build_layout(model, ids))
    assert model.head_logits(0, h).shape == (3, 17, VOCAB_SIZE)
    assert model.logits(ids, layout=build_layout(model, ids)).shape == (3, 17, 4, VOCAB_SIZE)
    assert model.logits(ids, heads=2, layout=build_layout(model, ids)).shape == (3, 17, 2, VOCAB_SIZE)
    assert len(model.unembed) == (4 if unembed == "replicated" else 1)


def test_parameter_matching_keeps_layers_equal():
    mtp, ntp = tiny_model(n_future=8), tiny_model(n_future=1)
    assert mtp.config.total_layers == ntp.config.total_layers == config_io.tiny().model.n_layers
    count_blocks = lambda m: sum(1 for mod in m.modules() if type(mod).__name__ == "Block")  # noqa: E731
    assert count_blocks(mtp) == count_blocks(ntp) == config_io.tiny().model.n_layers
    d = mtp.config.d_model
    # only the extra per-head norms and unembeddings differ
    assert mtp.num_params() - ntp.num_params() == 7 * (d + VOCAB_SIZE * d)
    unmatched = tiny_model(n_future=8, param_match=False)
    assert count_blocks(unmatched) == config_io.tiny().model.n_layers + 7


def test_heads_are_independent_modules():
    model = tiny_model(n_future=3)
    ptrs = {p.data_ptr() for p in model.parameters()}
    assert len(ptrs) == len(list(model.parameters()))


def test_attention_goes_through_sdpa(monkeypatch):
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    model = tiny_model()
    ids = torch.randint(0, 256, (1, 5))
    model.logits(ids, layout=build_layout(model, ids))
    assert len(calls) == model.config.total_layers


def test_causality():
    model = tiny_model().eval()
    ids = torch.randint(0, 256, (2, 20))
    a = model.logits(ids, layout=build_layout(model, ids))
    ids2 = ids.clone()
    ids2[:, 12:] = (ids2[:, 12:] + 1) % 256
    b = model.logits(ids2, layout=build_layout(model, ids2))
    torch.testing.assert_close(a[:, :12], b[:, :12])
    assert not torch.allclose(a[:, 12:], b[:, 12:])


@pytest.mark.parametrize("head_type,extra", [(h, {}) for h in HEAD_TYPES] + [
    ("transformer", {"value_embeds": 2}), ("transformer", {"ngram_embeds": 4, "ngram_rows": 64})])
def test_cached_logits_equal_full_sequence(head_type, extra):
    """Also with value embeddings and hashed n-grams (whose ids before a pass come from the cache's ids)."""
    model = tiny_model(head_type=head_type, **extra).eval()
    ids = torch.randint(0, 258, (2, 48))
    full = model.logits(ids, layout=build_layout(model, ids))
    cache = KVCache.for_model(model, batch_size=2)
    chunks = [(0, 10), (10, 11), (11, 12), (12, 20), (20, 21)]
    got = torch.cat([model.logits(ids[:, a:b], cache, layout=build_layout(model, ids[:, a:b], cache))
                     for a, b in chunks], dim=1)
    assert cache.length == 21
    torch.testing.assert_close(got, full[:, :21], atol=1e-5, rtol=1e-5)
    # rejected drafts: rewind and overwrite with different bytes, then continue
    cache.rewind(6)
    assert cache.length == 15
    wrong = (ids[:, 15:19] + 7) % 256
    model.logits(wrong, cache, layout=build_layout(model, wrong, cache))
    cache.rewind(4)
    rest = model.logits(ids[:, 15:48], cache, layout=build_layout(model, ids[:, 15:48], cache))
    torch.testing.assert_close(rest, full[:, 15:48], atol=1e-5, rtol=1e-5)
    assert cache.length == 48


@pytest.mark.parametrize("head_type,mlp", [("transformer", "swiglu"), ("transformer", "gelu"), ("linear", "swiglu")])
@pytest.mark.parametrize("unembed", ["shared", "replicated"])
@pytest.mark.parametrize("head_layers", [1, 2])
def test_stacked_heads_equal_heads_one_by_one(head_type, mlp, unembed, head_layers):
    """The decoding fast path (k heads as one batched layer) against the per-head modules, in
    full and through a cache with rewinds, for k = all and fewer heads, with either feed-forward
    (linear heads have none)."""
    model = tiny_model(head_type=head_type, mlp=mlp, unembed=unembed, head_layers=head_layers, n_future=4,
                       n_layers=10).double().eval()
    ids = torch.randint(0, 258, (2, 30))
    stacked = model.decode_heads()
    for k in (4, 2):
        layout = build_layout(model, ids)
        torch.testing.assert_close(stacked.logits(ids, heads=k, layout=layout),
                                   model.logits(ids, heads=k, layout=layout))
        fast, slow = KVCache.for_model(model, 2), KVCache.for_model(model, 2)
        for a, b, back in [(0, 9, 0), (9, 10, 0), (10, 16, 3), (13, 20, 0), (20, 30, 0)]:
            got = stacked.logits(ids[:, a:b], fast, heads=k,
                               layout=build_layout(model, ids[:, a:b], fast))
            want = model.logits(ids[:, a:b], slow, heads=k, layout=build_layout(model, ids[:, a:b], slow))
            torch.testing.assert_close(got, want)
            fast.rewind(back)
            slow.rewind(back)
        torch.testing.assert_close(fast.k, slow.k)


def test_causal_heads_do_not_stack():
    assert isinstance(tiny_model(head_type="causal").decode_heads(), HeadsInTurn)
    assert isinstance(tiny_model().decode_heads(), StackedHeads)
    assert isinstance(tiny_model().decode_heads(stacked=False), HeadsInTurn)


@pytest.mark.parametrize("head_type", HEAD_TYPES)
def test_rows_at_different_lengths_equal_each_row_alone(head_type):
    """Per-row cache pointers: rows that accepted different numbers of positions go on from
    their own lengths, and each row's logits equal that row decoded alone."""
    model = tiny_model(head_type=head_type, n_future=3).double().eval()
    ids = torch.randint(0, 258, (3, 40))
    full = model.logits(ids, layout=build_layout(model, ids))
    stacked = model.decode_heads()
    cache = KVCache.for_model(model, batch_size=3)
    model.logits(ids[:, :12], cache, layout=build_layout(model, ids[:, :12], cache))
    cache.rewind([0, 5, 9])  # rows now at 12, 7 and 3
    assert cache.lengths == [12, 7, 3]
    fed = torch.stack([ids[0, 12:18], ids[1, 7:13], ids[2, 3:9]])
    got = stacked.logits(fed, cache, heads=3, layout=build_layout(model, fed, cache))
    for row, start in enumerate([12, 7, 3]):
        torch.testing.assert_close(got[row], full[row, start:start + 6])
    cache.keep([2, 0])
    assert cache.lengths == [9, 18]
    fed = torch.stack([ids[2, 9:11], ids[0, 18:20]])
    got = model.logits(fed, cache, layout=build_layout(model, fed, cache))
    torch.testing.assert_close(got[0], full[2, 9:11])
    torch.testing.assert_close(got[1], full[0, 18:20])


def test_context_overflow_is_a_clear_error():
    model = tiny_model()
    ids = torch.zeros(1, 65, dtype=torch.long)
    with pytest.raises(ValueError, match="exceeds the context of 64"):
        model.logits(ids, layout=build_layout(model, ids))
    cache = KVCache.for_model(model, batch_size=1)
    model.logits(ids[:, :60], cache, layout=build_layout(model, ids[:, :60], cache))
    with pytest.raises(ValueError, match="64 positions|exceeds"):
        model.logits(ids[:, :5], cache, layout=build_layout(model, ids[:, :5], cache))


def test_init_is_reproducible_from_a_generator():
    a, b = tiny_model(seed=3), tiny_model(seed=3)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    c = tiny_model(seed=4)
    assert not torch.equal(next(a.parameters()), next(c.parameters()))


def test_causal_heads_see_previous_head():
    model = tiny_model(head_type="causal", n_future=3).eval()
    ids = torch.randint(0, 256, (1, 9))
    before = model.logits(ids, layout=build_layout(model, ids))
    with torch.no_grad():
        for p in model.heads[0].parameters():
            p.add_(0.05)
    after = model.logits(ids, layout=build_layout(model, ids))
    # changing head 0 changes heads 1 and 2 for causal heads ...
    assert not torch.allclose(before[:, :, 2], after[:, :, 2])
    indep = tiny_model(head_type="transformer", n_future=3).eval()
    before = indep.logits(ids, layout=build_layout(indep, ids))
    with torch.no_grad():
        for p in indep.heads[0].parameters():
            p.add_(0.05)
    # ... and leaves them alone for independent heads
    torch.testing.assert_close(before[:, :, 1:], indep.logits(ids, layout=build_layout(indep, ids))[:, :, 1:])


@pytest.mark.parametrize("head_type,ngrams", [("transformer", 0), ("linear", 0), ("causal", 0), ("transformer", 4)])
@pytest.mark.parametrize("rows", [1, 2])
def test_a_tree_pass_equals_each_branch_as_a_chain(head_type, ngrams, rows):
    """A tree of candidates in one pass (tree mask, per-node rotary positions) gives each node
    the logits of its branch fed as a plain chain; after compacting the accepted path the cache
    equals the cache of that path, and decoding goes on from it exactly. With hashed n-grams, each
    node's ids before it are its branch's, and compacting moves the cache's ids too."""
    model = tiny_model(head_type=head_type, n_future=3, ngram_embeds=ngrams, ngram_rows=64).double().eval()
    stacked = model.decode_heads()
    ids = torch.randint(0, 256, (rows, 30))
    # root 0; children 1, 2 of the root; 3 under 1; 4 under 2; 5 under 3
    parents = [-1, 0, 0, 1, 2, 3]
    depths = [0, 1, 1, 2, 2, 3]
    anc = torch.zeros(6, 6, dtype=torch.bool)
    for i, p in enumerate(parents):
        anc[i, i] = True
        while p >= 0:
            anc[i, p] = True
            p = parents[p]
    tree_ids = torch.randint(0, 256, (rows, 6))
    starts = [10, 7][:rows]
    cache = KVCache.for_model(model, rows)
    model.logits(ids[:, :10], cache, heads=3, layout=build_layout(model, ids[:, :10], cache))
    cache.rewind([0, 3][:rows])
    layout = build_layout(model, tree_ids, cache, depths=depths, ancestors=anc)
    got = stacked.logits(tree_ids, cache, heads=3, layout=layout)
    for r, s in enumerate(starts):
        for node in range(6):
            branch = [j for j in range(6) if anc[node, j]]  # ancestors in depth order
            seq = torch.cat([ids[r, :s], tree_ids[r, branch]])[None]
            want = model.logits(seq, heads=3, layout=build_layout(model, seq))[0, -1]
            torch.testing.assert_close(got[r, node], want)
    # accept the path 0 -> 2 -> 4 in every row, compact, and decode one more id
    cache.rewind(6)
    for r in range(rows):
        cache.compact(r, [starts[r] + j for j in (0, 2, 4)], layers=model.config.total_layers)
    cache.advance(3)
    nxt = torch.randint(0, 256, (rows, 1))
    got = model.logits(nxt, cache, heads=3, layout=build_layout(model, nxt, cache))
    for r, s in enumerate(starts):
        seq = torch.cat([ids[r, :s], tree_ids[r, [0, 2, 4]], nxt[r]])[None]
        torch.testing.assert_close(got[r, 0], model.logits(seq, heads=3, layout=build_layout(model, seq))[0, -1])


def test_prefill_unembeds_only_the_last_positions():
    model = tiny_model(n_future=3).double().eval()
    ids = torch.randint(0, 256, (2, 12))
    full = model.logits(ids, layout=build_layout(model, ids))
    for stacked in (HeadsInTurn(model), model.decode_heads()):
        cache = KVCache.for_model(model, 2)
        got = stacked.logits(ids, cache, layout=build_layout(model, ids, cache), last=[11, 4])
        assert got.shape == (2, 1, 3, full.shape[-1])
        torch.testing.assert_close(got[:, 0], full[[0, 1], [11, 4]])


def test_value_embeddings_add_a_table_of_ids_to_the_first_trunk_layers_values():
    """model.value_embeds: the first N trunk layers (no more than the trunk has) look up an
    embedding of each position's id and add it to their attention values; heads have none. The
    tables are AdamW's under Muon (tables looked up, as the embedding is), and a model without
    them is the model of before, parameter for parameter."""
    from bytemtp.config import TrainConfig
    from bytemtp.training.optimizer import build_optimizer

    plain, valued = tiny_model(), tiny_model(value_embeds=2)
    tables = [n for n, _ in valued.named_parameters() if "value_embed" in n]
    assert tables == ["trunk.0.attn.value_embed.weight", "trunk.1.attn.value_embed.weight"]
    assert valued.num_params() - plain.num_params() == 2 * valued.config.table_rows * valued.config.d_model
    assert [n for n, _ in plain.named_parameters()] == [n for n, _ in valued.named_parameters() if "value_embed" not in n]
    everywhere = tiny_model(value_embeds=99)  # every trunk layer, none of the heads
    assert sum("value_embed" in n for n, _ in everywhere.named_parameters()) == everywhere.config.trunk_layers
    ids = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        before = valued.logits(ids, layout=build_layout(valued, ids))
        valued.trunk[1].attn.value_embed.weight[ids[0, 3]] += 1.0  # one id's row of the second table
        after = valued.logits(ids, layout=build_layout(valued, ids))
    assert not torch.allclose(before, after)
    opt = build_optimizer(valued, TrainConfig(optimizer="muon"), torch.device("cpu"))
    in_muon = {id(p) for group in opt.optimizers["muon"].param_groups for p in group["params"]}
    assert all(id(valued.get_parameter(n)) not in in_muon for n in tables)
    assert id(valued.trunk[0].attn.qkv.weight) in in_muon
    with pytest.raises(ValueError, match="model.value_embeds"):
        config_io.apply_overrides(config_io.tiny(), ["model.value_embeds=-1"])


def test_ngram_history_reads_the_pass_the_tree_and_the_cache():
    """Each node's ids before it (`ngram_history`): a chain's from its own pass and the cache's ids; a
    tree node's along its own path (its ancestors, then the cache), -1 before the sequence."""
    past = torch.tensor([[5, 6, 7, -1, -1], [9, -1, -1, -1, -1]])
    ids = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23]])
    chain = ngram_history(ids, 3, past_BL=past, starts_B=torch.tensor([3, 1]))
    assert chain[0].tolist() == [[7, 6, 5], [10, 7, 6], [11, 10, 7], [12, 11, 10]]
    assert chain[1].tolist() == [[9, -1, -1], [20, 9, -1], [21, 20, 9], [22, 21, 20]]
    # the tree: node 0 the root, 1 and 2 its children, 3 the child of 2
    see = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]]).bool()
    tree = ngram_history(ids, 3, past_BL=past, starts_B=torch.tensor([3, 1]), depths_T=torch.tensor([0, 1, 1, 2]),
                         see_TT=see)
    assert tree[0].tolist() == [[7, 6, 5], [10, 7, 6], [10, 7, 6], [12, 10, 7]]
    assert ngram_history(ids, 2).tolist() == [[[-1, -1], [10, -1], [11, 10], [12, 11]],
                                              [[-1, -1], [20, -1], [21, 20], [22, 21]]]
    tree_as_chain = ngram_history(ids, 3, past_BL=past, starts_B=torch.tensor([3, 1]), depths_T=torch.arange(4),
                                  see_TT=torch.ones(4, 4).tril().bool())
    assert torch.equal(tree_as_chain, chain)


def test_ngram_tables_add_what_the_ids_before_say():
    """model.ngram_embeds: tables for n = 2..N; a position's embedding moves with the ids before it
    (up to N - 1 back), not with those further back."""
    model = tiny_model(ngram_embeds=3, ngram_rows=64).eval()
    assert len(model.ngram) == 2 and model.ngram[0].weight.shape == (64, model.config.d_model)
    a = torch.tensor([[1, 2, 3, 4, 5, 6]])
    b = a.clone()
    b[0, 1] = 9  # two before position 3, three before position 4
    za, zb = (model(x, layout=build_layout(model, x)) for x in (a, b))
    assert not torch.allclose(za[0, 3], zb[0, 3])
    assert not torch.allclose(tiny_model(ngram_embeds=3, ngram_rows=64).embed(a), za)
