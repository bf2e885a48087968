"""`bytemtp serve`'s HTTP side (bytemtp.serving.app) with real clients on a free local port: the
openai package (plain and streaming), lm-evaluation-harness's local-completions model, concurrent
clients against solo decoding, a client killed mid-stream, malformed requests, a full queue, and
a bounded load with every byte checked."""

import json
import os
import socket
import threading
import time

import pytest
import requests
from doubles import FITTED, SONGS, fitted_model, tiny_model

from bytemtp.decoding import decode
from bytemtp.decoding.drafting import PassCosts
from bytemtp.decoding.strategy import Draft
from bytemtp.evaluation.likelihood import byte_logprobs
from bytemtp.serving.app import Running, Server
from bytemtp.serving.engine import Engine
from bytemtp.serving.load import run_load

_FLAT = PassCosts({(1, 1): 1.0, (1, 16): 1.0, (8, 1): 1.0, (8, 16): 1.0})


def _server(model, *, name="m", max_prompt_bytes=4096, api_keys=(), **kw):
    engine = Engine(model, decoder=decode.Decoder(model, costs=_FLAT), **kw)
    return Running(Server(engine, model_name=name, max_prompt_bytes=max_prompt_bytes, api_keys=api_keys))


def _openai():
    """The openai package, imported where a test uses it (it takes half a second, which every test
    process would pay at collection), or the test skips without it."""
    return pytest.importorskip("openai")


def _client(url):
    return _openai().OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def _plain(model, prompt, n):
    return decode.generate(model, prompt, max_bytes=n).output.decode("utf-8", "replace")


@pytest.mark.slow
@FITTED
def test_the_openai_client_gets_solo_greedy_output_plain_and_streamed():
    model = fitted_model(0, "transformer")
    with _server(model, max_batch=4, draft=Draft(8)) as srv:
        client = _client(srv.url)
        r = client.completions.create(model="m", prompt="one t", max_tokens=40, temperature=0)
        assert r.choices[0].text == _plain(model, b"one t", 40) and r.choices[0].finish_reason == "length"
        assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 40
        chunks = list(client.completions.create(model="m", prompt="la la", max_tokens=30, temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
        texts = [c.choices[0].text for c in chunks if c.choices]
        assert "".join(texts) == _plain(model, b"la la", 30) and len(texts) > 2  # several chunks
        assert chunks[-1].usage.completion_tokens == 30
        stop = client.completions.create(model="m", prompt="one two", max_tokens=60, temperature=0, stop=["five", "0123"])
        want = _plain(model, b"one two", 60)
        assert stop.choices[0].text == want[:want.index("five")] and stop.choices[0].finish_reason == "stop"
        streamed = client.completions.create(model="m", prompt="la la", max_tokens=60, temperature=0, stop=["four"],
                                             stream=True)
        want = _plain(model, b"la la", 60)
        assert "".join(c.choices[0].text for c in streamed) == want[:want.index("four")]
        two = client.completions.create(model="m", prompt=["one", "la"], max_tokens=8, temperature=0, n=2)
        assert [c.text for c in sorted(two.choices, key=lambda c: c.index)] == \
            [_plain(model, b"one", 8)] * 2 + [_plain(model, b"la", 8)] * 2
        sampled = [client.completions.create(model="m", prompt="one", max_tokens=12, temperature=1, seed=3).choices[0].text
                   for _ in range(2)]
        assert len(sampled[0]) > 0
        models = client.models.list()
        assert [m.id for m in models.data] == ["m"]


@pytest.mark.usefixtures("one_thread")
def test_echo_and_logprobs_are_the_models_per_byte_logprobs():
    model = tiny_model(seq_len=32).eval()
    with _server(model, max_batch=2) as srv:
        body = {"model": "m", "prompt": [257, *b"hello"], "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 2}
        r = requests.post(srv.url + "/v1/completions", json=body).json()
        lp = r["choices"][0]["logprobs"]
        out = decode.generate(model, b"hello", max_bytes=1).output
        want = byte_logprobs(model, [b"hello" + out], top=2)[0]
        assert lp["tokens"][:6] == ["<eos>", "h", "e", "l", "l", "o"] and lp["token_logprobs"][0] is None
        assert lp["token_logprobs"][1:] == pytest.approx(want.logprobs, abs=1e-6)
        assert len(lp["top_logprobs"][1]) == 2 and max(lp["top_logprobs"][1].values()) >= lp["token_logprobs"][1] - 1e-6
        assert r["choices"][0]["text"].startswith("hello") and r["usage"]["prompt_tokens"] == 6
        long = bytes(range(32, 127)) * 2  # past the context: scored in windows
        r = requests.post(srv.url + "/v1/completions", json={"prompt": list(long), "max_tokens": 0, "echo": True,
                                                             "logprobs": 0}).json()
        assert r["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(byte_logprobs(model, [long])[0].logprobs,
                                                                               abs=1e-6)
        tok = requests.post(srv.url + "/tokenize", json={"prompt": "hé<eos>", "add_special_tokens": False}).json()
        assert tok["tokens"] == [104, 0xc3, 0xa9, 257]
        assert requests.get(srv.url + "/tokenizer_info").json()["eos_token"] == "<eos>"
        assert requests.post(srv.url + "/detokenize", json={"tokens": [104, 0xc3, 0xa9, 257]}).json()["prompt"] == "hé<eos>"


@pytest.mark.usefixtures("one_thread")
def test_bad_requests_get_openai_error_bodies_never_a_traceback():
    model = tiny_model().eval()
    with _server(model, max_batch=1, max_prompt_bytes=10) as srv:
        url = srv.url + "/v1/completions"
        cases = [(requests.post(url, data=b"{not json"), 400, None),
                 (requests.post(url, json={"prompt": "x", "max_tokens": "many"}), 400, "max_tokens"),
                 (requests.post(url, json={"prompt": "x", "temprature": 0}), 400, "temprature"),
                 (requests.post(url, json={"prompt": "x" * 11}), 413, "prompt"),
                 (requests.post(url, json={"prompt": "x", "model": "gpt-4"}), 404, "model"),
                 (requests.get(srv.url + "/v2/nothing"), 404, None),
                 (requests.get(url), 405, None),
                 (requests.post(url, data=b"x" * (20 << 20)), 413, None)]  # past the body limit
        for response, status, param in cases:
            assert response.status_code == status, response.text
            error = response.json()["error"]
            assert error["code"] == status and error["param"] == param and "Traceback" not in response.text
        with pytest.raises(_openai().BadRequestError, match="max_tokens"):
            _client(srv.url).completions.create(model="m", prompt="x", max_tokens=-1)


@pytest.mark.usefixtures("one_thread")
def test_a_full_queue_answers_503_and_a_killed_stream_frees_its_row():
    model = tiny_model().eval()
    with _server(model, max_batch=1, max_queue=0, draft=Draft.plain()) as srv:
        host, port = srv.url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)))
        body = json.dumps({"prompt": "a", "max_tokens": 10 ** 6, "temperature": 0, "stream": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert b"data: " in sock.recv(4096) or b"data: " in sock.recv(4096)  # it streams
        engine = srv.server.engine
        assert engine.running == 1
        busy = requests.post(srv.url + "/v1/completions", json={"prompt": "b", "max_tokens": 3})
        assert busy.status_code == 503 and busy.json()["error"]["type"] == "server_overloaded"
        sock.close()  # the client dies mid-stream
        deadline = time.time() + 30
        while (engine.running or not engine.stats.cancelled) and time.time() < deadline:
            time.sleep(0.02)
        assert engine.running == 0 and engine.stats.cancelled == 1
        ok = requests.post(srv.url + "/v1/completions", json={"prompt": "b", "max_tokens": 3, "temperature": 0})
        assert ok.json()["choices"][0]["text"] == _plain(model, b"b", 3)
        health = requests.get(srv.url + "/health").json()
        assert health["status"] == "ok" and health["running"] == 0


@pytest.mark.slow
@FITTED
def test_concurrent_streaming_clients_for_a_while_lose_and_repeat_nothing():
    model = fitted_model(1, "transformer")
    prompts = [s[:n] for s in SONGS for n in (2, 7)] + [b"", b"\x00\xfe"]
    expected = [_plain(model, p, 48) for p in prompts]
    with _server(model, max_batch=4, max_queue=16) as srv:
        report = run_load(srv.url, model="m", prompts=prompts, expected=expected, clients=6, max_tokens=48,
                          duration_s=4.0)
        engine = srv.server.engine
        assert report.errors == 0 and report.mismatches == 0 and len(report.completions) >= 6
        assert report.bytes_out == 48 * len(report.completions)
        assert engine.stats.requests == len(report.completions) + 0 and engine.running == 0
        assert 1 < engine.stats.mean_batch <= 4


@pytest.mark.slow
@FITTED
@pytest.mark.usefixtures("one_thread")
def test_a_seeded_sampled_request_repeats_its_text_under_every_draft_and_beside_others():
    """The same seeded request, three times in a row and once beside other streams, on servers
    drafting automatically, plainly and by a fixed chain: one text, plain sampling's with that seed."""
    import torch

    from bytemtp.decoding.sampling import Sampling

    model = fitted_model(0, "transformer")
    body = {"model": "m", "prompt": "one t", "max_tokens": 60, "temperature": 1.0, "top_p": 0.95, "seed": 7}
    want = decode.generate(model, b"one t", max_bytes=60, sampling=Sampling(
        temperature=1.0, top_p=0.95, generator=torch.Generator().manual_seed(7))).output.decode("utf-8", "replace")
    for draft in (Draft(lookup=True), Draft.plain(), Draft(4)):
        with _server(model, max_batch=4, draft=draft) as srv:
            texts = [requests.post(srv.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
                     for _ in range(3)]
            others, beside = [], []
            threads = [threading.Thread(target=lambda k=k: others.append(requests.post(
                srv.url + "/v1/completions", timeout=60, json={**body, "prompt": "la la", "seed": k, "stream": True}
            ).status_code)) for k in range(3)]
            for t in threads:
                t.start()
            alone = requests.post(srv.url + "/v1/completions", json=body, timeout=60)
            beside.append(alone.json()["choices"][0]["text"])
            for t in threads:
                t.join(60)
            st = srv.server.engine.stats
        assert texts + beside == [want] * 4, draft
        assert others == [200] * 3
        if draft == Draft(4):  # drafts were accepted: more bytes than one a row a pass (and each row's first)
            assert st.bytes_out > st.rows_in_passes + st.requests


@pytest.mark.usefixtures("one_thread")
def test_a_mixed_load_gets_4xx_for_every_malformed_kind_and_loses_no_good_byte():
    """Good streams beside a rotating set of malformed requests (`load.MALFORMED`): each malformed
    one gets a 4xx JSON error, no request gets a 5xx, and every good completion is solo decoding's."""
    from bytemtp.serving.load import MALFORMED

    model = tiny_model().eval()
    prompts = [b"ab", b"", b"\x00\xfe", b"hello"]
    expected = [_plain(model, p, 12) for p in prompts]
    with _server(model, max_batch=4, max_queue=16, draft=Draft.plain()) as srv:
        report = run_load(srv.url, model="m", prompts=prompts, expected=expected, clients=4, max_tokens=12,
                          per_client=2 * len(MALFORMED), malformed=0.5, refusal_timeout_s=10)
        health = requests.get(srv.url + "/health", timeout=10).json()
    kinds = report.by_kind()
    assert set(kinds) == set(MALFORMED) and len(report.refused) >= 4 * 2 * len(MALFORMED) - 1  # half the requests
    assert all(400 <= r.status < 500 for r in report.refused), kinds
    assert report.server_errors == 0 and report.errors == 0 and report.mismatches == 0
    assert len(report.completions) == 4 * 2 * len(MALFORMED) and health["status"] == "ok"
    assert report.to_json()["malformed_by_kind"] == kinds


@pytest.fixture(scope="module")
def lm_eval_task(tmp_path_factory):
    pytest.importorskip("lm_eval")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = tmp_path_factory.mktemp("lm-eval")
    docs = [{"q": f"{a} + {b} =", "choices": [str(a + b), str(a + b + 1), str(a * b + 2)], "gold": (a + b) % 3}
            for a in range(3) for b in range(3)]
    (root / "docs.json").write_text("\n".join(json.dumps(d) for d in docs))
    (root / "tasks").mkdir()
    (root / "tasks" / "serve_mc.yaml").write_text(
        f"task: serve_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / 'docs.json'}\n"
        f"  cache_dir: {root / 'hf-cache'}\ntest_split: test\ndoc_to_text: \"{{{{q}}}}\"\n"
        "output_type: multiple_choice\ndoc_to_choice: \"{{choices}}\"\ndoc_to_target: gold\n"
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")
    return root, docs


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_lm_eval_local_completions_through_the_server_gives_the_in_process_loglikelihoods(lm_eval_task, monkeypatch):
    """Through a server that needs an API key: local-completions sends OPENAI_API_KEY's as a bearer
    token (its remote tokenizer asks the open tokenizer routes)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from bytemtp.evaluation.likelihood import loglikelihoods

    root, docs = lm_eval_task
    model = tiny_model(seed=2).eval()
    monkeypatch.setenv("OPENAI_API_KEY", _KEYS[1])
    with _server(model, name="tiny", max_batch=4, api_keys=_KEYS) as srv:
        result = lm_eval.simple_evaluate(
            model="local-completions", tasks=["serve_mc"], log_samples=True,
            model_args=f"base_url={srv.url}/v1/completions,model=tiny,tokenizer_backend=remote,num_concurrent=2,"
                       "max_retries=1,tokenized_requests=True",
            task_manager=TaskManager(include_path=str(root / "tasks"), include_defaults=False))
    samples = result["samples"]["serve_mc"]
    assert len(samples) == len(docs)
    for s in samples:
        pairs = [(c.encode(), x.encode()) for c, x in (tuple(a) for a in s["arguments"])]
        want = loglikelihoods(model, pairs)
        got = [tuple(r[0]) for r in s["resps"]]
        assert [lp for lp, _ in got] == pytest.approx([lp for lp, _ in want], abs=1e-5)
        assert [g for _, g in got] == [g for _, g in want]


_KEYS = ("sk-alpha", "sk-beta")


@pytest.mark.usefixtures("one_thread")
def test_with_api_keys_every_route_but_the_open_ones_answers_401_without_a_valid_key():
    """Every route of the app, enumerated from its router (a route added later is checked too):
    each is either open (`OPEN_ROUTES`: /health and the tokenizer routes) or a /v1 route, and each
    /v1 route answers 401 to no key, a wrong key or a malformed header, and serves either key."""
    from bytemtp.serving.app import OPEN_ROUTES

    model = tiny_model().eval()
    with _server(model, max_batch=2, api_keys=_KEYS) as srv:
        routes = sorted({(r.method, r.resource.canonical) for r in srv.server.app().router.routes()})
        paths = {path for _, path in routes}
        assert paths - OPEN_ROUTES == {path for path in paths if path.startswith("/v1/")}, routes
        assert {"/v1/completions", "/v1/models"} <= paths and "/health" in OPEN_ROUTES
        body = {"prompt": "a", "max_tokens": 2, "temperature": 0}

        def call(method, path, headers):
            return requests.request(method, srv.url + path, json=body if method == "POST" else None,
                                    headers=headers, timeout=60)

        for method, path in routes:
            if path in OPEN_ROUTES:
                assert call(method, path, {}).status_code != 401, (method, path)
                continue
            for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "Bearer "},
                            {"Authorization": "sk-alpha"}, {"Authorization": "Basic sk-alpha"},
                            {"Authorization": "Bearer sk-alpha2"}, {"X-Api-Key": "sk-alpha"}):
                r = call(method, path, headers)
                assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer", (method, path, headers)
                if method != "HEAD":
                    error = r.json()["error"]
                    assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
                    assert "sk-" not in error["message"]  # the key sent is never echoed
            for key in _KEYS:
                r = call(method, path, {"Authorization": f"Bearer {key}"})
                assert r.status_code == 200, (method, path, r.text)
        for path in ("/v1/nothing", "/v1/completions/", "//v1/completions", "/V1/completions", "/v1/%63ompletions",
                     "/"):  # a path that matches no route needs the key too, however it is spelt
            assert requests.post(srv.url + path, json=body).status_code == 401, path
        keyed = {"Authorization": "Bearer sk-beta"}
        assert requests.post(srv.url + "/v1/nothing", json=body, headers=keyed).status_code == 404
        assert requests.get(srv.url + "/health").json()["status"] == "ok"
        assert srv.server.engine.stats.requests == 2  # only the requests with a key reached the engine


@pytest.mark.usefixtures("one_thread")
def test_the_openai_client_needs_the_right_api_key():
    openai = _openai()
    model = tiny_model().eval()
    with _server(model, max_batch=2, api_keys=_KEYS) as srv:
        def client(key):
            return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0)

        r = client("sk-beta").completions.create(model="m", prompt="ab", max_tokens=5, temperature=0)
        assert r.choices[0].text == _plain(model, b"ab", 5)
        assert [m.id for m in client("sk-alpha").models.list().data] == ["m"]
        for key, headers in (("sk-wrong", None), ("unsent", {"Authorization": openai.Omit()})):  # no header sent
            with pytest.raises(openai.AuthenticationError, match="API key"):
                client(key).completions.create(model="m", prompt="ab", max_tokens=5, extra_headers=headers)
            with pytest.raises(openai.AuthenticationError):
                client(key).models.list(extra_headers=headers)


@pytest.mark.usefixtures("one_thread")
def test_lm_eval_sends_openai_api_key_as_the_bearer_token_the_server_checks(monkeypatch):
    """The exact header lm-evaluation-harness's local-completions sends (the slow lm-eval test runs
    it through the server whole)."""
    pytest.importorskip("lm_eval")
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    def header():
        api = LocalCompletionsAPI.__new__(LocalCompletionsAPI)  # no connection: only the header
        api._header = None
        return api.header

    model = tiny_model().eval()
    body = {"model": "m", "prompt": [[257, 97, 98]], "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1}
    with _server(model, max_batch=2, api_keys=_KEYS) as srv:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-alpha")
        assert header() == {"Authorization": "Bearer sk-alpha"}
        assert requests.post(srv.url + "/v1/completions", json=body, headers=header()).status_code == 200
        monkeypatch.delenv("OPENAI_API_KEY")
        assert requests.post(srv.url + "/v1/completions", json=body, headers=header()).status_code == 401


def _events(response):
    """A streamed completion's text, its error events and whether it ended with [DONE]."""
    text, errors, done = [], [], False
    for line in response.iter_lines():
        if not line.startswith(b"data: "):
            continue
        data = line[len(b"data: "):]
        if data == b"[DONE]":
            done = True
            continue
        event = json.loads(data)
        if "error" in event:
            errors.append(event["error"])
        else:
            text += [c["text"] for c in event["choices"]]
    return "".join(text), errors, done


@pytest.mark.usefixtures("one_thread")
def test_non_finite_numbers_and_seeds_past_64_bits_get_400_beside_a_healthy_stream():
    model = tiny_model().eval()
    with _server(model, max_batch=2) as srv:
        url = srv.url + "/v1/completions"
        healthy = requests.post(url, json={"prompt": "ab", "max_tokens": 200, "temperature": 0, "stream": True},
                                stream=True, timeout=60)
        for text, param in [('"temperature": NaN', "temperature"), ('"temperature": Infinity', "temperature"),
                            ('"temperature": -Infinity', "temperature"), ('"temperature": 1e309', "temperature"),
                            ('"top_p": NaN', "top_p"), ('"seed": 18446744073709551616', "seed"),
                            ('"seed": -9223372036854775809', "seed"), ('"stop": ["a", NaN]', "stop")]:
            r = requests.post(url, data=('{"prompt": "x", "max_tokens": 4, ' + text + "}").encode(),
                              headers={"Content-Type": "application/json"}, timeout=60)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (text, r.text)
            assert "Traceback" not in r.text
        tiny = requests.post(url, json={"prompt": "ab", "max_tokens": 8, "temperature": 1e-45}, timeout=60)
        assert tiny.json()["choices"][0]["text"] == _plain(model, b"ab", 8)  # as greedy
        for seed in (2 ** 64 - 1, -1, -2 ** 63):  # with n=2 the second choice's seed wraps within 64 bits
            r = requests.post(url, json={"prompt": "ab", "max_tokens": 4, "temperature": 1, "seed": seed, "n": 2},
                              timeout=60)
            assert r.status_code == 200, r.text
        assert _events(healthy) == (_plain(model, b"ab", 200), [], True)


@pytest.mark.usefixtures("one_thread")
def test_a_request_whose_decoding_fails_fails_alone_beside_healthy_streams(monkeypatch):
    model = tiny_model().eval()
    with _server(model, max_batch=3, draft=Draft(4)) as srv:
        url, decoder = srv.url + "/v1/completions", srv.server.engine.decoder
        real = decoder.propose

        def propose(row, *args, **kw):
            if bytes(row.prompt) == b"poison" and len(row.out.data) >= 2:
                raise RuntimeError("a poisoned row")
            return real(row, *args, **kw)

        monkeypatch.setattr(decoder, "propose", propose)
        got = {}

        def stream(prompt):
            r = requests.post(url, json={"prompt": prompt, "max_tokens": 60, "temperature": 0, "stream": True},
                              stream=True, timeout=60)
            got[prompt] = _events(r)

        prompts = ["ab", "poison", "cd", "efg", "h"]  # more than the batch: some wait
        threads = [threading.Thread(target=stream, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for p in prompts:
            text, errors, done = got[p]
            assert done, p
            if p == "poison":
                assert len(errors) == 1 and "a poisoned row" in errors[0]["message"] and errors[0]["code"] == 500
            else:
                assert (text, errors) == (_plain(model, p.encode(), 60), []), p
        plain = requests.post(url, json={"prompt": "poison", "max_tokens": 60, "temperature": 0}, timeout=60)
        assert plain.status_code == 500 and "a poisoned row" in plain.json()["error"]["message"]
        ok = requests.post(url, json={"prompt": ["ab", "cd"], "max_tokens": 9, "temperature": 0}, timeout=60)
        assert [c["text"] for c in ok.json()["choices"]] == [_plain(model, b"ab", 9), _plain(model, b"cd", 9)]


@pytest.mark.usefixtures("one_thread")
def test_one_request_of_100_prompts_on_an_idle_server_is_served_whole():
    """More choices than the batch and the queue hold (2 + 4), as lm-eval's local-completions
    batches prompts: queued as a unit, its rows joining the batch as room frees."""
    model = tiny_model().eval()
    prompts = [f"p{i}" for i in range(100)]
    with _server(model, max_batch=2, max_queue=4) as srv:
        url = srv.url + "/v1/completions"
        r = requests.post(url, json={"prompt": prompts, "max_tokens": 3, "temperature": 0}, timeout=120)
        assert r.status_code == 200, r.text
        choices = sorted(r.json()["choices"], key=lambda c: c["index"])
        assert [c["text"] for c in choices] == [_plain(model, p.encode(), 3) for p in prompts]
        scored = requests.post(url, json={"prompt": [[257, *p.encode()] for p in prompts], "max_tokens": 1,
                                          "temperature": 0, "echo": True, "logprobs": 1}, timeout=120)
        assert scored.status_code == 200, scored.text
        for c, p in zip(sorted(scored.json()["choices"], key=lambda c: c["index"]), prompts):
            lp = c["logprobs"]
            assert lp["tokens"][:len(p) + 1] == ["<eos>", *p] and len(lp["token_logprobs"]) == len(lp["tokens"])
        health = requests.get(srv.url + "/health").json()
        assert health["running"] == 0 and health["queued"] == 0


@pytest.mark.usefixtures("one_thread")
def test_20000_stop_strings_get_400_at_once_and_the_user_field_is_accepted():
    model = tiny_model().eval()
    with _server(model, max_batch=2) as srv:
        url = srv.url + "/v1/completions"
        t0 = time.perf_counter()
        r = requests.post(url, json={"prompt": "ab", "max_tokens": 4, "stop": [f"s{i}" for i in range(20000)]},
                          timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "stop" and "16 at most" in r.text
        assert time.perf_counter() - t0 < 5
        r = requests.post(url, json={"prompt": "ab", "max_tokens": 4, "temperature": 0, "user": "user-1234"},
                          timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == _plain(model, b"ab", 4)
