"""What a generation call takes (bytemtp.decoding.generation): prompts as bytes or str, and the
errors for what is neither."""

import pytest
from doubles import rare_eos_model

from bytemtp.decoding import decode
from bytemtp.decoding.drafting import Draft


def test_the_python_api_takes_str_prompts_as_utf8():
    model = rare_eos_model()
    want = decode.generate_batch(model, [b"def parse(", "é".encode()], max_bytes=12, draft=Draft(4))
    got = decode.generate_batch(model, ["def parse(", "é"], max_bytes=12, draft=Draft(4), stop=())
    assert [g.output for g in got] == [w.output for w in want]
    assert decode.generate(model, "def parse(", max_bytes=12).output == want[0].output
    assert decode.generate_speculative(model, "é", max_bytes=12, draft=Draft(4)).output == want[1].output
    with pytest.raises(TypeError, match=r"for one prompt pass \[prompt\]"):
        decode.generate_batch(model, "def parse(", max_bytes=4)
    with pytest.raises(TypeError, match="a prompt is bytes or str, not int"):
        decode.generate_batch(model, [7], max_bytes=4)
    with pytest.raises(ValueError, match=r"^heads=9 is not allowed") as error:
        decode.generate_batch(model, ["x"], max_bytes=4, draft=Draft(9))
    assert "--" not in str(error.value)  # library errors name arguments, not the CLI's flags
