"""bytemtp.decoding.generation: what a generation call takes (prompts as bytes or str, and the
errors for what is neither), and decode statistics summed in one place."""

import pytest
from doubles import generate_batch, generate_speculative, rare_eos_model

from bytemtp.decoding import decode
from bytemtp.decoding.generation import DecodeStats, SpeculativeStats
from bytemtp.decoding.strategy import Draft


def test_the_python_api_takes_str_prompts_as_utf8():
    model = rare_eos_model()
    want = generate_batch(model, [b"def parse(", "é".encode()], max_bytes=12, draft=Draft(4))
    got = generate_batch(model, ["def parse(", "é"], max_bytes=12, draft=Draft(4), stop=())
    assert [g.output for g in got] == [w.output for w in want]
    assert decode.generate(model, "def parse(", max_bytes=12).output == want[0].output
    assert generate_speculative(model, "é", max_bytes=12, draft=Draft(4)).output == want[1].output
    with pytest.raises(TypeError, match=r"for one prompt pass \[prompt\]"):
        generate_batch(model, "def parse(", max_bytes=4)
    with pytest.raises(TypeError, match="a prompt is bytes or str, not int"):
        generate_batch(model, [7], max_bytes=4)
    with pytest.raises(ValueError, match=r"^heads=9 is not allowed") as error:
        generate_batch(model, ["x"], max_bytes=4, draft=Draft(9))
    assert "--" not in str(error.value)  # library errors name arguments, not the CLI's flags


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
