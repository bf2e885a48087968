"""Configurations in and out: the presets (`tiny`, `small`, `base`, `paper-7b-byte`: plain functions
returning a `Config`), the dict and JSON round trip (config.json, run-config.json), TOML or JSON
files of settings, the CLI's `--set section.key=value` overrides, and `resolve`, the CLI's order
(a preset, then a file, then each override). Every value is checked against the field's type here;
the dataclasses' own `__post_init__` then checks what it means.

No torch here. Kept apart from `bytemtp.config`, which says what the settings are, so that module
stays readable at a glance; it sits on floor 1, above `config`, because it builds on config's
classes and two modules on one floor do not import each other (tests/test_layering.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tomllib
import typing
from typing import Any

from bytemtp.config import Config, DataConfig, LossConfig, ModelConfig, TrainConfig


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def to_json(cfg: Any) -> str:
    return json.dumps(to_dict(cfg), indent=2, sort_keys=True)


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(path: str, typ: Any, value: Any) -> Any:
    if dataclasses.is_dataclass(typ):
        if not isinstance(value, dict):
            raise ValueError(f"{path} must be a table of settings, got {value!r}")
        return from_dict(typ, value, prefix=path + ".")
    if typ is bool:
        ok = isinstance(value, bool)
    elif typ is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif typ is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, typ)
    if not ok:
        raise ValueError(f"{path}={value!r} is not allowed; expected {typ.__name__}")
    return value


def from_dict(cls: type, data: dict, *, prefix: str = "") -> Any:
    """Build `cls` from a nested dict; unknown keys and wrong types raise ValueError."""
    types = _field_types(cls)
    unknown = sorted(set(data) - set(types))
    if unknown:
        raise ValueError(f"unknown setting {prefix}{unknown[0]}; "
                         f"allowed: {', '.join(prefix + k for k in types)}")
    kwargs = {k: _coerce(prefix + k, types[k], v) for k, v in data.items()}
    return cls(**kwargs)


def from_json(text: str, cls: type = Config) -> Any:
    return from_dict(cls, json.loads(text))


def _parse_value(path: str, typ: Any, text: str) -> Any:
    if typ is bool:
        if text.lower() in ("true", "1", "yes", "on"):
            return True
        if text.lower() in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"{path}={text!r} is not allowed; expected true or false")
    if typ in (int, float):
        try:
            return typ(text)
        except ValueError:
            raise ValueError(f"{path}={text!r} is not allowed; expected {typ.__name__}") from None
    return text


def apply_overrides(cfg: Any, overrides: list[str]) -> Any:
    """Apply `a.b=value` strings (the CLI's repeated --set) to a frozen config, validating them."""
    data = to_dict(cfg)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not of the form section.key=value")
        parts = key.strip().split(".")
        cls, node = type(cfg), data
        for depth, part in enumerate(parts):
            types = _field_types(cls)
            here = ".".join(parts[: depth + 1])
            if part not in types:
                allowed = ", ".join(".".join(parts[:depth] + [k]) for k in types)
                raise ValueError(f"unknown setting {here}; allowed: {allowed}")
            typ = types[part]
            if depth == len(parts) - 1:
                if dataclasses.is_dataclass(typ):
                    raise ValueError(f"{here} is a section; set one of its keys, e.g. {here}.<key>=value")
                node[part] = _parse_value(here, typ, text.strip())
            else:
                if not dataclasses.is_dataclass(typ):
                    raise ValueError(f"{here} is a setting, not a section")
                cls, node = typ, node[part]
    return from_dict(type(cfg), data)


def _merge(base: dict, data: dict) -> dict:
    out = dict(base)
    for key, value in data.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            out[key] = _merge(base[key], value)
        else:
            out[key] = value
    return out


def load_file(path: str, cfg: Any) -> Any:
    """Apply a TOML or JSON file of (possibly partial) settings on top of cfg."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ValueError(f"cannot read config file {path}: {e.strerror}") from None
    try:
        data = json.loads(raw) if path.endswith(".json") else tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"config file {path} is not valid {'JSON' if path.endswith('.json') else 'TOML'}: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a table of settings")
    return from_dict(type(cfg), _merge(to_dict(cfg), data))


def resolve(preset_name: str, *, config_file: str | None = None, overrides: list[str] = ()) -> Config:
    """The CLI's order: preset, then a config file, then each --set in turn."""
    cfg = preset(preset_name)
    if config_file:
        cfg = load_file(config_file, cfg)
    return apply_overrides(cfg, list(overrides))


# --- presets --------------------------------------------------------------------------------


def tiny() -> Config:
    """A model for tests: builds and steps in milliseconds on a CPU, in fp32 on every machine."""
    return Config(model=ModelConfig(n_layers=10, d_model=32, n_attn_heads=2, seq_len=64),
                  train=TrainConfig(warmup_steps=10, eval_every=0, eval_batches=4, ckpt_every=50, precision="fp32"))


def small() -> Config:
    """About 0.8M parameters in its layers, 1.6M more in its n-gram tables (lookups) (width 64, a
    4-layer trunk under 8 one-layer heads, batch 16 x 256
    bytes), Muon on a warmup-stable-decay schedule: of what a sweep trained for `make demo`'s 9
    minutes on two CPU cores, the one whose head 1 ended lowest (BENCHMARKS.md,
    `examples/sweep-small.toml`). A budget that short buys a model of a few bytes a parameter;
    wider ones (10M at width 256) see too few. Heads 2..8 fade out over the first half of the
    schedule (a reverse head schedule): of the multi-token recipes `bench quality` compared at
    equal wall time, the one whose head 1 ended lowest, 0.91x the next-byte baseline's bits per
    byte on the default corpus (BENCHMARKS.md); `tune-heads` then makes the faded heads drafts.
    They fade over the first quarter (`loss.head_schedule_span=0.25`, from 0.5): at equal wall time
    (3 minutes, two seeds) head 1 ended 7.5% lower on the whole val split and 3.7% lower on
    held-out code (BENCHMARKS.md, "Bytes against tokens, fairly"); a tenth did as well but left
    weaker heads to tune.
    Hashed byte n-gram tables for n = 2, 3 and 4 (`model.ngram_embeds=4`, 8,192 rows each) are
    added to the byte embedding: at equal wall time (3 minutes, two seeds) head 1 ended 4.3% lower on
    the whole val split and 6.5% lower on held-out code, at the same step cost (BENCHMARKS.md,
    "Hashed byte n-gram embeddings").
    Its shuffle takes 131,072 windows (the whole default corpus, about 84 MB of memory): with the
    loader's default 16,384, each 1,024 steps train on one 4 MB stretch of the corpus, and
    `make demo`'s head 1 lost 0.35 bits/byte of held-out quality when a stretch changed."""
    return Config(model=ModelConfig(n_layers=12, d_model=64, n_attn_heads=2, seq_len=256, ngram_embeds=4),
                  loss=LossConfig(head_schedule="reverse", head_schedule_span=0.25),
                  data=DataConfig(batch_size=16, shuffle_buffer=131072),
                  train=TrainConfig(optimizer="muon", schedule="wsd", lr=5e-3, warmup_steps=50, eval_every=250,
                                    ckpt_every=250))


def base() -> Config:
    """About 100M parameters in its layers (12.6M more in its n-gram tables), for one GPU-hour: a
    24-layer trunk under 8 one-layer heads, the paper's
    7B byte model's proportion, so the heads are a quarter of every speculative pass. Sized by the
    CPU sweep's rule: the best model there (0.8M) saw about 5 bytes a parameter; with the parameters
    growing as the square root of the compute (Chinchilla's rule), an hour of one H100-class GPU at
    40% model FLOP utilisation (about 6e17 FLOP, 2e4 times the sweep's) buys about 100M parameters
    and 1 GB of bytes. Train it with `--time 1h`: the schedule is fitted to the hour. It takes
    `small`'s hashed byte n-gram tables (n = 2..4), measured on the CPU only."""
    return Config(model=ModelConfig(n_layers=32, d_model=512, n_attn_heads=8, seq_len=2048, ngram_embeds=4),
                  data=DataConfig(batch_size=16, num_workers=2),
                  train=TrainConfig(lr=6e-4, warmup_steps=500, eval_every=500, ckpt_every=1000))


def paper_7b_byte() -> Config:
    """The paper's 7B byte-level model: 32 layers of width 4096, 8 heads, replicated unembedding."""
    return Config(model=ModelConfig(
        n_layers=32, d_model=4096, n_attn_heads=32, n_future=8, seq_len=8192,
        unembed="replicated", ffn_hidden=11008,
    ), train=TrainConfig(lr=3e-4, warmup_steps=2000, eval_every=1000, ckpt_every=1000))


PRESETS = {"tiny": tiny, "small": small, "base": base, "paper-7b-byte": paper_7b_byte}


def preset(name: str) -> Config:
    if name not in PRESETS:
        raise ValueError(f"preset {name!r} does not exist; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]()
