"""The layout of a pass (bytemtp.model.layout) has one owner: the caller builds it once with
`build_layout` and it reaches the trunk and every head, in training (both steps), evaluation,
likelihoods, rollouts, plain generation, the decoder's passes and the static step; the model
never builds one of its own, and a call without one is a TypeError.

`Probe` records every layout that a caller's `build_layout` returned and, for every attention
layer that ran (a `Head`'s, or a layer of the stacked heads), the layout it ran with: a head
handed any other layout (a default of its own, a copy, the previous pass's) shows up as a layer
whose layout was not built for the pass.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from bytemtp import config as C
from bytemtp import config_io
from bytemtp.decoding import compiled, decode
from bytemtp.decoding.compiled import StaticStep
from bytemtp.decoding.drafting import DraftTree, PassCosts
from bytemtp.evaluation import evaluate, likelihood
from bytemtp.model.kvcache import KVCache
from bytemtp.model.layout import Layout, StaticLayout, build_layout, document_starts
from bytemtp.model.model import Attention, ByteMTP
from bytemtp.model.pass_heads import StackedHeads
from bytemtp.training import rollout, step
from bytemtp.vocab import EOS

FLAT = PassCosts({(1, 1): 1.0, (1, 16): 1.0, (8, 1): 1.0, (8, 16): 1.0})  # no pass costs measured

def _model(head_type: str = "transformer", *, n_future: int = 3, head_layers: int = 1,
           doc_mask: bool = False) -> ByteMTP:
    cfg = dataclasses.replace(config_io.tiny().model, head_type=head_type, n_future=n_future, head_layers=head_layers,
                              doc_mask=doc_mask)
    model = ByteMTP(cfg)
    model.init_weights(generator=torch.Generator().manual_seed(0))
    return model


class Probe:
    """The layouts the callers in `modules` built, and the layout each attention layer ran with."""

    def __init__(self, model: ByteMTP, monkeypatch, *modules):
        self.cfg = model.config
        self.built: list = []
        self.used: list[tuple[int, object]] = []  # (layer index, layout) of every attention that ran
        for m in model.modules():
            if isinstance(m, Attention):  # called as attn(x_BTD, layout, cache)
                m.register_forward_pre_hook(lambda mod, args: self.used.append((mod.layer_idx, args[1])))
        stacked_attention = StackedHeads._attention

        def attention(heads, x_KBTD, layer, i, layout, cache):
            cfg = heads.cfg
            self.used += [(cfg.trunk_layers + j * cfg.layers_per_head + i, layout) for j in range(x_KBTD.shape[0])]
            return stacked_attention(heads, x_KBTD, layer, i, layout, cache)

        monkeypatch.setattr(StackedHeads, "_attention", attention)
        for module in modules:
            def build(*args, _build=module.build_layout, **kwargs):
                layout = _build(*args, **kwargs)
                self.built.append(layout)
                return layout
            monkeypatch.setattr(module, "build_layout", build)

    def layers(self, layout) -> set[int]:
        return {i for i, used in self.used if used is layout}

    def check(self, *, heads: int | None) -> list:
        """Every attention layer ran with a layout built for its pass, and every built layout
        reached the whole trunk and each of the first `heads` heads (None: of as many heads as the
        pass ran, the decoder's choice, but at least one); the layouts built."""
        cfg = self.cfg
        assert self.built and self.used
        assert all(any(used is b for b in self.built) for _, used in self.used), \
            "a layer ran with a layout that no caller built for the pass"
        for layout in self.built:
            got = self.layers(layout)
            k = max(1, (len(got) - cfg.trunk_layers) // cfg.layers_per_head) if heads is None else heads
            assert got == set(range(cfg.trunk_layers + k * cfg.layers_per_head)), (k, sorted(got))
        return self.built


@pytest.mark.parametrize("head_type,head_layers", [("transformer", 1), ("transformer", 2), ("causal", 1)])
@pytest.mark.parametrize("efficient", [True, False])
def test_the_training_steps_hand_the_batch_layout_to_every_head(monkeypatch, head_type, head_layers, efficient):
    model = _model(head_type, head_layers=head_layers)
    probe = Probe(model, monkeypatch, step)
    ids = torch.randint(0, 256, (2, model.config.seq_len + model.config.n_future))
    (step.forward_backward if efficient else step.plain_forward_backward)(model, ids, loss_cfg=C.LossConfig())
    assert len(probe.check(heads=model.config.n_future)) == 1  # built once for the batch


@pytest.mark.parametrize("head_type", ["transformer", "causal"])
def test_evaluation_hands_each_batch_layout_to_every_head(monkeypatch, code_corpus, head_type):
    model = _model(head_type).eval()
    probe = Probe(model, monkeypatch, evaluate)
    evaluate.evaluate(model, str(code_corpus), batches=2, batch_size=2)
    assert len(probe.check(heads=model.config.n_future)) == 2  # one a batch


def test_likelihoods_and_rollouts_hand_each_pass_layout_to_the_heads_that_run(monkeypatch):
    model = _model().eval()
    probe = Probe(model, monkeypatch, likelihood, rollout)
    text = bytes(range(97, 123)) * 5  # longer than the context: several windows
    likelihood.loglikelihoods(model, [(b"ab", b"cd"), (b"", text)], batch_size=2)
    rollout.greedy_rollout(model, torch.randint(0, 256, (2, model.config.window)), 4)
    assert len(probe.check(heads=1)) > 3  # head 1 only: the others do not run


@pytest.mark.parametrize("draft,stacked", [("tree-all", True), ("tree-all", False), ("chain-all", True),
                                           ("plain", True)])
def test_the_decoders_passes_hand_their_layout_to_every_head(monkeypatch, draft, stacked):
    model = _model(n_future=4).eval()
    probe = Probe(model, monkeypatch, decode)
    decoder = decode.Decoder(model, stacked=stacked, compile="off", costs=FLAT)
    decoder.generate([b"def f(x):", b"ab"], max_bytes=12, draft=draft)
    decode.generate(model, b"x" * 70, max_bytes=4)  # plain reference, sliding its window
    built = probe.check(heads=None)
    if draft != "plain":  # plain decoding runs head 1 alone
        assert any(probe.layers(b) == set(range(model.config.total_layers)) for b in built)
    if draft == "tree-all":
        assert any(not b.chain for b in built), "no tree pass ran"


@pytest.mark.parametrize("stacked", [True, False])
def test_the_static_step_hands_its_layout_to_every_head(monkeypatch, stacked):
    model = _model(n_future=4).eval()
    probe = Probe(model, monkeypatch, compiled)
    cache = KVCache.for_model(model, batch_size=2, max_len=model.config.seq_len + 16)
    cache.lengths = [5, 9]
    tree = DraftTree.from_paths([(0,), (1,), (0, 0)])
    StaticStep(model, model.decode_heads(stacked=stacked), compiled=False)(
        torch.randint(0, 256, (2, tree.T)), cache, heads=4, depths=tree.depths, ancestors=tree.ancestors)
    built = probe.check(heads=4)
    assert len(built) == 1 and isinstance(built[0], StaticLayout)


def test_a_call_without_a_layout_is_an_error_not_a_default():
    model = _model()
    ids = torch.randint(0, 256, (2, 9))
    layout = build_layout(model, ids)
    z = model(ids, layout=layout)
    with pytest.raises(TypeError, match="layout"):
        model(ids)
    with pytest.raises(TypeError, match="layout"):
        model.logits(ids)
    with pytest.raises(TypeError, match="layout"):
        model.logits(ids, KVCache.for_model(model, 2), heads=1)
    with pytest.raises(TypeError, match="layout"):
        model.head_state(0, z)
    with pytest.raises(TypeError, match="layout"):
        model.head_states(z)
    with pytest.raises(TypeError, match="layout"):
        model.decode_heads()(z, k=2)
    assert not hasattr(model, "layout")  # no default layout to fall back on


def test_the_builder_places_a_pass():
    """No cache: causal from 0 and checked against the context; a cache: after each row's
    length, a tree where depths and ancestors say; a decoder's drafts may run past the context."""
    model = _model()
    seq_len = model.config.seq_len
    plain = build_layout(model, torch.zeros(2, seq_len, dtype=torch.long))
    assert isinstance(plain, Layout) and plain.causal and plain.mask is None and not plain.cached
    with pytest.raises(ValueError, match=f"exceeds the context of {seq_len}"):
        build_layout(model, torch.zeros(1, seq_len + 1, dtype=torch.long))
    cache = KVCache.for_model(model, batch_size=2, max_len=seq_len + 8)
    cache.lengths = [seq_len - 2, 3]
    tree = DraftTree.from_paths([(0,), (1,), (0, 0)])
    ids = torch.zeros(2, tree.T, dtype=torch.long)
    with pytest.raises(ValueError, match="exceeds the context"):
        build_layout(model, ids, cache, depths=list(tree.depths), ancestors=tree.ancestors)
    drafts = build_layout(model, ids, cache, depths=list(tree.depths), ancestors=tree.ancestors, drafts=True)
    assert drafts.starts == cache.lengths and not drafts.chain
    assert drafts.mask.shape == (2, 1, tree.T, seq_len - 2 + tree.T)


# --- document masking (model.doc_mask) -------------------------------------------------------------


def _windows(T: int) -> torch.Tensor:
    """Three windows of documents: one starting mid-document, one opening with EOS and holding
    consecutive EOS, one ending in EOS."""
    ids = torch.randint(0, 256, (3, T), generator=torch.Generator().manual_seed(1))
    ids[0, [10, 30, 31]] = EOS  # no leading EOS: the first document began before the window
    ids[1, [0, 5, 6, 7, T // 2]] = EOS
    ids[2, [T // 3, T - 1]] = EOS
    return ids


def _documents(ids_T: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of each document of a window: from each EOS (or position 0) to the next EOS."""
    cuts = [0] + [i for i in range(1, len(ids_T)) if ids_T[i] == EOS] + [len(ids_T)]
    return list(itertools.pairwise(cuts))


@pytest.mark.parametrize("head_type,stacked", [("transformer", False), ("transformer", True), ("causal", False),
                                               ("linear", False), ("linear", True)])
def test_a_document_masked_window_scores_each_document_as_if_alone(head_type, stacked):
    model = _model(head_type, doc_mask=True).eval()
    ids = _windows(model.config.seq_len)
    with torch.no_grad():
        layout = build_layout(model, ids)
        assert not layout.causal and layout.mask.shape == (3, 1, ids.shape[1], ids.shape[1])
        got = model.decode_heads(stacked=stacked).logits(ids, layout=layout)
        for b in range(len(ids)):
            for start, end in _documents(ids[b]):
                alone = ids[b:b + 1, start:end]
                want = model.logits(alone, layout=build_layout(model, alone))[0]  # (T, K, V), from position 0
                torch.testing.assert_close(got[b, start:end], want, rtol=0, atol=1e-5, msg=f"{b}: {start}..{end}")


def test_without_doc_mask_a_window_of_documents_is_one_causal_pass():
    model = _model()
    masked = _model(doc_mask=True)
    ids = _windows(model.config.seq_len)
    layout = build_layout(model, ids)
    assert layout.causal and layout.mask is None  # today's path: is_causal, no mask built
    with torch.no_grad():
        across = model.logits(ids, layout=layout)
        within = masked.logits(ids, layout=build_layout(masked, ids))
    # before every row's first boundary the two agree (up to the kernels' rounding)
    torch.testing.assert_close(across[:, :5], within[:, :5], rtol=0, atol=1e-5)
    assert not torch.allclose(across[0, 10:], within[0, 10:])  # past a boundary, the mask matters


def _attention_calls(monkeypatch) -> list[dict]:
    """The keyword arguments of every scaled_dot_product_attention call that attention makes."""
    from bytemtp.model import layout as layout_lib

    calls, real = [], layout_lib.F.scaled_dot_product_attention

    def sdpa(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(layout_lib.F, "scaled_dot_product_attention", sdpa)
    return calls


@pytest.mark.parametrize("efficient", [True, False])
def test_the_training_step_without_doc_mask_asks_for_causal_attention_and_passes_no_mask(monkeypatch, efficient):
    # an explicit mask keeps CUDA's SDPA off its flash kernel; is_causal alone lets it choose flash
    model, masked = _model(), _model(doc_mask=True)
    ids = _windows(model.config.seq_len + model.config.n_future)
    fb = step.forward_backward if efficient else step.plain_forward_backward
    calls = _attention_calls(monkeypatch)
    fb(model, ids, loss_cfg=C.LossConfig())
    assert calls and all(c["attn_mask"] is None and c["is_causal"] for c in calls)
    calls.clear()
    fb(masked, ids, loss_cfg=C.LossConfig())  # documents in the window: the masked reference path
    assert calls and all(c["attn_mask"] is not None and not c["is_causal"] for c in calls)


def test_a_batch_of_one_document_a_row_keeps_the_causal_path_under_doc_mask():
    model, masked = _model(), _model(doc_mask=True)
    ids = torch.randint(0, 256, (3, model.config.seq_len), generator=torch.Generator().manual_seed(2))
    ids[1, 0] = EOS  # an EOS at position 0 starts the row's one document
    layout = build_layout(masked, ids)
    assert layout.causal and layout.mask is None
    with torch.no_grad():
        assert torch.equal(masked.logits(ids, layout=layout), model.logits(ids, layout=build_layout(model, ids)))


@pytest.mark.parametrize("head_type", ["transformer", "causal"])
def test_cached_chain_passes_of_a_doc_masked_model_equal_the_whole_pass(head_type):
    """A prefill holding EOS mid-row, then one id at a time, EOS among them: each pass's logits
    equal those of the uncached pass over everything so far."""
    model = _model(head_type, doc_mask=True).eval()
    ids = _windows(model.config.seq_len)
    ids[0, 40] = ids[1, 41:43] = ids[2, 45] = EOS  # ids that a byte-by-byte pass meets
    cache = KVCache.for_model(model, batch_size=3)
    with torch.no_grad():
        full = model.logits(ids, layout=build_layout(model, ids))
        prefix = ids[:, :36]
        got = [model.logits(prefix, cache, layout=build_layout(model, prefix, cache))]
        assert cache.doc_starts == [31, 32, 21]
        for j in range(36, 50):
            got.append(model.logits(ids[:, j:j + 1], cache, layout=build_layout(model, ids[:, j:j + 1], cache)))
    assert cache.doc_starts == [40, 42, 45]
    torch.testing.assert_close(torch.cat(got, dim=1), full[:, :50], rtol=0, atol=1e-5)


def test_document_starts_count_from_each_rows_latest_eos():
    ids = torch.tensor([[1, EOS, 2, 3, EOS, EOS], [4, 5, 6, 7, 8, 9]])
    assert document_starts(ids, [0], [0]).tolist() == [[0, 1, 1, 1, 4, 5], [0] * 6]
    assert document_starts(ids, [10, 20], [3, 17]).tolist() == [[3, 11, 11, 11, 14, 15], [17] * 6]


def test_bf16_attention_on_the_cpu_runs_in_float32_and_returns_bf16():
    """The CPU's flash kernel is slow backward in bf16: low-precision queries attend in float32."""
    import torch.nn.functional as F

    from bytemtp.model.layout import Layout, attend

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 16, 8, generator=g).bfloat16().requires_grad_() for _ in range(3))
    rope = (torch.ones(16, 4), torch.zeros(16, 4))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as training runs it
        y = attend(q, k, v, Layout([0], 16, rope=rope, cached=False), None, None)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True).bfloat16()
    assert y.dtype == torch.bfloat16 and torch.equal(y, want)
    y.sum().backward()
    assert q.grad.dtype == torch.bfloat16 and torch.isfinite(q.grad.float()).all()
