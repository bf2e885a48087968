"""The byte vocabulary (bytemtp.vocab): `TextStream` keeps UTF-8 characters whole."""

from bytemtp.vocab import TextStream


def test_text_stream_keeps_characters_whole():
    data = "naïve ☃ 🎉".encode() + b"\xff" + "ok".encode()
    stream = TextStream()
    pieces = [stream.feed(data[i:i + 1]) for i in range(len(data))] + [stream.finish()]
    assert "".join(pieces) == data.decode("utf-8", errors="replace")
    assert all("\ufffd" not in p for p in pieces[: len(data) - 3])
