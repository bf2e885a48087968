import dataclasses
import json

import pytest
import torch

from bytemtp import config as C
from bytemtp import config_io
from bytemtp.config_docs import field_docs
from bytemtp.model.model import ByteMTP


def test_defaults_and_presets_are_valid():
    for name in config_io.PRESETS:
        cfg = config_io.preset(name)
        assert isinstance(cfg.model, C.ModelConfig)
    assert config_io.tiny().model.total_layers == config_io.tiny().model.n_layers


@pytest.mark.parametrize("field,value,words", [
    ("n_layers", 0, "model.n_layers"),
    ("n_layers", 8, "use n_layers >= 9"),
    ("d_model", -4, "model.d_model"),
    ("n_attn_heads", 3, "model.n_attn_heads"),
    ("n_future", 0, "model.n_future"),
    ("head_type", "mlp", "transformer, linear, causal"),
    ("unembed", "tied", "shared, replicated"),
    ("mlp", "relu", "swiglu, gelu"),
    ("dropout", 1.5, "model.dropout"),
    ("seq_len", 2.5, "model.seq_len"),
    ("param_match", 1, "model.param_match"),
    ("doc_mask", "yes", "model.doc_mask"),
])
def test_model_validation_names_field_and_allowed(field, value, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        dataclasses.replace(C.ModelConfig(), **{field: value})


def test_loss_validation():
    with pytest.raises(ValueError, match="loss.head_weights.*uniform, geometric"):
        C.LossConfig(head_weights="linear")
    with pytest.raises(ValueError, match="loss.geometric_decay"):
        C.LossConfig(geometric_decay=0.0)
    assert C.LossConfig(head_weights="geometric", geometric_decay=0.5).weights(3) == [1.0, 0.5, 0.25]
    assert C.LossConfig().weights(2) == [1.0, 1.0]


def test_json_round_trip():
    cfg = C.Config(model=C.ModelConfig(n_future=4, head_type="causal", dropout=0.1),
                   loss=C.LossConfig(mask_after_eos=False))
    text = config_io.to_json(cfg)
    assert config_io.from_json(text) == cfg
    assert json.loads(text)["model"]["head_type"] == "causal"


def test_from_dict_rejects_unknown_keys_and_wrong_types():
    with pytest.raises(ValueError, match="unknown setting model.widht"):
        config_io.from_dict(C.Config, {"model": {"widht": 3}})
    with pytest.raises(ValueError, match="model.n_layers='12'"):
        config_io.from_dict(C.Config, {"model": {"n_layers": "12"}})
    with pytest.raises(ValueError, match="model.param_match"):
        config_io.from_dict(C.Config, {"model": {"param_match": "yes"}})


def test_document_masking_is_off_unless_set_and_old_configs_load_without_it():
    assert config_io.apply_overrides(config_io.tiny(), ["model.doc_mask=true"]).model.doc_mask
    old = json.loads(config_io.to_json(config_io.tiny()))
    del old["model"]["doc_mask"]  # a checkpoint written before the option existed
    assert config_io.from_dict(C.Config, old).model.doc_mask is False


def test_overrides():
    cfg = config_io.apply_overrides(config_io.tiny(), ["model.n_future=4", "model.param_match=false",
                                       "loss.head_weights=geometric", "model.dropout=0.25"])
    assert (cfg.model.n_future, cfg.model.param_match, cfg.model.dropout) == (4, False, 0.25)
    assert cfg.loss.head_weights == "geometric"
    for bad, words in [("model.n_futur=4", "unknown setting model.n_futur"),
                       ("model=3", "is a section"), ("model.n_future", "key=value"),
                       ("model.n_future=four", "expected int"),
                       ("model.n_future.x=1", "is a setting, not a section")]:
        with pytest.raises(ValueError, match=words):
            config_io.apply_overrides(config_io.tiny(), [bad])


def test_config_file_then_overrides(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('[model]\nn_future = 2\nd_model = 64\n')
    cfg = config_io.resolve("tiny", config_file=str(toml), overrides=["model.n_future=3"])
    assert (cfg.model.n_future, cfg.model.d_model, cfg.model.seq_len) == (3, 64, config_io.tiny().model.seq_len)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json is not valid JSON"):
        config_io.resolve("tiny", config_file=str(bad))
    with pytest.raises(ValueError, match="cannot read config file"):
        config_io.resolve("tiny", config_file=str(tmp_path / "missing.toml"))
    with pytest.raises(ValueError, match="preset 'huge' does not exist"):
        config_io.preset("huge")


def test_every_field_has_a_docstring():
    for cls in (C.Config, C.ModelConfig, C.LossConfig, C.DataConfig, C.TrainConfig):
        docs = field_docs(cls)
        assert set(docs) == {f.name for f in dataclasses.fields(cls)}, cls
        assert all(docs.values())


def test_layer_accounting():
    m = C.ModelConfig(n_layers=12, n_future=8)
    assert (m.trunk_layers, m.total_layers) == (4, 12)
    ntp = dataclasses.replace(m, n_future=1)
    assert (ntp.trunk_layers, ntp.total_layers) == (11, 12)
    off = dataclasses.replace(m, param_match=False)
    assert (off.trunk_layers, off.total_layers) == (11, 19)
    lin = dataclasses.replace(m, head_type="linear")
    assert (lin.trunk_layers, lin.total_layers) == (12, 12)
    two = dataclasses.replace(m, n_layers=20, head_layers=2)
    assert (two.trunk_layers, two.total_layers) == (4, 20)


def _arithmetic_params(m: C.ModelConfig, vocab: int = 264) -> int:
    """Parameter count from the architecture's definition, independent of the model code."""
    d, f = m.d_model, m.ffn_dim
    attention = 4 * d * d  # fused q, k, v and the output projection, no biases
    mlp = 3 * d * f  # SwiGLU: gate, up and down
    layer = attention + mlp + 2 * d  # two RMSNorm weights
    heads_norm = m.n_future * d
    unembed = (m.n_future if m.unembed == "replicated" else 1) * vocab * d
    ngrams = max(0, m.ngram_embeds - 1) * m.ngram_rows * d  # hashed n-gram tables: lookups
    return vocab * d + m.total_layers * layer + heads_norm + unembed + ngrams


def test_paper_7b_byte_builds_on_meta_with_the_right_count():
    cfg = config_io.paper_7b_byte().model
    assert (cfg.n_layers, cfg.d_model, cfg.n_attn_heads, cfg.n_future, cfg.seq_len, cfg.unembed) == (
        32, 4096, 32, 8, 8192, "replicated")
    with torch.device("meta"):
        model = ByteMTP(cfg)
    assert all(p.is_meta for p in model.parameters())
    n = model.num_params()
    assert n == _arithmetic_params(cfg)
    assert 6.4e9 < n < 6.6e9  # the Llama-7B body: 32 x (4 x 4096^2 + 3 x 4096 x 11008)


@pytest.mark.parametrize("name", ["tiny", "small", "base"])
def test_preset_counts_match_arithmetic(name):
    cfg = config_io.preset(name).model
    with torch.device("meta"):
        model = ByteMTP(cfg)
    assert model.num_params() == _arithmetic_params(cfg)
    if name == "base":  # about 100M in its layers, 12.6M more in its n-gram tables
        assert 90e6 < model.num_params() - model.num_params("ngram") < 115e6


@pytest.mark.parametrize("name", ["base", "paper-7b-byte"])
def test_presets_keep_heads_a_minority_of_the_layers(name):
    """Every speculative pass pays for the heads it runs: as in the paper's 7B byte model (24 + 8),
    the GPU presets' trunk has three times the heads' layers."""
    cfg = config_io.preset(name).model
    assert cfg.trunk_layers == 3 * cfg.n_future * cfg.layers_per_head


def test_data_validation():
    with pytest.raises(ValueError, match="data.batch_size"):
        C.DataConfig(batch_size=0)
    with pytest.raises(ValueError, match="data.num_workers"):
        C.DataConfig(num_workers=-1)
    with pytest.raises(ValueError, match="data.max_bad_fraction"):
        C.DataConfig(max_bad_fraction=2.0)
    cfg = config_io.apply_overrides(config_io.tiny(), ["data.path=corp", "data.num_workers=2"])
    assert (cfg.data.path, cfg.data.num_workers) == ("corp", 2)
