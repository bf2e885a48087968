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

import pytest
import torch

from bytemtp import config as C
from bytemtp.decoding import compiled, decode
from bytemtp.decoding.compiled import StaticStep
from bytemtp.decoding.drafting import DraftTree, PassCosts
from bytemtp.evaluation import evaluate, likelihood
from bytemtp.model.kvcache import KVCache
from bytemtp.model.layout import Layout, StaticLayout, build_layout
from bytemtp.model.model import Attention, ByteMTP, StackedHeads
from bytemtp.training import rollout, step

FLAT = PassCosts({(1, 1): 1.0, (1, 16): 1.0, (8, 1): 1.0, (8, 16): 1.0})  # no pass costs measured

def _model(head_type: str = "transformer", *, n_future: int = 3, head_layers: int = 1) -> ByteMTP:
    cfg = dataclasses.replace(C.tiny().model, head_type=head_type, n_future=n_future, head_layers=head_layers)
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
    StaticStep(model, model.stack_heads() if stacked else None, compiled=False)(
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
        model.stack_heads()(z, k=2)
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
