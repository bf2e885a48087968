"""`bytemtp serve` as a user runs it: a process that listens, answers, and stops cleanly on
Ctrl-C; bad options and a missing extra as one line."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import requests
from click.testing import CliRunner

from bytemtp_cli.main import main


@pytest.mark.slow
def test_serve_listens_answers_and_stops_on_ctrl_c(short_run):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "bytemtp_cli", "serve", "--ckpt", str(short_run), "--port", "0",
                             "--max-batch", "2", "--draft", "plain"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        url, lines, deadline = None, [], time.time() + 120
        while url is None and time.time() < deadline:
            line = proc.stderr.readline()
            lines.append(line)
            if match := re.search(r"serving short on (http://\S+)/v1", line):
                url = match.group(1)
            assert line or proc.poll() is None, "".join(lines)
        assert url, "".join(lines)
        r = requests.post(url + "/v1/completions", json={"model": "short", "prompt": "ab", "max_tokens": 5,
                                                         "temperature": 0}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 5
        assert requests.get(url + "/health", timeout=10).json()["status"] == "ok"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        proc.kill()


def test_a_bad_checkpoint_or_draft_is_one_line(tmp_path):
    result = CliRunner().invoke(main, ["serve", "--ckpt", str(tmp_path / "nothing")])
    assert result.exit_code != 0 and "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    result = CliRunner().invoke(main, ["serve", "--ckpt", str(tmp_path), "--draft", "zigzag"])
    assert result.exit_code == 2 and "zigzag" in result.output


def test_without_aiohttp_the_error_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "aiohttp", None)
    monkeypatch.delitem(sys.modules, "bytemtp.serving.app", raising=False)
    result = CliRunner().invoke(main, ["serve", "--ckpt", str(tmp_path)])
    assert result.exit_code == 1 and "bytemtp[serve]" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("mode", ["on", "off"])
def test_compile_reaches_the_engines_decoder(short_run, monkeypatch, mode):
    """`serve --compile on` hands the engine a decoder whose passes run the compiled step (the
    engine's test decodes on it); off keeps them eager."""
    from bytemtp.decoding.compiled import Compile
    from bytemtp.serving import app
    from bytemtp.serving.engine import Engine

    seen = []
    monkeypatch.setattr(Engine, "start", lambda self, progress=None: seen.append(self.decoder.policy.mode))
    monkeypatch.setattr(app, "serve", lambda server, **kw: None)
    result = CliRunner().invoke(main, ["serve", "--ckpt", str(short_run), "--compile", mode, "--draft", "plain"])
    assert result.exit_code == 0, result.output
    assert seen == [Compile(mode)]


def test_api_keys_come_from_flags_a_file_and_the_environment_and_off_the_loopback_a_warning(short_run, monkeypatch,
                                                                                            tmp_path):
    """What `serve` hands its server, and the one warning line for a server open to every interface
    without a key (here bound on the loopback all the same)."""
    import socket as socket_module

    from bytemtp.serving import app
    from bytemtp.serving.engine import Engine

    seen = []
    monkeypatch.setattr(Engine, "start", lambda self, progress=None: None)
    monkeypatch.setattr(app, "serve", lambda server, **kw: seen.append(server.api_keys))
    monkeypatch.setattr(app, "listen", lambda host, port: socket_module.create_server(("127.0.0.1", 0)),
                        raising=False)  # what binds: on the loopback, whatever the host
    monkeypatch.delenv("BYTEMTP_API_KEY", raising=False)
    keys = tmp_path / "keys"
    keys.write_text("# keys for the team\n\nsk-file\n  sk-one\n")

    def run(*args, env=None):
        seen.clear()
        result = CliRunner().invoke(main, ["serve", "--ckpt", str(short_run), "--port", "0", "--draft", "plain", *args],
                                    env=env)
        assert result.exit_code == 0 and "Traceback" not in result.output, result.output
        warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
        return seen[0], warnings

    assert run("--api-key", "sk-one", "--api-key", "sk-two", "--api-key-file", str(keys)) == \
        (("sk-one", "sk-two", "sk-file"), [])
    assert run(env={"BYTEMTP_API_KEY": "sk-env"}) == (("sk-env",), [])
    assert run("--api-key", "sk-one", env={"BYTEMTP_API_KEY": "sk-env"}) == (("sk-one",), [])  # the flag wins
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1"):
        assert run("--host", host) == ((), []), host
    for host in ("0.0.0.0", "::", "192.0.2.7", "example.com"):
        got, warnings = run("--host", host)
        assert got == () and len(warnings) == 1 and host in warnings[0] and "API key" in warnings[0], (host, warnings)
        assert run("--host", host, "--api-key", "sk-one")[1] == []


@pytest.mark.parametrize("args,match", [
    (["--api-key-file", "{tmp}/missing"], "missing cannot be read"),
    (["--api-key-file", "{tmp}"], "cannot be read"),  # a folder
    (["--api-key-file", "{tmp}/empty"], "empty holds no key"),
    (["--api-key-file", "{tmp}/spaced"], "spaced:2: an API key is printable ASCII"),
    (["--api-key", ""], "--api-key: an API key"),
    (["--api-key", "two words"], "--api-key: an API key"),
])
def test_a_bad_api_key_or_key_file_is_one_line_before_the_model_loads(tmp_path, args, match):
    (tmp_path / "empty").write_text("# nothing yet\n\n")
    (tmp_path / "spaced").write_text("sk-one\nsk two\n")
    args = [a.format(tmp=tmp_path) for a in args]
    result = CliRunner().invoke(main, ["serve", "--ckpt", str(tmp_path / "no-checkpoint"), "--port", "0", *args])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and match in result.output, result.output


def test_serve_help_tells_how_to_set_an_api_key():
    text = CliRunner().invoke(main, ["serve", "--help"]).output
    assert "no authentication" not in text and "--api-key-file" in text and "BYTEMTP_API_KEY" in text
