"""Self-generated targets (bytemtp.training.rollout): a greedy rollout is head 1's greedy
continuation, and rollouts need a frozen trunk."""

import pytest
import torch

from bytemtp import config as C
from bytemtp.model.layout import build_layout


def test_a_greedy_rollout_is_head_1s_greedy_continuation_position_by_position():
    from bytemtp.model.model import ByteMTP
    from bytemtp.training.rollout import greedy_rollout
    from bytemtp.vocab import EOS, PAD

    cfg = C.apply_overrides(C.tiny(), ["model.n_future=4"]).model
    model = ByteMTP(cfg)
    model.init_weights(generator=torch.Generator().manual_seed(3))
    model.train()
    ids = torch.randint(0, 256, (3, cfg.window), generator=torch.Generator().manual_seed(4))
    ids[1, 5] = EOS
    T, n = cfg.seq_len, 20
    got = greedy_rollout(model, ids, n)
    assert model.training  # mode kept
    assert torch.equal(got[:, :T + 1 - n], ids[:, :T + 1 - n]) and (got[:, T + 1:] == PAD).all()
    with torch.no_grad():
        model.eval()
        for j in range(T + 1 - n, T + 1):  # each written byte: head 1's argmax after the ids before it
            prefix = got[:, :j]
            want = model.logits(prefix, heads=1, layout=build_layout(model, prefix))[:, -1, 0, :EOS + 1].argmax(-1)
            assert torch.equal(got[:, j], want), j
    with pytest.raises(ValueError, match="does not fit"):
        greedy_rollout(model, ids, T + 1)


def test_rollouts_need_a_frozen_trunk():
    with pytest.raises(ValueError, match="trainable=draft-heads"):
        C.apply_overrides(C.tiny(), ["loss.rollout_bytes=16"])
    C.apply_overrides(C.tiny(), ["loss.rollout_bytes=16", "train.trainable=draft-heads"])
