import ast
import inspect
import json
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap
import types

import click
import pytest
from click.testing import CliRunner

from bytemtp_cli.main import main


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_config_shows_resolved_settings_and_counts():
    res = run("config", "--preset", "tiny", "--set", "model.n_future=4")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output[: res.output.index("\n}\n") + 2])
    assert data["model"]["n_future"] == 4
    assert "6 trunk layers + 4 transformer heads" in res.output
    assert "total" in res.output


@pytest.mark.parametrize("args,words", [
    (["config", "--set", "model.widht=3"], "unknown setting model.widht"),
    (["config", "--set", "model.head_type=mlp"], "choose one of transformer, linear, causal"),
    (["config", "--set", "model.n_layers=4"], "use n_layers >= 9"),
    (["config", "--config", "/nonexistent/run.toml"], "cannot read config file"),
])
def test_user_errors_are_one_line(args, words):
    res = run(*args)
    assert res.exit_code != 0
    assert words in res.output
    assert "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_keys_lists_every_setting():
    res = run("config", "--keys")
    assert res.exit_code == 0
    assert "model.n_future" in res.output and "loss.mask_after_eos" in res.output


def test_keys_show_the_presets_values():
    from bytemtp.config_io import small, tiny

    def value(output, key):
        line = next(line for line in output.splitlines() if line.split()[:1] == [key])
        return line.split()[1]

    assert tiny().model.d_model != small().model.d_model
    res = run("config", "--keys", "--preset", "tiny", "--set", "train.lr=0.003")
    assert res.exit_code == 0, res.output
    assert value(res.output, "model.d_model") == str(tiny().model.d_model)
    assert value(res.output, "model.seq_len") == str(tiny().model.seq_len)
    assert value(res.output, "train.lr") == "0.003" and "value (tiny)" in res.output
    assert value(run("config", "--keys").output, "model.d_model") == str(small().model.d_model)


def test_console_script_and_module_entry_point():
    out = subprocess.run([sys.executable, "-m", "bytemtp_cli", "--version"], capture_output=True,
                         text=True, check=True)
    assert "bytemtp" in out.stdout
    script = pathlib.Path(sys.executable).parent / "bytemtp"  # the one installed with this python
    bad = subprocess.run([str(script if script.exists() else "bytemtp"), "config", "--preset", "tiny", "--set", "loss.head_weights=x"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "loss.head_weights" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.slow
def test_bench_train_step_writes_all_keys(tmp_path):
    path = tmp_path / "bench.json"
    res = run("bench", "train-step", "--preset", "tiny", "--steps", "1", "--warmup", "0",
              "--batch-size", "2", "--compile", "off", "--json", str(path))
    assert res.exit_code == 0, res.output
    data = json.loads(path.read_text())
    for key in ("ntp_step_s", "mtp_step_s", "mtp_plain_step_s", "ntp_peak_mb", "mtp_peak_mb",
                "mtp_plain_peak_mb", "time_ratio", "memory_ratio", "plain_memory_ratio"):
        assert data[key] > 0, key
    assert data["time_ratio"] == pytest.approx(data["mtp_step_s"] / data["ntp_step_s"])
    assert data["memory_ratio"] == pytest.approx(data["mtp_peak_mb"] / data["ntp_peak_mb"])
    assert "time_ratio" in res.output
    # one timed round shows no spread: its pair ratio is the whole result, flagged as unjudged
    assert data["time_ratio_min"] == data["time_ratio_median"] == data["time_ratio_max"] > 0
    assert data["time_ratio_runs"] == [data["time_ratio_min"]] and data["time_ratio_spread"] == 0
    assert data["time_ratio_noisy"] is True and "3 or more" in data["time_ratio_note"]
    assert data["steps"] == 1 and data["warmup"] == 0 and data["steps_per_sample"] == 1
    assert "note: 1 timed round(s)" in res.output


def test_inspect_reports_a_checkpoint_and_damage(tmp_path):
    import torch

    from bytemtp.config_io import tiny
    from bytemtp.model.model import ByteMTP
    from bytemtp.runtime.checkpoint import save_checkpoint

    cfg = tiny()
    model = ByteMTP(cfg.model)
    optimizer = torch.optim.AdamW(model.parameters())
    save_checkpoint(tmp_path / "run", step=7, model=model, config=cfg,
                    train_state={"bytes_seen": 1234}, optimizer=optimizer)
    res = run("inspect", str(tmp_path / "run"))
    assert res.exit_code == 0, res.output
    assert "step        7" in res.output and f"{model.num_params():,} parameters" in res.output
    assert "bytes_seen" in res.output and "model.safetensors" in res.output
    weights = tmp_path / "run" / "checkpoints" / "step-00000007" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:50])
    res = run("inspect", str(tmp_path / "run"))
    assert res.exit_code != 0 and "model.safetensors" in res.output and "truncated or corrupt" in res.output
    res = run("inspect", str(tmp_path / "nothing"))
    assert res.exit_code != 0 and "does not exist" in res.output


def _source_tree(root):
    src = root / "src"
    (src / "pkg").mkdir(parents=True)
    for i in range(30):
        (src / "pkg" / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * (i + 1))
    (src / "pkg" / "dup.py").write_text("def f1(x):\n    return x * 1\n" * 2)  # a duplicate of m1
    (src / "notes.txt").write_text("not code")
    return src


def test_prep_and_corpus_info(tmp_path):
    src = _source_tree(tmp_path)
    out = tmp_path / "corpus"
    res = run("prep", str(src), "--out", str(out), "--include", "*.py", "--val-fraction", "0.1",
              "--licence", "MIT")
    assert res.exit_code == 0, res.output
    assert "duplicates removed: 1" in res.output and "train" in res.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["train"]["documents"] + manifest["splits"]["val"]["documents"] == 30
    info = run("corpus-info", str(out))
    assert info.exit_code == 0 and "MIT" in info.output and "ratio" in info.output
    raw = run("corpus-info", str(src))
    assert raw.exit_code == 0 and "documents" in raw.output
    again = run("prep", str(src), "--out", str(out))
    assert again.exit_code != 0 and "corpus" in again.output and "Traceback" not in again.output


@pytest.mark.parametrize("args,words", [
    (["prep", "/nonexistent/src", "--out", "/tmp/x-never"], "does not exist"),
    (["corpus-info", "/nonexistent/corpus"], "does not exist"),
])
def test_data_errors_are_one_line(args, words):
    res = run(*args)
    assert res.exit_code != 0 and words in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_corrupt_shard_is_one_line(tmp_path):
    src = _source_tree(tmp_path)
    out = tmp_path / "corpus"
    assert run("prep", str(src), "--out", str(out), "--val-fraction", "0").exit_code == 0
    shard = next((out / "train").glob("shard-00000.*"))  # the name depends on the corpus format
    shard.write_bytes(shard.read_bytes()[:-7])
    res = run("corpus-info", str(out / "train"))
    assert res.exit_code != 0 and "truncated" in res.output and shard.name in res.output
    assert len(res.output.strip().splitlines()) == 1


@pytest.mark.skipif(shutil.which("zstd") is None, reason="the loader benchmark compares against the zstd command")
def test_bench_loader(tmp_path, monkeypatch):
    import bytemtp.experiments.loader_bench

    src = _source_tree(tmp_path)
    out = tmp_path / "corpus"
    assert run("prep", str(src), "--out", str(out), "--val-fraction", "0").exit_code == 0
    # the timed runs take the seconds given here, in turn: zstd 0.5 s, then the loader's epoch 2 s
    reads = iter([0.0, 0.5, 0.5, 2.5])
    monkeypatch.setattr(bytemtp.experiments.loader_bench, "time", types.SimpleNamespace(perf_counter=lambda: next(reads)))
    path = tmp_path / "loader.json"
    res = run("bench", "loader", "--data", str(out), "--seq-len", "64", "--repeats", "1", "--json", str(path))
    assert res.exit_code == 0, res.output
    data = json.loads(path.read_text())
    shard = out / "train" / "shard-00000.zst"
    # the shard's documents, all of the source files but the duplicate, as `zstd -dc` prints them
    size = len(subprocess.run(["zstd", "-dcq", str(shard)], capture_output=True, check=True).stdout)
    assert size == sum(p.stat().st_size for p in src.rglob("*") if p.is_file() and p.name != "dup.py")
    assert data["shard"] == str(shard) and data["decompressed_bytes"] == size
    assert data["compressed_bytes"] == shard.stat().st_size
    assert (data["zstd_s"], data["loader_s"]) == (0.5, 2.0)
    assert data["zstd_mb_s"] == pytest.approx(size / 0.5 / 1e6) and data["loader_mb_s"] == pytest.approx(size / 2e6)
    assert data["ratio"] == pytest.approx(0.25) and data["pair_ratios"] == [pytest.approx(0.25)]


@pytest.mark.skipif(shutil.which("zstd") is None, reason="the loader benchmark compares against the zstd command")
def test_bench_loader_vs_a_parquet_file_of_the_same_documents(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    import bytemtp.experiments.loader_bench
    from bytemtp.data.readers import reader_for
    from corpora import write_table

    out = tmp_path / "corpus"
    assert run("prep", str(_source_tree(tmp_path)), "--out", str(out), "--val-fraction", "0").exit_code == 0
    shard = out / "train" / "shard-00000.zst"
    docs = list(reader_for(shard).documents())
    write_table(tmp_path / "same.parquet", docs, groups=[2, len(docs) - 2], column_type="binary")
    # zstd 0.5 s, the loader on the shard 2 s, on the Parquet file 2.5 s: 0.8 of the shard's rate
    reads = iter([0.0, 0.5, 0.5, 2.5, 2.5, 5.0])
    monkeypatch.setattr(bytemtp.experiments.loader_bench, "time", types.SimpleNamespace(perf_counter=lambda: next(reads)))
    path = tmp_path / "loader.json"
    res = run("bench", "loader", "--data", str(out), "--seq-len", "64", "--repeats", "1",
              "--vs", str(tmp_path / "same.parquet"), "--json", str(path))
    assert res.exit_code == 0, res.output
    vs = json.loads(path.read_text())["vs"]
    assert vs["document_bytes"] == sum(map(len, docs)) and vs["s"] == 2.5
    assert vs["ratio"] == pytest.approx(0.8) and vs["pair_ratios"] == [pytest.approx(0.8)]
    assert "same.parquet / shard 0.800 (document bytes a second" in res.output


# --- every option a message suggests is one its command has ---------------------------------------

_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# a program named in a message, with the arguments after it: `bytemtp eval --split train`, torchrun ...
_PROGRAM = re.compile(r"\b(bytemtp|torchrun|zstd)((?:\s+(?:--[\w-]+(?:=[^\s;,()`]*)?,?|[^\s;,()`'\"-][^\s;,()`'\"]*))*)")
ANY = "every command"
# The library functions (and constants) whose messages name options, and the commands that show
# them; a new one fails the test until it is listed here.
LIBRARY_MESSAGES = {
    "bytemtp.experiments.step_bench.noise_note": ("bench train-step", "bench all"),
    "bytemtp.experiments.step_bench.train_step": ("bench train-step",),  # bench all steps eager
    "bytemtp.config.Config.__post_init__": ("tune-heads",),  # model.draft outside a tune
    "bytemtp.data.compression._zstd_error": ANY,
    "bytemtp.data.corpus._empty_split": ANY,
    "bytemtp.data.prep.build_atomically": ("prep", "task-corpus"),
    "bytemtp.data.prep.empty_val_note": ("prep", "task-corpus"),
    "bytemtp.data.intake._receive": ("prep",),
    "bytemtp.data.intake.Part.parse": ("prep",),
    "bytemtp.data.merge.read_parts": ("prep",),
    "bytemtp.data.merge.merge": ("prep",),
    "bytemtp.data.columnar._check_field": ("prep", "corpus-info", "verify"),  # train says data.field
    "bytemtp.data.prep._build": ("prep",),  # its --field message needs no documents: task-corpus writes some
    "bytemtp.data.prep.split_record": ("prep",),  # task-corpus passes a val fraction only
    "bytemtp.data.prep.val_files": ("prep",),
    "bytemtp.evaluation.execution.OPT_IN": ("eval-task humaneval",),
    "bytemtp.evaluation.execution.Isolation.resolve": ("eval-task humaneval",),
    "bytemtp.evaluation.humaneval_records.HumanEvalRun.table": ("eval-task humaneval",),  # --compare, unmeasured
    "bytemtp.interop.export.export_hf": ("export",),
    "bytemtp.interop.export.model_card": ("export",),
    "bytemtp.experiments.quality.compare": ("bench quality",),
    "bytemtp.experiments.quality.parse_arm": ("bench quality",),
    "bytemtp.experiments.token_bench.compare": ("bench tokens",),
    "bytemtp.experiments.token_results.TokenBench.load_warnings": ("bench tokens",),
    "bytemtp.experiments.sweep.run_sweep": ("bench sweep", "bench quality", "bench tokens"),
    "bytemtp.experiments.serve_bench.ServeSpeed.table": ("bench serve",),  # the compile policy, as --compile
    "bytemtp.training.runs.plan_config": ("train", "tune-heads"),
    "bytemtp.training.runs.plan_run": ("train",),  # tune-heads passes no preset: its --preset message is train's
    "bytemtp.training.runs.plan_tune": ("tune-heads",),
    "bytemtp.training.train_state.TrainState.load_state_dict": ("train", "tune-heads"),
}


def _commands(group, path=()):
    """{"bench decode": command, ...}: every command under the group, by the words that run it."""
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*path, name))
        else:
            yield " ".join((*path, name)), cmd


def _options(cmd) -> set[str]:
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")} | {"--help"}


def _messages(node) -> list[str]:
    """The texts in a piece of code that could be messages (with a space; docstrings left out), an
    f-string as one text."""
    docs = {id(n.body[0].value) for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Module))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    inner = {id(v) for n in ast.walk(node) if isinstance(n, ast.JoinedStr) for v in n.values}
    texts = []
    for n in ast.walk(node):
        if isinstance(n, ast.JoinedStr):
            texts.append("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in n.values))
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs | inner:
            texts.append(n.value)
    return [t for t in texts if _OPTION.search(t) and re.search(r"\s", t)]


def _suggested(text: str, command: str, commands: dict) -> list[tuple[str, str]]:
    """(command, option) for each option in a message: the command it names (`bytemtp eval --split`),
    or the one that shows it; options of other programs (torchrun, zstd) left out."""
    got, spans = [], []
    for m in _PROGRAM.finditer(text):
        spans.append(m.span())
        if m[1] == "bytemtp":
            words = m[2].split()
            named = max((" ".join(words[:i]) for i in range(1, len(words) + 1) if " ".join(words[:i]) in commands),
                        key=len, default=None)
            assert named or not _OPTION.search(m[2]), f"{text!r}: `bytemtp {m[2].strip()}` is not a command"
            got += [(named, o) for o in _OPTION.findall(m[2])]
    for m in _OPTION.finditer(text):
        if not any(a <= m.start() < b for a, b in spans):
            got.append((command, m[0]))
    return got


def _reachable_cli_code(func) -> list:
    """The syntax trees of a command's function and of the CLI functions and constants it uses,
    directly or through others (option callbacks too)."""
    seen, trees, todo = set(), [], [func]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
        if inspect.isfunction(obj):
            tree.body[0].decorator_list = [k.value for d in tree.body[0].decorator_list
                                           for k in getattr(d, "keywords", []) if k.arg == "callback"]
        trees.append(tree)
        scope = vars(sys.modules[obj.__module__])
        for n in ast.walk(tree):
            target = scope.get(n.id) if isinstance(n, ast.Name) else None
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
                module = scope.get(n.value.id)
                target = getattr(module, n.attr, None) if inspect.ismodule(module) else None
            if inspect.isfunction(target) and target.__module__.startswith("bytemtp_cli"):
                todo.append(target)
            elif isinstance(n, ast.Name) and isinstance(target, (str, dict, tuple)):
                assign = [a for a in ast.parse(inspect.getsource(sys.modules[obj.__module__])).body
                          if isinstance(a, ast.Assign) and any(getattr(t, "id", None) == n.id for t in a.targets)]
                trees += assign
    return trees


def _library_messages() -> dict[str, list[str]]:
    """{qualified name: messages} of every library function, method or constant whose messages
    name an option."""
    import bytemtp

    found = {}
    root = pathlib.Path(bytemtp.__file__).parent
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        for node in ast.parse(path.read_text()).body:
            inside = node.body if isinstance(node, ast.ClassDef) else [node]
            for item in inside:
                name = getattr(item, "name", None) or next((t.id for t in getattr(item, "targets", [])
                                                            if isinstance(t, ast.Name)), None)
                prefix = f"{module}.{node.name}." if isinstance(node, ast.ClassDef) else f"{module}."
                if name and (messages := _messages(item)):
                    found[prefix + name] = messages
    return found


def test_every_option_a_message_suggests_is_one_its_command_has():
    """A message that names a fix names one that exists: each --option in what a command can print
    (its code, the CLI code it uses, the library messages listed above) is an option of that
    command, or of the command the message names (`bytemtp prep --val-fraction`)."""
    commands = dict(_commands(main))
    library = _library_messages()
    assert set(library) == set(LIBRARY_MESSAGES), "list each library message that names options, with its commands"
    wrong = []
    for command, cmd in commands.items():
        texts = [t for tree in _reachable_cli_code(cmd.callback) for t in _messages(tree)]
        texts += [t for name, shown in LIBRARY_MESSAGES.items() if shown == ANY or command in shown
                  for t in library[name]]
        for text in texts:
            wrong += [f"{named}: {option} in {text!r}" for named, option in _suggested(text, command, commands)
                      if option not in _options(commands[named])]
    assert not wrong, "\n".join(sorted(set(wrong)))


# --- one decoding vocabulary: the same options, spelt alike, in every command that decodes ----------

DECODING_COMMANDS = ("generate", "serve", "eval-task humaneval", "bench decode", "bench serve", "bench tokens")


def _command(words: str):
    return dict(_commands(main))[words]


def _param(cmd, opt: str):
    return next((p for p in cmd.params if opt in p.opts), None)


@pytest.mark.parametrize("opt", ["--draft", "--compile", "--dtype", "--prompts", "--n-prompts", "--temperature",
                                 "--top-k", "--top-p", "--seed"])
def test_every_decoding_command_spells_a_decoding_option_alike(opt):
    """Each decoding option has one help text (the list form of --draft says so first), and
    --prompts is a file wherever it is shown."""
    helps = {}
    for words in DECODING_COMMANDS:
        p = _param(_command(words), opt)
        if p is not None and not p.hidden:
            text = re.sub(r"\s*\[default: [^]]*\]$", "", p.help)
            helps[words] = text.split("; a draft is ")[-1].split("How decoding drafts: ")[-1]
    assert len(set(helps.values())) == 1, helps
    wanted = {"--draft": DECODING_COMMANDS, "--compile": DECODING_COMMANDS, "--dtype": DECODING_COMMANDS,
              "--prompts": ("generate", "bench decode", "bench serve", "bench tokens"),
              "--n-prompts": ("generate", "bench decode", "bench serve", "bench tokens"),
              "--temperature": ("generate", "eval-task humaneval", "bench decode", "bench tokens")}
    assert set(wanted.get(opt, wanted["--temperature"])) <= set(helps), helps
    if opt == "--prompts":
        assert all("one JSON object a line" in h for h in helps.values())


def test_old_spellings_are_hidden_from_help():
    for words, old in [("generate", ("--heads", "--lookup", "--no-speculative")), ("serve", ("--lookup",)),
                       ("eval-task humaneval", ("--heads",)), ("bench decode", ("--modes",)),
                       ("tune-heads", ("--temperature", "--draft")), ("bench quality", ("--prompts",)),
                       ("bench sweep", ("--prompts",))]:
        res = run(*words.split(), "--help")
        assert res.exit_code == 0, res.output
        for opt in old:
            assert not re.search(rf"^\s+{opt}\b", res.output, re.M), (words, opt)


def _captured(monkeypatch, target: str) -> dict:
    """Replace a library function by one that keeps its arguments and stops the command."""
    module, name = target.rsplit(".", 1)
    got = {}

    def capture(*args, **kwargs):
        got.update(kwargs, args=args)
        raise ValueError("captured")
    monkeypatch.setattr(__import__(module, fromlist=[name]), name, capture)
    return got


def test_old_spellings_are_read_into_the_new_with_a_note(monkeypatch, tmp_path):
    from bytemtp.decoding.strategy import Draft

    got = _captured(monkeypatch, "bytemtp.experiments.bench.decode_speed")
    res = run("bench", "decode", "--ckpt", "x", "--modes", "auto,chain-4")
    assert "note: --modes is now --draft; read as --draft auto,chain-4" in res.output, res.output
    assert got["modes"] == (Draft(), Draft(4)) and "captured" in res.output
    res = run("bench", "decode", "--ckpt", "x", "--modes", "auto", "--draft", "plain")
    assert res.exit_code == 2 and "give --draft alone: --modes is its older spelling" in res.output

    got = _captured(monkeypatch, "bytemtp.experiments.token_bench.compare")
    res = run("bench", "tokens", "--out", str(tmp_path / "t"), "--prompts", "3", "--temperature", "1e-9",
              "--seed", "5", "--dtype", "bfloat16")
    assert "note: --prompts 3 is now --n-prompts 3; read as --n-prompts 3" in res.output, res.output
    assert (got["n_prompts"], got["prompts_path"], got["temperature"], got["seed"], got["dtype"]) == (
        3, None, 0.0, 5, "bfloat16")  # a temperature below the greedy threshold is greedy here too
    assert run("bench", "tokens", "--out", str(tmp_path / "t"), "--prompts", "3", "--n-prompts", "4").exit_code == 2

    got = _captured(monkeypatch, "bytemtp.experiments.quality.compare")
    res = run("bench", "quality", "--out", str(tmp_path / "q"), "--prompts", "3")
    assert "--n-prompts 3" in res.output and got["prompts"] == 3
    res = run("bench", "quality", "--out", str(tmp_path / "q"), "--prompts", __file__)
    assert res.exit_code == 2 and "cuts its prompts from the corpus's val split" in res.output

    got = _captured(monkeypatch, "bytemtp.training.runs.plan_tune")
    res = run("tune-heads", "--ckpt", "x", "--out", str(tmp_path / "u"), "--temperature", "2", "--draft", "medusa")
    assert "note: --temperature is now --teacher-temperature; read as --teacher-temperature 2.0" in res.output
    assert "note: --draft is now --drafter; read as --drafter medusa" in res.output
    assert {"loss.teacher_temperature=2.0", "model.draft=medusa"} <= set(got["overrides"])


@pytest.mark.parametrize("seed", [str(2 ** 64), str(-2 ** 63 - 1)])
def test_a_seed_out_of_range_is_one_line_naming_its_range(seed):
    res = run("bench", "decode", "--ckpt", "x", "--seed", seed)
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "--seed" in res.output and "a seed is an integer from -2**63 to 2**64-1" in res.output


@pytest.mark.parametrize("old,args,read_as", [
    (("lookup",), [], None),  # serve: the default
    (("lookup",), ["--no-lookup"], "auto"),
    (("lookup",), ["--draft", "plain", "--no-lookup"], "plain"),
    (("lookup",), ["--draft", "plain", "--lookup"], "plain+lookup"),
    (("heads",), ["--heads", "3"], "chain-3"),  # eval-task humaneval: no lookup there
    (("heads", "lookup", "no-speculative"), ["--heads", "3"], "chain-3+lookup"),  # generate: lookup was on
    (("heads", "lookup", "no-speculative"), ["--draft", "chain", "--no-speculative"], "plain"),
])
def test_the_older_draft_options_of_each_command_read_as_they_decoded(old, args, read_as):
    from bytemtp_cli.options import decoding_options

    @click.command()
    @decoding_options(old=old)
    def cmd(draft):
        click.echo(f"drafts {draft}")

    res = CliRunner().invoke(cmd, args)
    assert res.exit_code == 0, res.output
    assert res.stdout == f"drafts {read_as or 'auto+lookup'}\n"
    assert (read_as is None) == (res.stderr == "") and res.stderr.endswith(f"read as --draft {read_as}\n" if read_as else "")
