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
