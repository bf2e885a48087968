import math

import pytest
import torch

from bytemtp.model.loss import IGNORE, Teacher, future_targets, head_loss, mtp_loss
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


def _teacher_by_hand(logits, targets, weights, teacher):
    """The teacher objective written out position by position: head k at t against head 1 at t + k."""
    B, T, K, _ = logits.shape
    total = 0.0
    for k in range(K):
        valid = targets[:, :, k] != X
        data = torch.nn.functional.cross_entropy(logits[:, :, k][valid], targets[:, :, k][valid])
        if k == 0:
            total = total + weights[0] * data
            continue
        kls, agree = [], 0
        for b in range(B):
            for t in range(T - k):
                if targets[b, t, k] == X:
                    continue
                q = torch.softmax(logits[b, t + k, 0].detach() / teacher.temperature, dim=-1)
                logp = torch.log_softmax(logits[b, t, k], dim=-1)
                kls.append((q * (q.log() - logp)).sum())
                agree += int(logits[b, t, k].argmax() == logits[b, t + k, 0].argmax())
        kl = torch.stack(kls).mean()
        total = total + weights[k] * (teacher.data_weight * data + teacher.weight * kl)
        yield k, kl.detach(), agree / len(kls)
    yield "total", total, None


def test_the_teacher_term_equals_its_definition_in_value_and_gradient():
    torch.manual_seed(0)
    B, T, K = 2, 6, 4
    logits = torch.randn(B, T, K, 264, requires_grad=True)
    targets = torch.randint(0, 256, (B, T, K))
    targets[0, 1, 2] = targets[1, 0, 3] = targets[1, 4, 1] = X
    weights, teacher = [1.0, 0.8, 0.64, 0.5], Teacher(weight=0.7, temperature=0.5, data_weight=0.3)
    out = mtp_loss(logits, targets, weights, teacher)
    (got,) = torch.autograd.grad(out.total, logits)
    by_hand = dict((k, (kl, agree)) for k, kl, agree in _teacher_by_hand(logits, targets, weights, teacher))
    expected_total = by_hand.pop("total")[0]
    (expected,) = torch.autograd.grad(expected_total, logits)
    torch.testing.assert_close(out.total, expected_total.detach())
    torch.testing.assert_close(got, expected)
    assert got[:, :, 0].abs().sum() > 0  # head 1 learns from the data only: its teacher role is detached
    for k, (kl, agree) in by_hand.items():
        torch.testing.assert_close(out.head_kl[k], kl)
        assert out.head_agreement[k].item() == pytest.approx(agree)
    assert out.head_agreement[0].item() == 1.0 and out.head_kl[0].item() == 0.0


def test_head_1_gets_no_gradient_from_the_teacher_term():
    torch.manual_seed(1)
    logits = torch.randn(1, 5, 3, 264, requires_grad=True)
    targets = torch.randint(0, 256, (1, 5, 3))
    plain = mtp_loss(logits, targets, [1.0] * 3)
    (g_plain,) = torch.autograd.grad(plain.total, logits)
    taught = mtp_loss(logits, targets, [1.0] * 3, Teacher(weight=2.0))
    (g_taught,) = torch.autograd.grad(taught.total, logits)
    assert torch.equal(g_taught[:, :, 0], g_plain[:, :, 0])
    assert not torch.allclose(g_taught[:, :, 1:], g_plain[:, :, 1:])


def test_agreement_counts_equal_greedy_bytes_where_head_1_is_next():
    logits = torch.full((1, 4, 2, 264), -5.0)
    head1 = [7, 8, 9, 10]  # head 1's greedy bytes at t = 0..3
    head2 = [8, 1, 10, 3]  # head 2 at t matches head 1 at t + 1 for t = 0 and 2; t = 3 has no partner
    for t in range(4):
        logits[0, t, 0, head1[t]] = 5.0
        logits[0, t, 1, head2[t]] = 5.0
    targets = torch.randint(0, 256, (1, 4, 2))
    out = mtp_loss(logits, targets, [1.0, 1.0])
    assert out.head_agreement.tolist() == [1.0, pytest.approx(2 / 3)]
    targets[0, 1, 1] = X  # a pair across a document boundary is not counted
    assert mtp_loss(logits, targets, [1.0, 1.0]).head_agreement[1].item() == 1.0


def test_without_the_teacher_the_total_is_the_plain_weighted_sum_to_the_bit():
    torch.manual_seed(2)
    logits = torch.randn(2, 7, 4, 264)
    targets = torch.randint(0, 256, (2, 7, 4))
    out = mtp_loss(logits, targets, [1.0, 0.5, 0.25, 0.125])
    per_head = [head_loss(logits[:, :, k], targets[:, :, k]).loss for k in range(4)]
    assert torch.equal(out.total, 1.0 * per_head[0] + 0.5 * per_head[1] + 0.25 * per_head[2] + 0.125 * per_head[3])
