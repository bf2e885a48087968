"""Draft heads (`model.draft`, bytemtp.model.draft): cheap heads beside the training heads that the
decoder drafts with. Speculative greedy decoding with them equals plain greedy decoding (eager, and
on the static step), speculative sampling keeps head 1's distribution, a pass writes only a plain
pass's cache layers, their training moves nothing but them, and they survive a checkpoint."""

import dataclasses

import pytest
import torch
from doubles import chi2_critical, rare_eos_model, seeded_sampling, tiny_model

from bytemtp import config as C
from bytemtp import config_io
from bytemtp.decoding.compiled import Compile, StaticStep
from bytemtp.decoding.decode import Decoder, generate
from bytemtp.decoding.drafting import PassCosts
from bytemtp.decoding.sampling import distribution
from bytemtp.model.draft import DRAFTERS, forced_logits
from bytemtp.model.kvcache import KVCache
from bytemtp.model.layout import build_layout
from bytemtp.model.loss import LossOutput
from bytemtp.runtime.checkpoint import load_model, save_checkpoint
from bytemtp.training.optimizer import set_trainable
from bytemtp.training.step import draft_forward_backward
from bytemtp.vocab import EOS

DESIGNS = sorted(DRAFTERS)


def _drafted_model(design: str, seed: int = 0, *, scale: float = 0.05):
    """A tiny model of rare EOS whose draft heads are head 1's copies moved by noise (so they
    disagree with head 1 now and then)."""
    model = rare_eos_model(seed, draft=design)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.drafter.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return model


@pytest.mark.parametrize("design", DESIGNS)
def test_an_untrained_draft_is_head_1_at_the_same_position(design):
    model = tiny_model(draft=design).eval()
    ids = torch.randint(0, 256, (2, 20))
    layout = build_layout(model, ids[:, :12])
    first, drafts = forced_logits(model, ids, 12, layout=layout)
    for d in range(drafts.shape[2]):
        torch.testing.assert_close(drafts[:, :, d], first)


@pytest.mark.parametrize("design", DESIGNS)
@pytest.mark.parametrize("draft", ["auto", "chain-all", "tree-all", "chain-3+lookup", "auto+lookup"])
def test_speculative_greedy_with_draft_heads_equals_plain_greedy(design, draft):
    model = _drafted_model(design)
    prompts = [b"", b"def main():\n    return", b"abcabcabc" * 9]  # the last slides its window
    want = [generate(model, p, max_bytes=70).output for p in prompts]
    got = Decoder(model, compile="off").generate(prompts, max_bytes=70, draft=draft)
    assert [g.output for g in got] == want
    if draft == "chain-all":
        assert all(g.stats.drafted[6] > 0 for g in got)  # every depth drafted


@pytest.mark.parametrize("design", DESIGNS)
def test_the_static_step_with_draft_heads_equals_plain_greedy(design):
    model = _drafted_model(design, seed=3)
    prompts = [b"import os\n", b"x = [", b"q"]
    want = [generate(model, p, max_bytes=50).output for p in prompts]
    decoder = Decoder(model, compile="on")
    decoder.policy.static = StaticStep(model, decoder.pass_heads, compiled=False)
    for draft in ("chain-all", "tree-4"):
        got = decoder.generate(prompts, max_bytes=50, draft=draft)
        assert [g.output for g in got] == want


@pytest.mark.parametrize("design", DESIGNS)
def test_a_pass_with_draft_heads_writes_a_plain_pass_s_cache_and_keeps_every_head_warm(design):
    model = _drafted_model(design)
    decoder = Decoder(model, compile="off")
    assert decoder.pass_heads.whole_after(1) == 8 and decoder.pass_heads.layers_written(8) == model.layers_written(1)
    ids = torch.randint(0, 256, (2, 5))
    plain, drafted = (KVCache.for_model(model, batch_size=2) for _ in range(2))
    want = model.logits(ids, plain, heads=1, layout=build_layout(model, ids, plain))
    got = decoder.pass_heads.logits(ids, drafted, heads=8, layout=build_layout(model, ids, drafted))
    assert got.shape == (2, 5, 8, want.shape[-1])
    torch.testing.assert_close(got[:, :, :1], want)
    n = model.layers_written(1)
    torch.testing.assert_close(drafted.k[:n, :, :5], plain.k[:n, :, :5])
    assert not drafted.k[n:].any()  # the training heads' layers stay unwritten
    step = StaticStep(model, decoder.pass_heads, compiled=False)
    assert step._indices(2, 8, 8)[0].flatten().tolist() == list(model.cache_layers(1))


_FLAT = PassCosts({(1, 1): 1.0, (1, 16): 1.0, (8, 1): 1.0, (8, 16): 1.0})  # drafting is free


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("design", DESIGNS)
def test_speculative_sampling_with_draft_heads_has_head_1_s_distribution(design):
    """Top-2 sampling of 3 bytes: 8 outputs whose exact probabilities plain decoding gives, the
    drafts fitted to the model's own samples so that they are accepted now and then."""
    model = rare_eos_model(5, draft=design)
    sampling = seeded_sampling(9, top_k=2)
    text = Decoder(model, compile="off").generate([b""] * 64, max_bytes=24, draft="plain", sampling=sampling)
    ids = torch.tensor([[EOS, *g.output] for g in text if len(g.output) == 24])
    set_trainable(model, "draft-heads")
    opt = torch.optim.Adam(model.drafter.parameters(), lr=1e-2)
    for _ in range(60):
        opt.zero_grad()
        draft_forward_backward(model, ids, loss_cfg=C.LossConfig(teacher_weight=1.0))
        opt.step()
    model.requires_grad_(False)
    expected, frontier = {}, {b"": 1.0}
    for _ in range(3):
        nxt = {}
        for prefix, pr in frontier.items():
            ids = torch.tensor([[EOS, *prefix]])
            with torch.no_grad():
                logits = model.logits(ids, heads=1, layout=build_layout(model, ids))[0, -1, 0]
            dist = distribution(logits, sampling)
            for x in dist.nonzero().flatten().tolist():
                nxt[prefix + bytes([x])] = pr * float(dist[x])
        frontier = nxt
    expected = frontier
    assert len(expected) == 8
    n, outputs, stats = 8000, [], []
    decoder = Decoder(model, costs=_FLAT, compile="off")
    for _ in range(n // 2000):
        batch = decoder.generate([b""] * 2000, max_bytes=3, draft="chain-all", sampling=sampling)
        outputs += [g.output for g in batch]
        stats += [g.stats for g in batch]
    assert set(outputs) <= set(expected)
    chi2 = sum((outputs.count(x) - n * p) ** 2 / (n * p) for x, p in expected.items())
    assert chi2 < chi2_critical(len(expected) - 1), chi2
    drafted, accepted = sum(sum(s.drafted) for s in stats), sum(sum(s.accepted) for s in stats)
    assert 0 < accepted < drafted


def _batch(seed: int = 0, B: int = 3, W: int = 40) -> torch.Tensor:
    return torch.randint(0, 256, (B, W), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("design", DESIGNS)
@pytest.mark.parametrize("divergence", ["kl", "tv"])
def test_a_draft_step_trains_the_draft_heads_alone_and_lowers_their_loss(design, divergence):
    model = tiny_model(draft=design)
    set_trainable(model, "draft-heads")
    loss_cfg = C.LossConfig(teacher_weight=1.0, draft_data_weight=0.0, teacher_divergence=divergence)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = _batch(W=model.config.seq_len // 2 + model.config.n_future)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    first: LossOutput | None = None
    for _ in range(25):
        opt.zero_grad()
        out = draft_forward_backward(model, ids, loss_cfg=loss_cfg)
        first = first or out
        opt.step()
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) != n.startswith("drafter."), n
    assert float(out.head_loss[0]) == pytest.approx(float(first.head_loss[0]))  # head 1 frozen
    assert float(out.head_kl[1:].sum()) < 0.7 * float(first.head_kl[1:].sum())
    if divergence == "tv":
        assert 0 <= float(out.head_kl.max()) <= 1


def test_the_total_variation_is_one_minus_the_acceptance_of_speculative_sampling():
    from bytemtp.model.loss import Reference, Teacher, head_loss

    p = torch.softmax(torch.randn(1, 2, 7), -1)
    q_logits = torch.randn(1, 2, 7)
    ref = Reference(greedy_BT=p.argmax(-1), logq_BTV=p.log())
    h = head_loss(q_logits, torch.zeros(1, 2, dtype=torch.long), k=1, ref=ref, teacher=Teacher(1.0, divergence="tv"))
    accept = torch.minimum(p[0, 1], torch.softmax(q_logits[0, 0], -1)).sum()  # sum_x min(p, q)
    assert float(h.kl) == pytest.approx(1 - float(accept), rel=1e-5)


@pytest.mark.parametrize("design", DESIGNS)
def test_draft_heads_survive_a_checkpoint(design, tmp_path):
    model = _drafted_model(design)
    cfg = dataclasses.replace(config_io.tiny(), model=model.config,
                              train=dataclasses.replace(config_io.tiny().train, trainable="draft-heads"))
    ckpt = save_checkpoint(tmp_path / "run", step=1, model=model, config=cfg, train_state={})
    loaded, saved = load_model(ckpt)
    assert saved.model.draft == design
    ids = torch.randint(0, 256, (1, 13))
    layout = build_layout(model, ids[:, :5])
    for a, b in zip(forced_logits(model, ids, 5, layout=layout), forced_logits(loaded, ids, 5, layout=layout)):
        torch.testing.assert_close(a, b)
    assert [g.output for g in Decoder(loaded, compile=Compile.OFF).generate([b"ab"], max_bytes=30)] == \
        [generate(model, b"ab", max_bytes=30).output]


def test_what_a_user_can_get_wrong_about_draft_heads():
    with pytest.raises(ValueError, match="model.draft='eagle'"):
        C.ModelConfig(draft="eagle")
    with pytest.raises(ValueError, match="n_future >= 2"):
        C.ModelConfig(n_future=1, draft="medusa")
    with pytest.raises(ValueError, match="train.trainable=draft-heads"):
        config_io.apply_overrides(config_io.tiny(), ["model.draft=medusa"])
    with pytest.raises(ValueError, match="loss.teacher_divergence"):
        C.LossConfig(teacher_divergence="js")


@pytest.mark.parametrize("design", [None, "medusa"])
def test_a_draft_confidence_ends_drafts_early_and_greedy_output_stays_plain(design):
    """`Decoder(confidence=)`: a row's heads' drafts end where the heads' own probability that their
    top chain is right so far falls below it; at 1.0 nothing is ever sure enough, so nothing is
    drafted from the heads; the output is plain greedy's at every setting."""
    model = _drafted_model(design) if design else rare_eos_model(0)
    prompts = [b"def main():\n    return", b"abcabcabc"]
    want = [generate(model, p, max_bytes=60).output for p in prompts]
    drafted = {}
    for confidence in (0.0, 1e-3, 1.0):
        got = Decoder(model, compile="off", confidence=confidence).generate(prompts, max_bytes=60, draft="chain-all")
        assert [g.output for g in got] == want
        drafted[confidence] = sum(sum(g.stats.drafted) for g in got)
    assert drafted[1.0] == 0 < drafted[1e-3] < drafted[0.0]
    with pytest.raises(ValueError, match="confidence=1.5"):
        Decoder(model, confidence=1.5)
