"""The completions protocol over bytes (bytemtp.serving.protocol): every field checked and named,
prompts as text or byte ids, and streamed text that never shows a stop string or half a character."""

import pytest

from bytemtp.serving.protocol import (ApiError, StreamText, logprobs_body, parse_completion, text_offsets, token_text,
                                      trim_stop)


def _parse(**body):
    return parse_completion(body, model_name="m", max_prompt_bytes=100)


def test_defaults_are_openais_and_prompts_may_be_text_or_byte_ids():
    req = _parse(prompt="hé")
    assert req.prompts == ["hé".encode()] and req.max_tokens == 16 and req.temperature == 1.0 and req.n == 1
    req = _parse(prompt=[[257, 104, 105], [104], "x"], model="m", stop="\n", top_k=-1, stream_options={"include_usage": True})
    assert req.prompts == [b"hi", b"h", b"x"] and req.leading_eos == [True, False, False]
    assert req.stop == (b"\n",) and req.top_k == 0 and req.include_usage


@pytest.mark.parametrize("body,status,param", [
    ({"prompt": "x", "max_token": 3}, 400, "max_token"),  # a misspelt field is not ignored
    ({"prompt": "x", "max_tokens": "3"}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": True}, 400, "max_tokens"),
    ({"prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"prompt": "x", "stream": "yes"}, 400, "stream"),
    ({"prompt": "x", "stop": [1]}, 400, "stop"),
    ({"prompt": "x", "n": 0}, 400, "n"),
    ({"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ({"prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty"),
    ({"prompt": "x", "best_of": 3}, 400, "best_of"),
    ({"prompt": [104, 300]}, 400, "prompt"),
    ({"prompt": [104, 257]}, 400, "prompt"),  # EOS only first
    ({"prompt": [[104], 3]}, 400, "prompt"),
    ({"prompt": {"a": 1}}, 400, "prompt"),
    ({"max_tokens": 3}, 400, "prompt"),
    ({"prompt": "x" * 101}, 413, "prompt"),
    ({"prompt": "x", "model": "other"}, 404, "model"),
])
def test_a_bad_field_is_refused_by_name(body, status, param):
    with pytest.raises(ApiError) as e:
        _parse(**body)
    assert e.value.status == status and e.value.param == param


def test_a_body_that_is_not_an_object_is_refused():
    with pytest.raises(ApiError, match="not an object"):
        parse_completion([1], model_name="m", max_prompt_bytes=10)


def test_stream_text_holds_back_stop_prefixes_and_split_characters():
    s = StreamText((b"END",))
    assert s.push(b"ab") == "ab"
    assert s.push(b"cE") == "c"  # E may start END
    assert s.push(b"x") == "Ex"  # it did not
    assert s.push("é".encode()[:1]) == ""  # half a character waits
    assert s.push("é".encode()[1:] + b"EN") == "é"
    assert s.push(b"D") == ""  # the stop string is never shown
    assert s.finish("stop") == ""
    s = StreamText((b"END",))
    assert s.push(b"xEN") == "x" and s.finish("max_bytes") == "EN"  # decoding ended on a prefix: it is text
    s = StreamText(())
    assert s.push(b"a\xff") == "a\ufffd" and s.push(b"\xe2\x82") == "" and s.finish("max_bytes") == "\ufffd"


def test_trim_stop_and_token_texts():
    assert trim_stop(b"abc\n\n", (b"\n\n",), "stop") == b"abc" and trim_stop(b"abc\n\n", (b"\n\n",), "eos") == b"abc\n\n"
    assert [token_text(i) for i in (97, 10, 0xe9, 257)] == ["a", "\n", "bytes:\\xe9", "<eos>"]
    assert text_offsets("aé b".encode()) == [0, 1, 1, 2, 3]
    body = logprobs_body([257, 104, 105], [None, -1.0, -2.0], [None, [(104, -1.0)], [(106, -0.5)]], text=b"hi")
    assert body["tokens"] == ["<eos>", "h", "i"] and body["text_offset"] == [0, 0, 1]
    assert body["top_logprobs"] == [None, {"h": -1.0}, {"j": -0.5}]
