import math

import pytest
import torch

from bytemtp.loss import IGNORE, future_targets, head_loss, mtp_loss
from bytemtp.vocab import EOS, PAD

X = IGNORE


def test_every_shift_on_a_hand_built_window():
    ids = torch.tensor([[10, 11, EOS, 20, 21, 22, 23]])  # T = 4, n_future = 3
    got = future_targets(ids, n_future=3)
    expected = torch.tensor([[
        [11, EOS, X],    # t=0: head 3's target 20 lies past the EOS at 2
        [EOS, X, X],     # t=1: the EOS itself is a target, what follows is not
        [20, 21, 22],    # t=2 stands on the EOS: the next document is the target
        [21, 22, 23],
    ]])
    assert torch.equal(got, expected)
    kept = future_targets(ids, n_future=3, mask_after_eos=False)
    assert torch.equal(kept, torch.tensor([[[11, EOS, 20], [EOS, 20, 21], [20, 21, 22], [21, 22, 23]]]))


def test_pad_targets_are_ignored():
    ids = torch.tensor([[10, 11, PAD, 20, 21, 22, 23]])  # T = 4, n_future = 3
    got = future_targets(ids, n_future=3)
    expected = torch.tensor([[[11, X, 20], [X, 20, 21], [20, 21, 22], [21, 22, 23]]])
    assert torch.equal(got, expected)


def test_head_k_predicts_k_ahead_on_random_windows():
    torch.manual_seed(0)
    ids = torch.randint(0, 256, (2, 12 + 4))
    t = future_targets(ids, n_future=4)  # T = 12: the window's length less n_future
    for k in range(4):
        assert torch.equal(t[:, :, k], ids[:, k + 1:k + 13])


def test_head_loss_and_accuracy():
    logits = torch.full((1, 3, 264), -10.0)
    logits[0, 0, 5] = 10.0  # right
    logits[0, 1, 6] = 10.0  # wrong (target 7)
    targets = torch.tensor([[5, 7, X]])
    h = head_loss(logits, targets)
    assert h.count.item() == 2 and h.correct.item() == 1
    ce = torch.nn.functional.cross_entropy(logits[0, :2], targets[0, :2])
    torch.testing.assert_close(h.loss, ce)
    torch.testing.assert_close(h.nats, 2 * ce)
    none = head_loss(logits, torch.full((1, 3), X))
    assert none.loss.item() == 0.0 and none.count.item() == 0


def test_mtp_loss_sums_heads_with_weights():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 3, 264)
    targets = torch.randint(0, 256, (2, 5, 3))
    targets[0, 4, 2] = X
    out = mtp_loss(logits, targets, [1.0, 1.0, 1.0])
    per_head = [head_loss(logits[:, :, k], targets[:, :, k]).loss for k in range(3)]
    torch.testing.assert_close(out.total, sum(per_head))
    torch.testing.assert_close(out.head_loss, torch.stack(per_head))
    assert out.head_count.tolist() == [10, 10, 9]
    weighted = mtp_loss(logits, targets, [1.0, 0.5, 0.25])
    torch.testing.assert_close(weighted.total, per_head[0] + 0.5 * per_head[1] + 0.25 * per_head[2])
    uniform = torch.zeros(1, 1, 1, 264)
    assert math.isclose(mtp_loss(uniform, torch.tensor([[[3]]]), [1.0]).total.item(), math.log(264),
                        rel_tol=1e-6)


def test_a_window_without_inputs_is_rejected():
    with pytest.raises(ValueError, match="holds no input"):
        future_targets(torch.zeros(1, 2, dtype=torch.long), n_future=2)
