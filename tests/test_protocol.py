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


@pytest.mark.parametrize("text,param,shown", [
    ('"temperature": NaN', "temperature", "nan"),  # Python's json reads NaN and the infinities
    ('"temperature": Infinity', "temperature", "inf"),
    ('"temperature": -Infinity', "temperature", "-inf"),
    ('"temperature": 1e309', "temperature", "inf"),  # past the largest float: infinity
    ('"temperature": ' + "9" * 400, "temperature", "999"),  # an integer past the largest float
    ('"top_p": NaN', "top_p", "nan"),
    ('"top_p": Infinity', "top_p", "inf"),
    ('"seed": 18446744073709551616', "seed", "18446744073709551616"),  # 2**64: past a generator's seed
    ('"seed": -9223372036854775809', "seed", "-9223372036854775809"),  # below -2**63
    ('"seed": NaN', "seed", "nan"),
    ('"n": Infinity', "n", "inf"),
    ('"best_of": NaN', "best_of", "nan"),
    ('"presence_penalty": NaN', "presence_penalty", "nan"),
    ('"model": NaN', "model", "nan"),
], ids=lambda value: value if len(value) < 40 else value[:30] + "...")
def test_non_finite_and_out_of_range_numbers_are_refused_by_field_and_value(text, param, shown):
    import json

    with pytest.raises(ApiError) as e:
        parse_completion(json.loads('{"prompt": "x", ' + text + "}"), model_name="m", max_prompt_bytes=100)
    assert e.value.status == 400 and e.value.param == param
    assert param in e.value.message and shown in e.value.message


def test_seeds_span_64_bits_and_tiny_temperatures_are_greedy():
    from bytemtp.decoding.sampling import Sampling

    GREEDY_BELOW = Sampling.GREEDY_BELOW  # the server asks Sampling, the one owner of the rule
    assert _parse(prompt="x", seed=2 ** 64 - 1).seed == 2 ** 64 - 1
    assert _parse(prompt="x", seed=-2 ** 63).seed == -2 ** 63
    for tiny in (1e-45, 5e-324, GREEDY_BELOW / 2):
        assert _parse(prompt="x", temperature=tiny).temperature == 0.0  # decodes greedily, as 0 does
    assert _parse(prompt="x", temperature=GREEDY_BELOW).temperature == GREEDY_BELOW
    assert _parse(prompt="x", temperature=2).temperature == 2.0


def test_stop_strings_are_bounded_in_number_and_length():
    import time

    from bytemtp.serving.protocol import MAX_STOP_BYTES, MAX_STOPS

    assert len(_parse(prompt="x", stop=[str(i) for i in range(MAX_STOPS)]).stop) == MAX_STOPS
    assert _parse(prompt="x", stop="é" * (MAX_STOP_BYTES // 2)).stop == ("é".encode() * (MAX_STOP_BYTES // 2),)
    t0 = time.perf_counter()
    with pytest.raises(ApiError, match=f"20000 strings; {MAX_STOPS} at most") as e:
        _parse(prompt="x", stop=[f"s{i}" for i in range(20000)])
    assert e.value.param == "stop" and time.perf_counter() - t0 < 0.5
    with pytest.raises(ApiError, match=f"{MAX_STOP_BYTES + 2} bytes is past the limit of {MAX_STOP_BYTES}") as e:
        _parse(prompt="x", stop=["a", "é" * (MAX_STOP_BYTES // 2 + 1)])
    assert e.value.param == "stop"


def test_the_user_field_is_any_string_and_changes_nothing():
    assert _parse(prompt="x", user="alice@example.com") == _parse(prompt="x")
    assert _parse(prompt="x", user="") == _parse(prompt="x", user=None)
    with pytest.raises(ApiError) as e:
        _parse(prompt="x", user=5)
    assert e.value.param == "user"


def test_a_request_asks_for_max_choices_at_most():
    from bytemtp.serving.protocol import MAX_CHOICES

    assert len(_parse(prompt=["a"] * (MAX_CHOICES // 4), n=4).prompts) == MAX_CHOICES // 4
    with pytest.raises(ApiError, match=f"{MAX_CHOICES} completions at most") as e:
        _parse(prompt=["a"] * (MAX_CHOICES // 4 + 1), n=4)
    assert e.value.status == 400 and e.value.param == "prompt"


def test_api_key_files_and_bearer_headers(tmp_path):
    from bytemtp.serving.protocol import authorized, check_api_key, read_api_keys

    path = tmp_path / "keys"
    path.write_text("# the team's keys\n\n  sk-one  \n#sk-commented\nsk-two\n")
    assert read_api_keys(path) == ["sk-one", "sk-two"]
    for text, match in [(None, "cannot be read"), ("# only a comment\n\n", "holds no key"),
                        ("sk-one\nsk two\n", r"keys:2: an API key is printable ASCII"),
                        (b"\xff\xfe", "cannot be read")]:
        path.unlink(missing_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        elif text is not None:
            path.write_text(text)
        with pytest.raises(ValueError, match=match) as e:
            read_api_keys(path)
        assert str(path) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="cannot be read"):
        read_api_keys(tmp_path)  # a folder
    with pytest.raises(ValueError, match="--api-key"):
        check_api_key("", source="--api-key")
    keys = ("sk-one", "sk-two")
    assert authorized("Bearer sk-one", keys) and authorized("bearer  sk-two ", keys)
    for header in (None, "", "Bearer", "Bearer ", "Bearer sk-on", "Bearer sk-one2", "Basic sk-one", "sk-one",
                   "Bearer sk-one sk-two", "Bearer \udcff", "Bearer é"):
        assert not authorized(header, keys), header
