"""Exports: a checkpoint as a Hugging Face `transformers` folder, loaded with trust_remote_code.

`export_hf` writes one folder that `AutoModelForCausalLM` and `AutoTokenizer` load:

    config.json              the ByteMTPConfig fields (bytemtp's ModelConfig, the vocabulary's special
                             ids, the dtype) and under "bytemtp" the checkpoint's own config.json
    model.safetensors        the weights under bytemtp's own names, every head and unembedding kept
    generation_config.json   EOS ends generation; BOS, PAD and the padding ids are never generated
    tokenizer_config.json    the byte tokenizer (ids 0..255 are the UTF-8 bytes, then <bos> <eos> <pad>)
    configuration_bytemtp.py, modeling_bytemtp.py, tokenization_bytemtp.py   (bytemtp.interop.remote_code)
    README.md                a model card: what loads, what forward returns, what is left to bytemtp

The folder is also a bytemtp checkpoint: `load_model` reads config.json's "bytemtp" object and
the same weights, so `bytemtp generate --ckpt FOLDER` decodes self-speculatively from an export.

Writing needs no transformers (json, safetensors and copies of the code files), so exporting
works without the `hf` extra; only loading the folder needs it. The folder is written beside
`out` under a temporary name and renamed into place at the end: a failure leaves no half-written
export, and `overwrite` replaces an existing folder only once the new one is complete.

A model trained with `model.doc_mask` is refused: the exported forward (its attention masks come
from `attention_mask` and a DynamicCache that knows nothing of documents) would attend across the
documents of an input holding EOS, so it would not compute what bytemtp computes.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from bytemtp.config import ModelConfig
from bytemtp.config_io import to_dict
from bytemtp.interop import remote_code
from bytemtp.runtime.checkpoint import (CONFIG_FILE, FORMAT_VERSION, MODEL_FILE, CheckpointError, fsync, load_model,
                                        read_config_json, replace_dir, resolve_checkpoint)
from bytemtp.vocab import BOS, EOS, N_BYTES, PAD, VOCAB_SIZE

DTYPES = ("float32", "bfloat16", "float16")
AUTO_MAP = {
    "AutoConfig": "configuration_bytemtp.ByteMTPConfig",
    "AutoModelForCausalLM": "modeling_bytemtp.ByteMTPForCausalLM",
    "AutoTokenizer": ["tokenization_bytemtp.ByteMTPTokenizer", None],
}
NEVER_GENERATED = [BOS, PAD, *range(PAD + 1, VOCAB_SIZE)]


def export_hf(ckpt: str | os.PathLike, out: str | os.PathLike, *, dtype: str | None = None,
              overwrite: bool = False, progress: Callable[[str], None] | None = None) -> Path:
    """Write the model of a checkpoint (or of a run's newest one) to the folder `out` in Hugging
    Face format, its weights in `dtype` (float32, bfloat16 or float16; None keeps the saved one).

    An existing non-empty `out` is refused unless `overwrite`. `progress` is told the name of each
    file once it is written. Returns the folder.
    """
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not allowed; choose one of {', '.join(DTYPES)} (or none to keep "
                         "the saved one)")
    out = Path(out).absolute()
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file; name a folder for the export")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"{out} exists and is not empty; choose another folder, or replace it with --force "
                         "(overwrite=True)")
    source = resolve_checkpoint(ckpt).resolve()
    if source == out.resolve() or out.resolve() in source.parents:
        raise ValueError(f"{out} holds the checkpoint being exported ({source}); choose another folder")
    model, cfg = load_model(source, bytes_only="the Hugging Face export")  # checks the files, and names the one at fault
    if cfg.model.doc_mask:
        raise ValueError(f"{source} has model.doc_mask=true, which the Hugging Face export does not carry (its forward "
                         "attends across documents); score and decode it with bytemtp itself (eval, generate, "
                         "lm-evaluation-harness)")
    meta = read_config_json(source)
    dtype = dtype or _saved_dtype(source / MODEL_FILE)
    model = model.to(getattr(torch, dtype))
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    done = progress or (lambda name: None)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        save_file(tensors, tmp / MODEL_FILE, metadata={"format": "pt", "format_version": str(FORMAT_VERSION)})
        done(MODEL_FILE)
        files = {
            CONFIG_FILE: hf_config(cfg.model, bytemtp_meta=meta, dtype=dtype),
            "generation_config.json": generation_config(),
            "tokenizer_config.json": tokenizer_config(cfg.model),
        }
        for name, data in files.items():
            (tmp / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
            done(name)
        code = Path(remote_code.__file__).parent
        for name in remote_code.FILES:
            shutil.copyfile(code / name, tmp / name)
            done(name)
        (tmp / "README.md").write_text(model_card(cfg.model, params=model.num_params(), dtype=dtype,
                                                  source=meta), encoding="utf-8")
        done("README.md")
        for path in tmp.iterdir():
            fsync(path)
        fsync(tmp)
        if out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # an empty folder made for the export
        replace_dir(tmp, out)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise CheckpointError(f"writing the export {out} failed ({e.strerror or e}); nothing was written "
                                  "there") from e
        raise
    fsync(out.parent)
    return out


def _saved_dtype(weights: Path) -> str:
    """The dtype name of a checkpoint's weights (those of the first tensor: bytemtp saves one dtype)."""
    with safe_open(weights, framework="pt") as f:
        return str(f.get_tensor(next(iter(f.keys()))).dtype).removeprefix("torch.")


def hf_config(model: ModelConfig, *, bytemtp_meta: dict, dtype: str) -> dict:
    """config.json of the export: what ByteMTPConfig reads, and bytemtp's own config under "bytemtp"."""
    return {
        "architectures": ["ByteMTPForCausalLM"],
        "model_type": "bytemtp",
        "auto_map": AUTO_MAP,
        **to_dict(model),
        "vocab_size": VOCAB_SIZE,  # transformers' vocab_size is the table's rows (ModelConfig.vocab_size counts the ids in use)
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "use_cache": True,
        "tie_word_embeddings": False,
        "dtype": dtype,
        "torch_dtype": dtype,
        "bytemtp": bytemtp_meta,
    }


def generation_config() -> dict:
    """generate's defaults: stop at EOS, never emit BOS, PAD or the table's padding ids (as bytemtp's
    decoding does)."""
    return {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, "suppress_tokens": NEVER_GENERATED}


def tokenizer_config(model: ModelConfig) -> dict:
    """tokenizer_config.json: the byte tokenizer, left padding for batched generation, text as bytes
    (a literal "<eos>" in the text is its five bytes, not the special id)."""
    return {
        "tokenizer_class": "ByteMTPTokenizer",
        "auto_map": {"AutoTokenizer": AUTO_MAP["AutoTokenizer"]},
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "document_start": False,
        "padding_side": "left",
        "split_special_tokens": True,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model.seq_len,
    }


def model_card(model: ModelConfig, *, params: int, dtype: str, source: dict) -> str:
    """README.md of the export."""
    heads = ", ".join(f"heads.{k}" for k in range(model.n_future))
    drafts = ("" if not model.drafts.heads else
              f"\n- The weights also hold {model.n_future - 1} {model.draft} draft heads (`drafter.*`, cheap heads trained "
              "for acceptance), which bytemtp's decoder drafts with; transformers leaves them unloaded.")
    unembed = ("unembed.0 (shared by every head)" if model.unembed == "shared"
               else ", ".join(f"unembed.{k}" for k in range(model.n_future)))
    return f"""---
library_name: transformers
tags: [bytemtp, byte-level, multi-token-prediction]
---

# bytemtp byte model ({params:,} parameters, {dtype})

A byte-level language model trained with multi-token prediction (Gloeckle et al. 2024, "Better &
Faster Large Language Models via Multi-token Prediction"): a shared trunk of
{model.trunk_layers} transformer layers (width {model.d_model}, {model.n_attn_heads} attention heads, rotary
positions, RMSNorm, {model.mlp}) and {model.n_future} {model.head_type} heads, head k predicting the byte k
positions ahead. Exported from bytemtp {source.get("bytemtp_version", "?")}; the checkpoint's own
configuration is under "bytemtp" in config.json.

## Loading

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("PATH", trust_remote_code=True)
# in training a document starts after EOS (id 257); document_start=True puts it before each text
tokenizer = AutoTokenizer.from_pretrained("PATH", trust_remote_code=True, document_start=True)

prompt = tokenizer(["def add(a, b):"], return_tensors="pt")
out = model.generate(**prompt, max_new_tokens=64, do_sample=False)
print(tokenizer.decode(out[0, prompt.input_ids.shape[1]:], skip_special_tokens=True))
```

PATH is this folder. The tokenizer maps text to its UTF-8 bytes: ids 0..{N_BYTES - 1} are the byte
values, {BOS} `<bos>`, {EOS} `<eos>` (end of document), {PAD} `<pad>`. By default it adds no special
ids; with `document_start=True` it puts EOS before each text, as bytemtp's own decoding does (or
prepend 257 yourself). A literal "<eos>" in the text is five bytes, not the special id. Decoding
turns ids back into bytes and reads them as UTF-8, invalid bytes as U+FFFD. Batches pad on the left.

## What the model computes

- `model(input_ids, attention_mask=...)` returns the next-byte head's logits (head 1),
  (batch, time, {VOCAB_SIZE}), and with `labels` the next-byte cross-entropy; `generate` uses it with the KV
  cache, one byte a forward pass. Generation stops at EOS and never emits BOS, PAD or ids
  above {PAD} (generation_config.json).
- All {model.n_future} heads are in the weights ({heads}; unembeddings {unembed}).
  `model.future_logits(input_ids)` returns the logits of every head, (batch, time, {model.n_future}, {VOCAB_SIZE}):
  index k - 1 predicts the byte k positions ahead.
- Self-speculative decoding (the extra heads draft, head 1 verifies; the same output as greedy
  decoding, several bytes a pass) is bytemtp's: `bytemtp generate --ckpt PATH` reads this folder.{drafts}
- The context is {model.seq_len} bytes: longer inputs are refused (bytemtp's decoding slides its window
  past the context; this export does not).
"""
