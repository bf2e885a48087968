"""`bytemtp serve` as a user runs it: a process that listens, answers, and stops cleanly on
Ctrl-C and on SIGTERM (the streams in flight end with an error event and [DONE] at the grace
period's end, a second signal at once); a port in use, an address not on this host, bad options
and a missing extra as one line, the port before the model loads."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
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
    result = CliRunner().invoke(main, ["serve", "--ckpt", str(tmp_path / "nothing"), "--port", "0"])
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
    result = CliRunner().invoke(main, ["serve", "--ckpt", str(short_run), "--compile", mode, "--draft", "plain",
                                       "--port", "0"])
    assert result.exit_code == 0, result.output
    assert seen == [Compile(mode)]


def test_a_port_in_use_or_an_address_not_here_fails_at_once_before_the_model_loads(tmp_path, monkeypatch):
    from bytemtp.runtime import checkpoint

    loads = []
    monkeypatch.setattr(checkpoint, "load_model", lambda *a, **kw: loads.append(a) or pytest.fail("loaded"))
    ckpt = str(tmp_path / "nothing")  # would fail to load, with another message
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = CliRunner().invoke(main, ["serve", "--ckpt", ckpt, "--port", str(port)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip() == f"Error: cannot listen on 127.0.0.1:{port}: address already in use"
    result = CliRunner().invoke(main, ["serve", "--ckpt", ckpt, "--host", "192.0.2.1", "--port", "8000",  # TEST-NET-1
                                       "--api-key", "k"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip() == "Error: cannot listen on 192.0.2.1:8000: the address is not on this host"
    assert loads == []


@pytest.fixture
def long_run(tmp_path):
    """A checkpoint of a tiny model whose EOS is rare, so that its streams run long."""
    from doubles import rare_eos_model

    from bytemtp.config_io import tiny
    from bytemtp.runtime.checkpoint import save_checkpoint

    save_checkpoint(tmp_path / "long", step=1, model=rare_eos_model(), config=tiny(), train_state={})
    return tmp_path / "long"


def _start_server(run, *args: str) -> tuple[subprocess.Popen, str]:
    """`bytemtp serve` on the run, plainly decoding on any free port: the process and its URL."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "bytemtp_cli", "serve", "--ckpt", str(run), "--port", "0",
                             "--draft", "plain", "--compile", "off", *args],
                            stderr=subprocess.PIPE, text=True, env=env)
    lines, deadline = [], time.time() + 120
    while time.time() < deadline:
        line = proc.stderr.readline()
        lines.append(line)
        if match := re.search(r"serving \S+ on (http://\S+)/v1", line):
            return proc, match.group(1)
        assert line or proc.poll() is None, "".join(lines)
    proc.kill()
    raise AssertionError("".join(lines))


def _streams(url: str, max_tokens: list[int]) -> tuple[list[list[bytes]], list[threading.Thread]]:
    """One streaming request a count of bytes, each read on a thread into its list of data events;
    returns once every stream has sent its first event."""
    events: list[list[bytes]] = [[] for _ in max_tokens]
    started = [threading.Event() for _ in max_tokens]

    def read(k: int) -> None:
        body = {"prompt": "ab", "max_tokens": max_tokens[k], "temperature": 0, "stream": True}
        with requests.post(url + "/v1/completions", json=body, stream=True, timeout=60) as r:
            assert r.status_code == 200, r.text
            for line in r.iter_lines(chunk_size=1):
                if line.startswith(b"data: "):
                    events[k].append(line[6:])
                    started[k].set()
        started[k].set()

    threads = [threading.Thread(target=read, args=(k,), daemon=True) for k in range(len(max_tokens))]
    for t in threads:
        t.start()
    for s in started:
        assert s.wait(60)
    return events, threads


def _ended(events: list[bytes]) -> str:
    """How a stream of one choice ended: "finished" (its last chunk has a finish reason) or
    "error" (an error event), each followed by [DONE]; anything else fails."""
    assert events[-1] == b"[DONE]", events[-3:]
    last = json.loads(events[-2])
    if "error" in last:
        assert last["error"]["code"] == 503 and last["error"]["type"] == "server_shutting_down", last
        return "error"
    assert last["choices"][0]["finish_reason"] in ("length", "stop"), last
    return "finished"


@pytest.mark.slow
def test_sigterm_ends_open_streams_within_the_grace_period_and_a_second_signal_at_once(long_run):
    grace = 3.0
    proc, url = _start_server(long_run, "--max-batch", "2", "--shutdown-timeout", str(grace))
    try:
        # two rows that would decode for ages, and a third that waits in the queue behind them
        events, threads = _streams(url, [10 ** 6, 10 ** 6])
        queued: list[list[bytes]] = [[]]
        body = {"prompt": "c", "max_tokens": 8, "temperature": 0, "stream": True}
        waiter = threading.Thread(target=lambda: queued[0].extend(
            line[6:] for line in requests.post(url + "/v1/completions", json=body, stream=True, timeout=60)
            .iter_lines(chunk_size=1) if line.startswith(b"data: ")), daemon=True)
        waiter.start()
        time.sleep(0.3)
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        host, port = url.removeprefix("http://").split(":")
        refused, deadline = False, time.time() + grace / 2
        while not refused and time.time() < deadline:  # no new connections once it is stopping
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                time.sleep(0.05)
            except (ConnectionRefusedError, ConnectionResetError):  # a reset: the listener closed under the connect
                refused = True
        assert refused
        assert proc.wait(grace + 10) == 0
        assert time.time() - t0 < grace + 2.0  # within the grace period (and the process's own exit)
        for t in [*threads, waiter]:
            t.join(10)
        assert [_ended(e) for e in events] == ["error", "error"]
        assert _ended(queued[0]) in ("finished", "error")
        err = proc.stderr.read()
        assert "Traceback" not in err and "end with an error" in err
    finally:
        proc.kill()
    # a second signal ends the streams at once, however long the grace period
    proc, url = _start_server(long_run, "--max-batch", "2", "--shutdown-timeout", "600")
    try:
        events, threads = _streams(url, [10 ** 6])
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        assert time.time() - t0 < 5.0
        threads[0].join(10)
        assert _ended(events[0]) == "error"
        assert "Traceback" not in proc.stderr.read()
    finally:
        proc.kill()


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
