"""The Hugging Face export: bytemtp's logits, heads and greedy decoding through transformers, the
byte tokenizer, the folder loading back into bytemtp, and one-line errors.

Writing an export and loading it back into bytemtp need no transformers; the tests that load the
folder with transformers take the `hf` fixture, which skips them where it is not installed.
"""

import ast
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from bytemtp import config as C
from bytemtp import config_io
from bytemtp.decoding.decode import generate
from bytemtp.interop import remote_code
from bytemtp.interop.export import export_hf
from bytemtp.model.layout import build_layout
from bytemtp.model.model import ByteMTP
from bytemtp.runtime.checkpoint import CheckpointError, load_model, save_checkpoint
from bytemtp.vocab import BOS, EOS, PAD, VOCAB_SIZE
from bytemtp_cli.export import export_cmd

CODE = Path(remote_code.__file__).parent
# one worker loads the exports: transformers copies their code into one shared modules cache
pytestmark = pytest.mark.xdist_group("hf")

# (head_type, unembed, mlp, head_layers, value_embeds, ngram_embeds): every head type, unembedding and
# MLP at least once, value embeddings, and hashed n-gram tables (generate's cache keeps their ids)
VARIANTS = [("transformer", "replicated", "swiglu", 2, 2, 4), ("linear", "shared", "gelu", 1, 0, 0),
            ("causal", "replicated", "gelu", 1, 0, 3)]


def make_config(head_type="transformer", unembed="replicated", mlp="swiglu", head_layers=2,
                value_embeds=0, ngram_embeds=0) -> C.Config:
    cfg = config_io.tiny()
    n_layers = 2 + (0 if head_type == "linear" else 3 * head_layers)
    model = dataclasses.replace(cfg.model, head_type=head_type, unembed=unembed, mlp=mlp, head_layers=head_layers,
                                n_future=3, n_layers=n_layers, value_embeds=value_embeds, ngram_embeds=ngram_embeds,
                                ngram_rows=512)
    return dataclasses.replace(cfg, model=model)


def save_run(run_dir: Path, cfg: C.Config, seed: int = 0) -> ByteMTP:
    model = ByteMTP(cfg.model)
    model.init_weights(torch.Generator().manual_seed(seed))
    save_checkpoint(run_dir, step=1, model=model, config=cfg, train_state={"bytes_seen": 0})
    return model.eval()


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Per variant: the source model and its export folder (written once per module)."""
    made = {}
    for i, variant in enumerate(VARIANTS):
        root = tmp_path_factory.mktemp(f"variant{i}")
        model = save_run(root / "run", make_config(*variant), seed=i)
        made[variant] = model, export_hf(root / "run", root / "hf")
    return made


@pytest.fixture(scope="module")
def hf():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # loading reads the folder only, never the network
    return pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def loaded(exports, hf):
    """Per variant: (source model, the export loaded with transformers, its tokenizer)."""
    return {variant: (model, hf.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval(),
                      hf.AutoTokenizer.from_pretrained(folder, trust_remote_code=True))
            for variant, (model, folder) in exports.items()}


def random_ids(B: int, T: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 258, (B, T), generator=torch.Generator().manual_seed(seed))


# --- the folder ---------------------------------------------------------------------------------


def test_folder_holds_config_weights_code_and_card(exports):
    model, folder = exports[VARIANTS[0]]
    names = {p.name for p in folder.iterdir()}
    assert names == {"config.json", "model.safetensors", "generation_config.json", "tokenizer_config.json",
                     "README.md", *remote_code.FILES}
    config = json.loads((folder / "config.json").read_text())
    source = json.loads((folder.parent / "run" / "checkpoints" / "step-00000001" / "config.json").read_text())
    assert config["bytemtp"] == source  # exactly the checkpoint's own config.json
    assert config["model_type"] == "bytemtp" and config["architectures"] == ["ByteMTPForCausalLM"]
    assert set(config["auto_map"]) == {"AutoConfig", "AutoModelForCausalLM", "AutoTokenizer"}
    model_keys = {k: v for k, v in source["config"]["model"].items() if k != "vocab_size"}
    assert {k: config[k] for k in model_keys} == model_keys  # vocab_size: the table's rows in transformers
    assert (config["vocab_size"], config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (
        VOCAB_SIZE, BOS, EOS, PAD)
    assert config["dtype"] == config["torch_dtype"] == "float32"
    generation = json.loads((folder / "generation_config.json").read_text())
    assert (generation["eos_token_id"], generation["pad_token_id"]) == (EOS, PAD)
    assert EOS not in generation["suppress_tokens"] and {BOS, PAD} <= set(generation["suppress_tokens"])
    tokenizer = json.loads((folder / "tokenizer_config.json").read_text())
    assert tokenizer["auto_map"]["AutoTokenizer"][0] == "tokenization_bytemtp.ByteMTPTokenizer"
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        assert f.metadata()["format"] == "pt"
        assert set(f.keys()) == set(model.state_dict())  # bytemtp's names: every head and unembedding
    for name in remote_code.FILES:
        assert (folder / name).read_bytes() == (CODE / name).read_bytes()
    card = (folder / "README.md").read_text()
    assert "future_logits" in card and "trust_remote_code=True" in card and "bytemtp generate" in card


def test_remote_code_never_imports_bytemtp():
    for name in remote_code.FILES:
        imported = set()
        for node in ast.walk(ast.parse((CODE / name).read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
        assert imported <= {"__future__", "math", "collections", "dataclasses", "torch", "transformers"}, name


@pytest.mark.slow  # a fresh interpreter imports torch
def test_export_needs_no_transformers(tmp_path):
    save_run(tmp_path / "run", make_config())
    code = ("import sys; from bytemtp.interop.export import export_hf; "
            f"export_hf({str(tmp_path / 'run')!r}, {str(tmp_path / 'hf')!r}); print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_bytemtp_loads_the_export_back(exports, tmp_path):
    model, folder = exports[VARIANTS[2]]
    back, cfg = load_model(folder)
    assert cfg.model == model.config
    for key, tensor in model.state_dict().items():
        assert torch.equal(back.state_dict()[key], tensor), key
    bf16 = export_hf(folder.parent / "run", tmp_path / "bf16", dtype="bfloat16")
    assert json.loads((bf16 / "config.json").read_text())["dtype"] == "bfloat16"
    back, _ = load_model(bf16, dtype="bfloat16")
    for key, tensor in model.state_dict().items():
        assert torch.equal(back.state_dict()[key], tensor.to(torch.bfloat16)), key
    again = export_hf(bf16, tmp_path / "again")  # an export exports again, keeping its dtype
    assert json.loads((again / "config.json").read_text())["dtype"] == "bfloat16"


def test_a_failed_export_leaves_nothing(exports, tmp_path, monkeypatch):
    from bytemtp.interop import export

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "save_file", full_disk)
    with pytest.raises(CheckpointError, match="nothing was written"):
        export_hf(exports[VARIANTS[0]][1].parent / "run", tmp_path / "hf")
    assert list(tmp_path.iterdir()) == []


def test_overwrite_replaces_an_export(exports, tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "old.txt").write_text("old")
    run = exports[VARIANTS[0]][1].parent / "run"
    with pytest.raises(ValueError, match="not empty"):
        export_hf(run, out)
    export_hf(run, out, overwrite=True)
    assert not (out / "old.txt").exists() and (out / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]
    with pytest.raises(ValueError, match="holds the checkpoint"):
        export_hf(out, out, overwrite=True)


# --- the command ----------------------------------------------------------------------------------


def invoke(*args):
    return CliRunner().invoke(export_cmd, list(args))


def test_command_writes_and_says_how_to_load(exports, tmp_path):
    res = invoke("--format", "hf", "--ckpt", str(exports[VARIANTS[1]][1].parent / "run"), "--out", str(tmp_path / "hf"))
    assert res.exit_code == 0, res.output
    first, *load = res.output.strip().splitlines()
    assert first.startswith(f"wrote {tmp_path / 'hf'}: ") and "parameters" in first and "MB" in first
    assert [line.split(" = ")[0].strip() for line in load] == ["model", "tokenizer"]
    assert all("trust_remote_code=True" in line for line in load)


@pytest.mark.parametrize("case", ["missing checkpoint", "existing folder", "bad dtype"])
def test_command_errors_are_one_line(exports, tmp_path, case):
    run = exports[VARIANTS[0]][1].parent / "run"
    out = tmp_path / "hf"
    out.mkdir()
    (out / "x").write_text("x")
    args = {"missing checkpoint": ["--ckpt", str(tmp_path / "nope"), "--out", str(tmp_path / "new")],
            "existing folder": ["--ckpt", str(run), "--out", str(out)],
            "bad dtype": ["--ckpt", str(run), "--out", str(tmp_path / "new"), "--dtype", "int8"]}[case]
    res = invoke(*args)
    assert res.exit_code != 0
    assert "Traceback" not in res.output and not isinstance(res.exception, (TypeError, AttributeError))
    lines = [line for line in res.output.splitlines() if line.startswith("Error")]
    assert len(lines) == 1, res.output
    assert {"missing checkpoint": "does not exist", "existing folder": "--force", "bad dtype": "int8"}[case] in lines[0]
    assert (out / "x").read_text() == "x" and not (tmp_path / "new").exists()


def test_a_doc_masked_model_is_refused_in_one_line(tmp_path):
    cfg = make_config()
    save_run(tmp_path / "run", dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, doc_mask=True)))
    with pytest.raises(ValueError, match="model.doc_mask=true"):
        export_hf(tmp_path / "run", tmp_path / "hf")
    res = invoke("--ckpt", str(tmp_path / "run"), "--out", str(tmp_path / "hf"))
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert [line for line in res.output.splitlines() if line.startswith("Error")] == res.output.strip().splitlines()
    assert not (tmp_path / "hf").exists() and [p.name for p in tmp_path.iterdir()] == ["run"]


def test_bytemtp_generate_reads_an_export(exports):
    from bytemtp_cli.generate import generate_cmd

    model, folder = exports[VARIANTS[0]]
    res = CliRunner().invoke(generate_cmd, ["--ckpt", str(folder), "--prompt", "def f", "--max-bytes", "12",
                                            "--compile", "off", "--raw"])
    assert res.exit_code == 0, res.output
    assert res.stdout_bytes == generate(model, b"def f", max_bytes=12).output


# --- through transformers -------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v)))
def test_logits_equal_bytemtp(loaded, variant):
    model, hf_model, _ = loaded[variant]
    ids = random_ids(2, 40)
    with torch.no_grad():
        expected = model.logits(ids, layout=build_layout(model, ids))  # (B, T, K, V)
        torch.testing.assert_close(hf_model(ids).logits, expected[:, :, 0], rtol=0, atol=1e-5)
        torch.testing.assert_close(hf_model.future_logits(ids), expected, rtol=0, atol=1e-5)


def test_config_mirrors_model_config(loaded):
    for model, hf_model, _ in loaded.values():
        cfg, hf_cfg = model.config, hf_model.config
        fields = {f.name for f in dataclasses.fields(cfg)} - {"vocab_size"}  # transformers': the table's rows
        assert {name: getattr(hf_cfg, name) for name in fields} == {k: v for k, v in dataclasses.asdict(cfg).items()
                                                                   if k in fields}
        assert hf_cfg.vocab_size == cfg.table_rows
        for name in ("head_dim", "layers_per_head", "trunk_layers", "total_layers", "ffn_dim"):
            assert getattr(hf_cfg, name) == getattr(cfg, name), name
        assert hf_cfg.num_hidden_layers == cfg.total_layers


def test_left_padding_gives_each_row_its_own_logits(loaded):
    model, hf_model, _ = loaded[VARIANTS[0]]
    long, short = random_ids(1, 20, seed=2), random_ids(1, 12, seed=3)
    ids = torch.cat([long, torch.cat([torch.full((1, 8), PAD), short], dim=1)])
    mask = (torch.arange(20) >= torch.tensor([[0], [8]])).long()
    with torch.no_grad():
        logits = hf_model(ids, attention_mask=mask).logits
        torch.testing.assert_close(logits[0], model.logits(long, heads=1, layout=build_layout(model, long))[0, :, 0],
                                   rtol=0, atol=1e-5)
        torch.testing.assert_close(logits[1, 8:], model.logits(short, heads=1, layout=build_layout(model, short))[0, :, 0],
                                   rtol=0, atol=1e-5)


def greedy_bytes(out_row: torch.Tensor, prompt_len: int) -> bytes:
    new = out_row[prompt_len:].tolist()
    return bytes(new[:new.index(EOS)] if EOS in new else new)


@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_equals_bytemtp_greedy(loaded, use_cache):
    model, hf_model, _ = loaded[VARIANTS[0]]  # two layers a head: the cache's layer numbering counts
    prompt = b"x = [1, 2"
    ids = torch.tensor([[EOS, *prompt]])  # bytemtp starts a document after EOS
    out = hf_model.generate(ids, max_new_tokens=24, do_sample=False, use_cache=use_cache)
    assert greedy_bytes(out[0], ids.shape[1]) == generate(model, prompt, max_bytes=24).output


def test_generate_a_left_padded_batch(loaded):
    model, hf_model, tokenizer = loaded[VARIANTS[2]]
    prompts = ["def add(a, b):", "é = 1"]
    batch = type(tokenizer)(document_start=True)(prompts, return_tensors="pt", padding=True)
    assert batch.attention_mask[1, 0] == 0  # the shorter prompt is padded on the left
    out = hf_model.generate(**batch, max_new_tokens=16, do_sample=False)
    for row, prompt in zip(out, prompts):
        expected = generate(model, prompt, max_bytes=16).output
        assert greedy_bytes(row, batch.input_ids.shape[1]) == expected


def test_inputs_past_the_context_are_refused(loaded):
    model, hf_model, _ = loaded[VARIANTS[1]]
    with pytest.raises(ValueError, match="context of 64 bytes"):
        hf_model(random_ids(1, model.config.seq_len + 1))


def test_labels_give_the_next_byte_cross_entropy(loaded):
    _, hf_model, _ = loaded[VARIANTS[1]]
    ids = random_ids(2, 16)
    labels = ids.clone()
    labels[0, 5:9] = -100
    out = hf_model(ids, labels=labels)
    logits, nats, count = out.logits.detach(), 0.0, 0
    for b in range(2):
        for t in range(15):
            if labels[b, t + 1] != -100:
                nats -= torch.log_softmax(logits[b, t], -1)[labels[b, t + 1]].item()
                count += 1
    assert out.loss.item() == pytest.approx(nats / count, rel=1e-5)


def test_tokenizer_is_utf8_bytes(loaded):
    *_, tokenizer = loaded[VARIANTS[0]]
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (BOS, EOS, PAD)
    assert len(tokenizer) == 259 and tokenizer.padding_side == "left"
    for text in ["plain ascii", "é, ü, 日本語, 🙂 and a\ttab\n", "<eos> is text here", ""]:
        ids = tokenizer(text).input_ids
        assert ids == list(text.encode("utf-8"))  # nothing added by default
        assert tokenizer.decode(ids) == text
    data = bytes(range(256))  # any bytes, through a str with surrogateescape
    assert tokenizer(data.decode("utf-8", "surrogateescape")).input_ids == list(data)
    assert tokenizer.decode([104, 0xFF, 105]) == "h\ufffdi"  # invalid UTF-8 reads as U+FFFD
    assert tokenizer.decode([EOS, 104, 105, PAD]) == "<eos>hi<pad>"
    assert tokenizer.decode([EOS, 104, 105, PAD], skip_special_tokens=True) == "hi"
    starts = type(tokenizer)(document_start=True)  # a prompt that starts a document, as in training
    assert starts("hi").input_ids == [EOS, 104, 105]
    assert starts(["hi", "a"], padding=True).input_ids == [[EOS, 104, 105], [PAD, EOS, 97]]


def test_a_new_model_starts_as_bytemtp_does(loaded):
    model, hf_model, _ = loaded[VARIANTS[0]]
    fresh, reference = type(hf_model)(hf_model.config), ByteMTP(model.config)
    for (name, p), (ref_name, q) in zip(fresh.named_parameters(), reference.named_parameters(), strict=True):
        assert name == ref_name
        assert p.std().item() == pytest.approx(q.std().item(), rel=0.25, abs=1e-6), name  # out projections smaller
