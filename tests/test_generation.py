"""bytemtp.decoding.generation: decode statistics summed in one place."""

from bytemtp.decoding.generation import DecodeStats, SpeculativeStats


def test_total_adds_plain_and_speculative_statistics():
    plain = DecodeStats(bytes_out=5, forward_passes=5, wall_s=0.5, stopped_by="eos")
    a = SpeculativeStats(bytes_out=6, forward_passes=2, wall_s=0.25, drafted=[2, 1], accepted=[2, 0],
                         heads_used={4: 2}, shapes={"chain-4": 2}, slides=1)
    b = SpeculativeStats(bytes_out=3, forward_passes=1, drafted=[1, 1, 1], accepted=[1, 1, 0],
                         heads_used={2: 1, 4: 1}, shapes={"tree-4": 1, "chain-4": 1})
    got = SpeculativeStats.total([a, plain, b])
    assert (got.bytes_out, got.forward_passes, got.wall_s, got.slides) == (14, 8, 0.75, 1)
    assert got.drafted == [3, 2, 1] and got.accepted == [3, 1, 0]
    assert list(got.heads_used.items()) == [(4, 3), (2, 1)]  # in the order first seen
    assert list(got.shapes.items()) == [("chain-4", 3), ("tree-4", 1)]
    assert got.stopped_by == "" and got.bytes_per_forward == 14 / 8
    assert SpeculativeStats.total([]).bytes_per_forward == 0.0
