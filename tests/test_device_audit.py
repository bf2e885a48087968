"""Device assumptions caught on the CPU (issue 52: every path works on CUDA).

A GPU run crashed at weight initialisation because a CPU generator drew into CUDA parameters; no
CPU test could see it. Three layers here would have:

- static: every `torch.Generator(...)` names its device, and every torch factory call
  (`torch.tensor`, `zeros`, `arange`, ...) in the library and the CLI says `device=`: the model's
  device, or `device="cpu"` where a tensor is host-side staging moved later. A factory call that
  makes a module's `nn.Parameter` is exempt: it follows the device the module is built on, as
  nn.Linear's weights do (the meta device, for a model materialised later).
- initialisation: `init_weights` gives the same weights on a model built on the meta device and
  materialised as on a plain CPU model, and never hands an op a generator on another device than
  the tensor it fills.
- runtime: each command runs in this process with `--device cpu` while the default device is
  `meta`, so a tensor made without naming a device lands on meta and the command fails where it
  meets the real CPU tensors (threads the command starts get the same default).

Legend: none (no tensors at module boundaries).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import threading
import traceback
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from doubles import lm_eval_tasks
from torch.overrides import TorchFunctionMode

from bytemtp import config_io
from bytemtp.model.model import ByteMTP
from bytemtp.runtime import standin
from bytemtp_cli.main import main

ROOT = Path(__file__).resolve().parents[1]
FACTORIES = {"tensor", "zeros", "ones", "empty", "full", "arange", "randint", "randn", "rand", "randperm", "eye",
             "linspace"}
# (file, function) -> why a factory call there may leave out the device: only host-side tensors
# that never meet the model's. Keep it short; `device="cpu"` says the same in the code itself.
HOST_SIDE: dict[tuple[str, str], str] = {}


# --- static ----------------------------------------------------------------------------------------


def _sources() -> list[Path]:
    return sorted([*(ROOT / "bytemtp").rglob("*.py"), *(ROOT / "cli").rglob("*.py")])


def _torch_calls(path: Path):
    """(line, enclosing function, name, call) of every `torch.NAME(...)` call in a file, and whether
    it is the argument of an `nn.Parameter(...)`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []

    def visit(node, scope: list[str], in_param: bool):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = [*scope, node.name]
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "torch":
                found.append((node.lineno, ".".join(scope), f.attr, node, in_param))
            in_param = isinstance(f, ast.Attribute) and f.attr == "Parameter"
        for child in ast.iter_child_nodes(node):
            visit(child, scope, in_param and isinstance(node, ast.Call))

    visit(tree, [], False)
    return found


def test_the_audit_sees_the_calls_it_looks_for():
    """The audit itself: a call without a device is found, with its function; one with is not."""
    sample = ROOT / "bytemtp" / "model" / "model.py"
    calls = _torch_calls(sample)
    assert any(name == "arange" for _, _, name, _, _ in calls)
    tree_calls = {(name, scope) for _, scope, name, _, _ in calls}
    assert ("empty", "ByteMTP.init_weights") in tree_calls


def test_every_generator_names_its_device():
    bad = []
    for path in _sources():
        for line, scope, name, call, _ in _torch_calls(path):
            if name == "Generator" and not call.args and not any(k.arg == "device" for k in call.keywords):
                bad.append(f"{path.relative_to(ROOT)}:{line} ({scope})")
    assert not bad, "torch.Generator() without a device (it draws on the CPU only): " + ", ".join(bad)


def test_every_factory_call_names_its_device():
    bad = []
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        for line, scope, name, call, in_param in _torch_calls(path):
            if name not in FACTORIES or in_param or (rel, scope) in HOST_SIDE:
                continue
            if not any(k.arg == "device" for k in call.keywords):
                bad.append(f"{rel}:{line} torch.{name} ({scope})")
    assert not bad, ("torch factory calls without device= (the model's device, or device=\"cpu\" for host-side "
                     "staging): " + ", ".join(bad))


# --- initialisation ------------------------------------------------------------------------------------


def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("overrides", [{}, {"head_type": "linear"}, {"draft": "hydra"}])
def test_init_on_a_meta_built_model_equals_init_on_a_cpu_model(overrides):
    cfg = dataclasses.replace(config_io.tiny().model, **overrides)
    plain = ByteMTP(cfg)
    plain.init_weights(generator=torch.Generator(device="cpu").manual_seed(11))
    with torch.device("meta"):
        moved = ByteMTP(cfg)
    moved.to_empty(device="cpu")
    moved.reset_rope()
    moved.init_weights(generator=torch.Generator(device="cpu").manual_seed(11))
    built = ByteMTP.build(cfg, "cpu", generator=torch.Generator(device="cpu").manual_seed(11))
    want = _state(plain)
    for model in (moved, built):
        got = _state(model)
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want)
        assert torch.equal(model.rope_cos, plain.rope_cos) and torch.equal(model.rope_sin, plain.rope_sin)


class GeneratorDevices(TorchFunctionMode):
    """Records every op handed a generator whose device differs from the tensor it fills (the
    tensor argument, or the output of a factory)."""

    def __init__(self):
        super().__init__()
        self.mismatches: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        gen = kwargs.get("generator")
        if isinstance(gen, torch.Generator):
            target = next((a for a in args if isinstance(a, torch.Tensor)), out)
            if isinstance(target, torch.Tensor) and target.device.type != gen.device.type:
                self.mismatches.append(f"{getattr(func, '__name__', func)}: generator on {gen.device}, "
                                       f"tensor on {target.device}")
        return out


def test_init_weights_draws_with_a_generator_on_the_device_it_fills():
    model = ByteMTP.build(config_io.tiny().model, "cpu")
    with GeneratorDevices() as mode:
        model.init_weights(generator=torch.Generator(device="cpu").manual_seed(0))
        ByteMTP.build(config_io.tiny().model, "cpu", generator=torch.Generator(device="cpu").manual_seed(0))
    assert mode.mismatches == []
    # what the check exists for: the old initialisation drew in place, on the parameter's device
    # (a CPU generator into CUDA weights crashed on a GPU). The meta device stands in for CUDA
    # here: it raises nothing, but the check sees the mismatch.
    with torch.device("meta"):
        model = ByteMTP(config_io.tiny().model)
    with GeneratorDevices() as mode:
        for p in model.parameters():
            if p.dim() >= 2:
                torch.nn.init.normal_(p, 0.0, 0.02, generator=torch.Generator(device="cpu").manual_seed(0))
    assert mode.mismatches and "tensor on meta" in mode.mismatches[0]


def test_init_weights_refuses_a_generator_off_the_cpu():
    class Elsewhere:  # torch makes no generator off the CPU without an accelerator
        device = torch.device("cuda")

    with pytest.raises(ValueError, match="pass a CPU generator"):
        ByteMTP(config_io.tiny().model).init_weights(generator=Elsewhere())


# --- runtime -----------------------------------------------------------------------------------------


# the runtime layer's tests run whole commands with every torch op checked: seconds each, so make
# test-quick leaves them to make test
RUNTIME = pytest.mark.slow


@pytest.fixture
def meta_default(monkeypatch):
    """The commands run on the stand-in accelerator (`runtime.standin`, `--device standin`), where a
    tensor on another device than the model's fails as on CUDA: one made on a fixed `device="cpu"`,
    or made without a device (the default device is the CPU), meets the model's and raises. Threads
    the command starts follow the same rules."""
    run = threading.Thread.run

    def run_on_standin(self):
        with standin.modes():
            run(self)

    monkeypatch.setattr(threading.Thread, "run", run_on_standin)
    with standin.StandIn():
        yield


@pytest.fixture(scope="module")
def ckpt(corpus_dir, tmp_path_factory) -> Path:
    """A tiny run of two steps (made with the CPU as the default device)."""
    from bytemtp import config_io
    from bytemtp.training.train import train

    cfg = config_io.resolve("tiny", overrides=[f"data.path={corpus_dir}", "data.batch_size=2", "train.steps=2",
                                               "train.compile=off", "model.n_future=4"])
    run = tmp_path_factory.mktemp("audit") / "run"
    train(cfg, run, show_progress=False, say=lambda m: None)
    return run


def _invoke(*args) -> str:
    res = CliRunner().invoke(main, [str(a) for a in args])
    detail = ""
    if res.exc_info is not None and not isinstance(res.exception, SystemExit):
        detail = "".join(traceback.format_exception(*res.exc_info)[-40:])
    assert res.exit_code == 0, f"{' '.join(map(str, args[:2]))}: {res.output[-1500:]}\n{detail}"
    return res.output


@RUNTIME
def test_train_and_eval(meta_default, corpus_dir, tmp_path):
    _invoke("train", "--preset", "tiny", "--data", corpus_dir, "--out", tmp_path / "run", "--steps", 2,
            "--device", "standin", "--set", "data.batch_size=2", "--set", "train.compile=off",
            "--set", "train.eval_every=2", "--set", "train.eval_batches=1", "--set", "model.n_future=4")
    _invoke("eval", "--ckpt", tmp_path / "run", "--batches", 1, "--batch-size", 2, "--decode-prompts", 1,
            "--device", "standin")


@RUNTIME
def test_generate(meta_default, ckpt, tmp_path):
    _invoke("generate", "--ckpt", ckpt, "--prompt", "the", "--max-bytes", 6, "--compile", "off", "--device", "standin")
    _invoke("generate", "--ckpt", ckpt, "--prompt", "a", "--max-bytes", 4, "--temperature", 0.8, "--seed", 1,
            "--compile", "off", "--device", "standin")


@RUNTIME
def test_bench_decode(meta_default, ckpt, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("def f(x):", "import os")))
    _invoke("bench", "decode", "--ckpt", ckpt, "--prompts", prompts, "--n-prompts", 2, "--batch-sizes", "1,2",
            "--max-bytes", 6, "--rounds", 1, "--draft", "auto,chain-2", "--eval-batches", 1, "--compile", "off",
            "--device", "standin")


@RUNTIME
def test_tune_heads(meta_default, ckpt, tmp_path):
    _invoke("tune-heads", "--ckpt", ckpt, "--out", tmp_path / "tuned", "--steps", 1, "--report-prompts", 0,
            "--drafter", "medusa", "--device", "standin", "--set", "data.batch_size=2", "--set", "train.eval_batches=1")


@RUNTIME
def test_eval_tasks_and_export(meta_default, ckpt, tmp_path):
    _invoke("eval-task", "poly", "--ckpt", ckpt, "--per-count", 1, "--counts", "1", "--device", "standin")
    problems = tmp_path / "toy.jsonl"
    problems.write_text(json.dumps({"task_id": "toy/0", "prompt": "def one():\n    return ", "entry_point": "one",
                                    "test": "def check(f):\n    assert f() == 1\n"}) + "\n")
    _invoke("eval-task", "humaneval", "--ckpt", ckpt, "--problems", problems, "--max-bytes", 6, "--compile", "off",
            "--samples", 2, "--temperature", 0.8, "--device", "standin", "--sandbox", "guard",
            "--allow-unsandboxed-execution", "--workers", 1)
    _invoke("export", "--ckpt", ckpt, "--out", tmp_path / "hf")


@RUNTIME
def test_lm_eval(meta_default, ckpt, tmp_path):
    pytest.importorskip("lm_eval")
    docs = [{"q": f"{a} + {b} =", "choices": [str(a + b), str(a + b + 1)], "gold": 0} for a in range(2) for b in (1,)]
    tasks = lm_eval_tasks(tmp_path, docs, until=["\n"], max_gen_toks=3)
    _invoke("lm-eval", "--model", "bytemtp", "--model_args", f"ckpt={ckpt},device=standin,batch_size=2",
            "--include_path", tasks, "--tasks", "tiny_mc,tiny_gen")


@RUNTIME
def test_serve(meta_default, ckpt, monkeypatch):
    """`bytemtp serve` as the command builds it (model, engine, server), answering a plain and a
    sampled request with log-probabilities; where the command would wait for a signal, a stand-in
    serves it on a background thread for those two requests and returns."""
    pytest.importorskip("aiohttp")
    import requests

    from bytemtp.serving import app

    answers = []

    def serve_two_requests(server, *, sock, **_):
        sock.close()
        with app.Running(server) as running:
            for body in ({"prompt": "the", "max_tokens": 4},
                         {"prompt": "a", "max_tokens": 3, "temperature": 0.7, "seed": 1, "logprobs": 2, "echo": True}):
                answers.append(requests.post(running.url + "/v1/completions", json=body, timeout=120))

    monkeypatch.setattr(app, "serve", serve_two_requests)
    _invoke("serve", "--ckpt", ckpt, "--port", 0, "--compile", "off", "--device", "standin")
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]


@RUNTIME
def test_bench_train_step_and_serve(meta_default, ckpt, monkeypatch):
    from bytemtp.experiments import step_bench

    # peaks are measured in fresh processes, which the default device does not reach
    monkeypatch.setattr(step_bench, "_peak_memory_in_subprocess", lambda args: 1.0)
    _invoke("bench", "train-step", "--preset", "tiny", "--steps", 1, "--warmup", 0, "--batch-size", 1,
            "--compile", "off", "--device", "standin")
    pytest.importorskip("aiohttp")
    _invoke("bench", "serve", "--ckpt", ckpt, "--clients", "1", "--n-prompts", 1, "--prompt-bytes", 4,
            "--max-bytes", 4, "--rounds", 1, "--compile", "off", "--no-vs-plain", "--device", "standin")


@RUNTIME
def test_bench_sweep_and_quality(meta_default, corpus_dir, tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text(f'preset = "tiny"\nsets = ["data.path={corpus_dir}", "data.batch_size=2", "train.device=standin", '
                    '"train.compile=off", "model.n_future=2"]\n[[candidate]]\nname = "a"\nsets = []\n')
    _invoke("bench", "sweep", grid, "--out", tmp_path / "sweep", "--time", "1s", "--eval-bytes", 128, "--n-prompts", 1)
    _invoke("bench", "quality", "--preset", "tiny", "--data", corpus_dir, "--steps", 1, "--seeds", 1, "--arms", "mtp",
            "--set", "data.batch_size=2", "--set", "model.n_future=2", "--set", "train.compile=off",
            "--eval-bytes", 128, "--n-prompts", 1, "--tune-time", "1s", "--out", tmp_path / "q", "--device", "standin")


@RUNTIME
def test_bench_tokens(meta_default, corpus_dir, tmp_path):
    _invoke("bench", "tokens", "--preset", "tiny", "--data", corpus_dir, "--steps", 1, "--vocab", 270,
            "--held-out", corpus_dir.parent / "src", "--held-out-bytes", 128, "--n-prompts", 1, "--max-bytes", 4,
            "--rounds", 1, "--batch-sizes", "1", "--compile", "off", "--out", tmp_path / "tok", "--device", "standin",
            "--set", "data.batch_size=2", "--set", "model.n_future=2")


# --- the mutants the runtime layer exists for ------------------------------------------------------


def _on_cpu(t: torch.Tensor) -> torch.Tensor:
    """The bug: a tensor made on a fixed device, not the model's, added where the model's are."""
    return t + torch.zeros(1, dtype=t.dtype, device="cpu")


def _decoding_pass(monkeypatch):
    from bytemtp.decoding import decode

    real = decode.Decoder.forward
    monkeypatch.setattr(decode.Decoder, "forward", lambda self, *a, **k: (lambda out: (_on_cpu(out[0]), *out[1:]))(
        real(self, *a, **k)))


def _training_step(monkeypatch):
    real = ByteMTP.forward
    monkeypatch.setattr(ByteMTP, "forward", lambda self, *a, **k: _on_cpu(real(self, *a, **k)))


def _loss(monkeypatch):
    from bytemtp.training import step

    real = step._core
    monkeypatch.setattr(step, "_core", lambda compiled: lambda logits, targets: real(compiled)(_on_cpu(logits), targets))


@pytest.mark.parametrize("mutant", [None, _decoding_pass, _training_step, _loss],
                         ids=["as it is", "decoding pass", "training step", "loss"])
def test_a_tensor_on_a_fixed_device_fails_on_the_stand_in(mutant, corpus_dir, tmp_path, monkeypatch):
    """`torch.zeros(1, device="cpu")` added to a decoding pass, a training step or the loss: on the
    CPU it meets nothing else and passes; on the stand-in, as on CUDA, it fails the command."""
    from bytemtp.decoding import decode
    from bytemtp.training.train import train

    cfg = config_io.resolve("tiny", overrides=[f"data.path={corpus_dir}", "data.batch_size=2", "train.steps=1",
                                               "train.compile=off", "model.n_future=2", "train.eval_every=0"])
    if mutant is not None:
        mutant(monkeypatch)
    with standin.StandIn():
        try:
            train(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, device="standin")), tmp_path / "run",
                  show_progress=False, say=lambda m: None)
            model = ByteMTP.build(cfg.model, "cpu", generator=torch.Generator(device="cpu").manual_seed(0)).eval()
            decode.Decoder(model.to(standin.DEVICE), compile="off").generate([b"def f(", b"x"], max_bytes=8,
                                                                            draft="chain-2")
        except RuntimeError as e:
            assert mutant is not None, e
            assert "Expected all tensors to be on the same device" in str(e) and "cpu" in str(e)
        else:
            assert mutant is None, "the stand-in let a tensor on a fixed device through"
    if mutant is not None:  # on the CPU alone the same bug passes: what the stand-in is for
        model = ByteMTP.build(cfg.model, "cpu", generator=torch.Generator(device="cpu").manual_seed(0)).eval()
        train(cfg, tmp_path / "cpu-run", show_progress=False, say=lambda m: None)
        decode.Decoder(model, compile="off").generate([b"def f("], max_bytes=8, draft="chain-2")
