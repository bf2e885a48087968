"""Self-generated targets (bytemtp.training.rollout): a greedy rollout writes what plain greedy
decoding writes (`decode.generate`, its next-byte rule), in eval mode whatever the model's mode,
with or without document masking (an EOS it writes starts a document), and rollouts need a frozen
trunk."""

import pytest
import torch
from doubles import tiny_model

from bytemtp import config_io
from bytemtp.decoding.decode import generate
from bytemtp.decoding.sampling import Sampling, next_byte
from bytemtp.model.layout import build_layout
from bytemtp.training.rollout import greedy_rollout
from bytemtp.vocab import BOS, EOS, PAD, VOCAB_SIZE


def _never_emitted_first(seed: int = 3, **overrides):
    """A tiny model with dropout whose next-byte head ranks the ids that decoding never emits (BOS,
    PAD, the padding ids) above every byte and EOS below them, so that a rollout that chose from
    all ids, or stopped short of masking them, writes ids no greedy decoding writes."""
    model = tiny_model(seed, n_future=4, dropout=0.1, **overrides)
    old = model.unembed[0]
    new = torch.nn.Linear(old.in_features, VOCAB_SIZE, bias=True)
    with torch.no_grad():
        new.weight.copy_(old.weight)
        new.bias.zero_()
        new.bias[BOS] = new.bias[PAD] = 100.0
        new.bias[EOS + 2:] = 100.0
        new.bias[EOS] = -100.0  # no EOS: plain decoding writes all the bytes the rollout does
    model.unembed[0] = new
    return model


@pytest.mark.parametrize("doc_mask", [False, True])
def test_a_greedy_rollout_writes_what_plain_greedy_decoding_writes(doc_mask):
    model = _never_emitted_first(doc_mask=doc_mask)
    cfg = model.config
    T, n = cfg.seq_len, 20
    start = T + 1 - n
    ids = torch.randint(0, 256, (3, cfg.window), generator=torch.Generator().manual_seed(4))
    ids[:, 0] = EOS  # each window starts a document, as decoding's context does
    ids[1, 5] = EOS  # and one holds a second document
    model.train()
    got = greedy_rollout(model, ids, n)
    assert model.training  # mode kept
    assert torch.equal(got[:, :start], ids[:, :start]) and (got[:, T + 1:] == PAD).all()
    assert (got[:, start:T + 1] < 256).all(), "a rollout wrote an id that decoding never emits"
    model.eval()
    with torch.no_grad():
        for j in range(start, T + 1):  # each written byte: decoding's rule after the ids before it
            prefix = got[:, :j]
            logits = model.logits(prefix, heads=1, layout=build_layout(model, prefix))[:, -1, 0]
            want = [next_byte(logits[b], Sampling()) for b in range(len(ids))]
            assert got[:, j].tolist() == want, j
    for b in (0, 2):  # one document a window: plain greedy decoding of its start writes the same bytes
        prompt = bytes(ids[b, 1:start].tolist())
        assert generate(model, prompt, max_bytes=n).output == bytes(got[b, start:T + 1].tolist()), b
    assert torch.equal(greedy_rollout(model, ids, n), got) and not model.training  # eval kept too
    with pytest.raises(ValueError, match="does not fit"):
        greedy_rollout(model, ids, T + 1)


def test_a_document_masked_rollout_that_writes_eos_starts_a_document_there():
    """A doc-masked model whose next-byte head says EOS where it would say its favourite byte:
    the rollout writes EOS several times in every row, and each byte after one is what the
    uncached doc-masked pass over the ids so far chooses."""
    model = tiny_model(1, n_future=4, doc_mask=True).eval()
    cfg = model.config
    T, n = cfg.seq_len, 40
    start = T + 1 - n
    ids = torch.randint(0, 256, (3, cfg.window), generator=torch.Generator().manual_seed(4))
    ids[0, 0] = EOS
    ids[1, [5, 6, 20]] = EOS  # documents in the prefix too
    with torch.no_grad():
        model.unembed[0].weight[EOS] = model.unembed[0].weight[154] * 1.001  # 154: this model's favourite
    got = greedy_rollout(model, ids, n)
    written = got[:, start:T + 1]
    assert ((written == EOS).sum(dim=1) > 1).all() and (written != EOS).any(dim=1).all()
    with torch.no_grad():
        for j in range(start, T + 1):
            prefix = got[:, :j]
            logits = model.logits(prefix, heads=1, layout=build_layout(model, prefix))[:, -1, 0]
            assert got[:, j].tolist() == [next_byte(logits[b], Sampling()) for b in range(len(ids))], j


def test_rollouts_need_a_frozen_trunk():
    with pytest.raises(ValueError, match="trainable=draft-heads"):
        config_io.apply_overrides(config_io.tiny(), ["loss.rollout_bytes=16"])
    config_io.apply_overrides(config_io.tiny(), ["loss.rollout_bytes=16", "train.trainable=draft-heads"])


@pytest.mark.parametrize("doc_mask", [False, True])
def test_a_rollout_through_compiled_blocks_runs_them_eagerly_and_compiles_nothing(doc_mask):
    """Compiled training's blocks (each compiled alone, `step.compile_blocks`) run the rollout's
    cached passes uncompiled: no graph for any of the ten layers or pass shapes, so dynamo never
    reaches its recompile limit and warns, and the training step keeps its graphs; the rollout
    writes what the eager blocks write. (Dynamo's eager backend: which graphs it would make does not
    depend on the backend, and it takes no compile.)"""
    import copy
    import logging

    from torch._dynamo.utils import counters

    from bytemtp.model.model import Block

    model = tiny_model(3, n_future=4, doc_mask=doc_mask).eval()
    eager = copy.deepcopy(model)
    for module in model.modules():
        if isinstance(module, Block):
            module.compile(backend="eager")
    assert model.config.total_layers == 10 > torch._dynamo.config.recompile_limit
    ids = torch.randint(0, 256, (3, model.config.window), generator=torch.Generator().manual_seed(4))
    ids[:, 0] = EOS
    torch._dynamo.reset()
    counters.clear()
    warned = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = warned.append
    dynamo_log = logging.getLogger("torch._dynamo")  # it does not propagate: caplog would not see it
    dynamo_log.addHandler(handler)
    try:
        for n in (20, 12):  # two prefixes: two shapes of the prefix's pass
            assert torch.equal(greedy_rollout(model, ids, n), greedy_rollout(eager, ids, n)), n
        assert counters["stats"]["unique_graphs"] == 0, dict(counters["stats"])
        model(ids[:, :16], layout=build_layout(model, ids[:, :16]))  # outside a rollout, the blocks compile
        assert counters["stats"]["unique_graphs"] == 1
    finally:
        dynamo_log.removeHandler(handler)
        torch._dynamo.reset()
    assert [r.getMessage() for r in warned] == []
