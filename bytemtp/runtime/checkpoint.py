"""Checkpoints: one directory per step, written atomically, found by scanning.

Layout under a run directory:

    RUN/checkpoints/step-00000123/
        model.safetensors   weights of the unwrapped model (metadata {"format_version": "1"})
        config.json         {"format_version": 1, "bytemtp_version": ..., "config": {...}}
        train_state.json    the caller's loop state (bytes seen, loader, RNG, metrics) plus "step"
        optimizer.pt        optimizer.state_dict(), tensors only; absent in inference-only exports
        tokenizer.json      only for a model over BPE tokens (the baseline of `bench tokens`): its vocabulary,
                            against which a resume checks the run's data.tokenizer (`check_tokenizer`)

Inference (`load_model`) reads only config.json and model.safetensors (and tokenizer.json), so no pickle is ever
executed to generate or evaluate; `load_train_state` reads optimizer.pt with `weights_only=True`.

Atomicity. A save writes every file into `checkpoints/.tmp-step-NNNNNNNN-<pid>/`, fsyncs each file
and the directory, renames the directory to its final name and fsyncs `checkpoints/`. A crash at
any point leaves either the complete new checkpoint or none, and the previous ones untouched; the
newest complete checkpoint is found by scanning the names, not through a `latest` pointer that
could disagree with the directories. The price: a save needs disk room for one more checkpoint
than `keep`, and the fsyncs make it wait for the disk. The guarantee is POSIX rename within one
local filesystem; network or object-store mounts may rename non-atomically, and then the
completeness check (all three files present) is the only guard. Saving a step that already
exists moves the old directory aside, renames the new one in, then deletes the old one (a failed
rename puts it back; a crash between the two renames leaves that step only as temp directories, so
the older checkpoints are what remain). After a save, all but the newest `keep` checkpoints by
step are deleted, never the one just written. One process (rank 0) saves into a run directory: a
save deletes every `.tmp-*` directory it finds there as left by a crash.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
from pathlib import Path

import torch
from torch.utils._pytree import tree_map
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

import bytemtp
from bytemtp.config import Config
from bytemtp.config_io import from_dict, to_dict
from bytemtp.model.model import ByteMTP
from bytemtp.vocab import BYTES, TokenizerError, Vocabulary, check_vocab_size, load_vocabulary

FORMAT_VERSION = 1

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
STATE_FILE = "train_state.json"
OPTIMIZER_FILE = "optimizer.pt"
TOKENIZER_FILE = "tokenizer.json"  # a BPE baseline's vocabulary (`bytemtp.vocab`), copied from data.tokenizer
REQUIRED_FILES = (MODEL_FILE, CONFIG_FILE, STATE_FILE)

_STEP_DIR = re.compile(r"step-(\d{8,})")


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or read; the message names the file and the fix."""


# --- writing ----------------------------------------------------------------------------------


def save_checkpoint(run_dir: str | os.PathLike, *, step: int, model: ByteMTP, config: Config,
                    train_state: dict, optimizer: torch.optim.Optimizer | None = None,
                    keep: int = 2, model_state: dict | None = None,
                    optimizer_state: dict | None = None) -> Path:
    """Write checkpoints/step-NNNNNNNN/ under run_dir atomically, then prune to the newest `keep`.

    `model` is the unwrapped module (not DDP or torch.compile's wrapper); `train_state` must be
    JSON-serialisable (tensors as lists). Without an optimizer the checkpoint is an
    inference-only export. `model_state` and `optimizer_state`, when given, are written instead of
    the model's and optimizer's own state dicts (full state dicts gathered from FSDP2 shards).
    Returns the checkpoint directory.
    """
    if not isinstance(step, int) or step < 0:
        raise CheckpointError(f"step={step!r} is not allowed; expected an integer >= 0")
    if keep < 1:
        raise CheckpointError(f"keep={keep} would delete the checkpoint just written; use keep >= 1")
    if model.config != config.model:
        raise CheckpointError("config.model does not describe the model being saved; pass the Config "
                              "the model was built from, so config.json can rebuild it")
    try:
        state_json = json.dumps({**train_state, "step": step}, indent=2)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"train_state cannot be written as JSON ({e}); convert tensors and "
                              "arrays with .tolist() before saving") from e

    root = Path(run_dir) / "checkpoints"
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    previous = latest_checkpoint(run_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        weights = model.state_dict() if model_state is None else model_state
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in weights.items()}  # written from the host
        save_file(tensors, tmp / MODEL_FILE, metadata={"format_version": str(FORMAT_VERSION)})
        meta = {"format_version": FORMAT_VERSION, "bytemtp_version": bytemtp.__version__,
                "config": to_dict(config)}
        (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        (tmp / STATE_FILE).write_text(state_json + "\n", encoding="utf-8")
        if config.data.tokenizer:
            shutil.copyfile(config.data.tokenizer, tmp / TOKENIZER_FILE)
        if optimizer_state is not None or optimizer is not None:
            state = optimizer.state_dict() if optimizer_state is None else optimizer_state
            torch.save(tree_map(lambda t: t.detach().to("cpu") if isinstance(t, torch.Tensor) else t, state),
                       tmp / OPTIMIZER_FILE)  # from the host, as it is read back (map_location="cpu")
        for path in tmp.iterdir():  # the writers have closed their files; make them durable
            fsync(path)
        fsync(tmp)
        replace_dir(tmp, final)
        fsync(root)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, (OSError, SafetensorError)):  # safetensors reports its write errors as its own
            kept = (f"the previous checkpoint {previous} is intact" if previous
                    else "there is no earlier checkpoint")
            full = (getattr(e, "errno", None) == errno.ENOSPC or "No space left" in str(e)
                    or "StorageFull" in str(e))
            why = (f"the disk is full (no space left on device); free space in {root}" if full
                   else _reason(e))
            raise CheckpointError(f"saving checkpoint {final} failed: {why}; {kept}") from e
        raise
    try:
        _prune(root, keep=keep, just_saved=final)
    except OSError as e:
        raise CheckpointError(f"saved {final}, but deleting older checkpoints failed ({e})") from e
    return final


def fsync(path: Path) -> None:
    """Flush a closed file's data, or a directory's entries (renames), to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_dir(tmp: Path, final: Path) -> None:
    """Rename tmp to final; an existing final is moved aside first and restored if that fails."""
    if not final.exists():
        os.rename(tmp, final)
        return
    old = final.with_name(f".tmp-old-{final.name}-{os.getpid()}")
    os.rename(final, old)
    try:
        os.rename(tmp, final)
    except BaseException:
        os.rename(old, final)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _prune(root: Path, *, keep: int, just_saved: Path) -> None:
    """Delete all but the newest `keep` checkpoints (never the one just saved) and stale temp dirs.

    A checkpoint is renamed to a temp name before its files go, so a crash mid-delete never
    leaves a partial directory that looks like a checkpoint.
    """
    for path in list_checkpoints(root.parent)[:-keep]:
        if path != just_saved:
            doomed = path.with_name(f".tmp-del-{path.name}-{os.getpid()}")
            os.rename(path, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
    for path in root.glob(".tmp-*"):
        shutil.rmtree(path, ignore_errors=True)


# --- finding ----------------------------------------------------------------------------------


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoint directories under run_dir/checkpoints/, oldest step first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _STEP_DIR.fullmatch(path.name)
        if match and all((path / name).is_file() for name in REQUIRED_FILES):
            found.append((int(match[1]), path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1] if checkpoints else None


def is_checkpoint_dir(path: str | os.PathLike) -> bool:
    """Whether path names one checkpoint (a step-* directory, or any directory holding a
    checkpoint's files) rather than a run directory."""
    path = Path(path)
    return bool(_STEP_DIR.fullmatch(path.name) or (path / CONFIG_FILE).exists()
                or (path / MODEL_FILE).exists())


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint directory as given, or the newest complete checkpoint of a run directory
    (or of its checkpoints/ folder)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist; pass a run directory or one of its "
                              "checkpoints/step-*/ directories")
    if not path.is_dir():
        raise CheckpointError(f"{path} is a file; pass the checkpoint directory holding it "
                              f"({path.parent}) or a run directory")
    if is_checkpoint_dir(path):
        return path
    if path.name == "checkpoints" and not (path / "checkpoints").exists():
        path = path.parent  # the folder of a run's checkpoints: its newest
    latest = latest_checkpoint(path)
    if latest is None:
        raise CheckpointError(f"no checkpoint found in {path}: expected "
                              f"{path / 'checkpoints' / 'step-*'}/ holding {', '.join(REQUIRED_FILES)}")
    return latest


# --- reading ----------------------------------------------------------------------------------


def read_config_json(ckpt_dir: str | os.PathLike) -> dict:
    """bytemtp's part of a checkpoint's config.json: the file's object, or in a Hugging Face export
    (bytemtp.interop.export) the one under its "bytemtp" key, so an exported folder loads as a checkpoint."""
    data = _read_json(Path(ckpt_dir) / CONFIG_FILE)
    return data["bytemtp"] if isinstance(data.get("bytemtp"), dict) else data


def load_config(ckpt_dir: str | os.PathLike) -> Config:
    """The Config saved in a checkpoint's config.json (reads nothing else)."""
    path = Path(ckpt_dir) / CONFIG_FILE
    data = read_config_json(ckpt_dir)
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        fix = ("upgrade bytemtp to read it" if isinstance(version, int) and version > FORMAT_VERSION
               else "the file is not a bytemtp checkpoint config or is damaged")
        raise CheckpointError(f"{path} has format_version {version!r}, but bytemtp "
                              f"{bytemtp.__version__} reads format {FORMAT_VERSION}; {fix}")
    if not isinstance(data.get("config"), dict):
        raise CheckpointError(f"{path} has no \"config\" object; the file is damaged")
    try:
        return from_dict(Config, data["config"])
    except ValueError as e:
        raise CheckpointError(f"{path} holds an invalid config: {e}") from e


def read_train_state(path: str | os.PathLike) -> dict:
    """The train_state.json of a checkpoint (or of a run's newest one), with "step"; reads
    nothing else."""
    return _read_json(resolve_checkpoint(path) / STATE_FILE)


def load_model(path: str | os.PathLike, *, device: str | torch.device = "cpu",
               dtype: str | torch.dtype | None = None, bytes_only: str | None = None) -> tuple[ByteMTP, Config]:
    """Rebuild the model of a checkpoint (or of a run's newest one) for inference, in eval mode,
    its weights in `dtype` (a torch dtype or its name, e.g. "bfloat16"; None keeps the saved one).
    `bytes_only` names a use that takes byte models only: a BPE baseline's checkpoint is then
    refused with one line, before its weights are read.

    Reads config.json and model.safetensors only. The model is built on the meta device and
    materialised once on `device`, so no time goes into an initialisation that is overwritten.
    """
    if isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype) or not getattr(torch, dtype).is_floating_point:
            raise ValueError(f"dtype={dtype!r} is not allowed; choose a floating dtype such as float32 or bfloat16")
        dtype = getattr(torch, dtype)
    ckpt = resolve_checkpoint(path)
    cfg = load_config(ckpt)
    if bytes_only and cfg.model.vocab_size != BYTES.size:
        raise CheckpointError(f"{bytes_only} takes byte models; {ckpt} is a model of {cfg.model.vocab_size} BPE "
                              "token ids (the baseline of bytemtp bench tokens): generate, eval and bench decode take it")
    weights = ckpt / MODEL_FILE
    tensors = _read_weights(weights, device=device)
    with torch.device("meta"):
        model = ByteMTP(cfg.model)
    _check_weights(_shapes(tensors), _shapes(model.state_dict()), path=weights,
                   against=f"the model in {CONFIG_FILE}")
    model.to_empty(device=device)
    model.reset_rope()
    model.load_state_dict(tensors)
    model.vocab = checkpoint_vocabulary(ckpt, cfg)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval(), cfg


def checkpoint_vocabulary(ckpt: Path, cfg: Config) -> Vocabulary:
    """The vocabulary of a checkpoint's model: bytes, or the BPE in its tokenizer.json."""
    if cfg.model.vocab_size == BYTES.size:
        return BYTES
    path = ckpt / TOKENIZER_FILE
    if not path.is_file():
        raise CheckpointError(f"{ckpt} holds a model of {cfg.model.vocab_size} token ids but no {TOKENIZER_FILE}; "
                              "copy the run's tokenizer.json into it")
    try:
        vocab = load_vocabulary(path)
        check_vocab_size(vocab, cfg.model.vocab_size)
    except TokenizerError as e:
        raise CheckpointError(str(e)) from None
    return vocab


def check_tokenizer(ckpt: Path, tokenizer: str) -> None:
    """The tokenizer file a run reads (data.tokenizer) must be the one its checkpoint was trained
    with, the copy in the checkpoint's tokenizer.json, byte for byte: a BPE of the same size with
    other merges reads the corpus as other ids, which the model and the loader's saved position do
    not mean. CheckpointError naming the file otherwise, and where a token run's checkpoint has lost
    its copy (nothing would say which tokenizer it was trained with: another BPE read the corpus as
    other ids, and resuming failed deep in the loader); nothing to compare for bytes, or where the
    tokenizer file is missing (the vocabulary's own checks say so)."""
    copy = ckpt / TOKENIZER_FILE
    if tokenizer and not copy.is_file():
        raise CheckpointError(f"{ckpt} has no {TOKENIZER_FILE}, the copy of the tokenizer its run was trained with, "
                              f"so {tokenizer} cannot be checked against it; put the run's tokenizer there as "
                              f"{copy}, or start a new run")
    if not tokenizer or not Path(tokenizer).is_file():
        return
    if Path(tokenizer).read_bytes() != copy.read_bytes():
        raise CheckpointError(f"{tokenizer} is not the tokenizer that {ckpt} was trained with (its {TOKENIZER_FILE} "
                              f"differs); put the run's tokenizer back there (a copy is {copy}), or start a new run")


def load_train_state(ckpt_dir: str | os.PathLike, *, model: ByteMTP,
                     optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Load weights into `model` (unwrapped, on any device) and, if given, the optimizer state;
    return the saved train_state dict (with "step")."""
    ckpt = resolve_checkpoint(ckpt_dir)
    if optimizer is not None:
        _require_optimizer_file(ckpt)
    state = _read_json(ckpt / STATE_FILE)
    load_weights(ckpt, model)
    if optimizer is not None:
        load_optimizer_state(ckpt, optimizer)
    return state


def load_weights(ckpt_dir: str | os.PathLike, model: torch.nn.Module, load=None) -> None:
    """Load a checkpoint's weights into `model` (their names and shapes checked against its own),
    through `load(model, weights)` when given (FSDP2 loads full weights into sharded parameters)."""
    ckpt = resolve_checkpoint(ckpt_dir)
    weights = ckpt / MODEL_FILE
    tensors = _read_weights(weights, device=next(model.parameters()).device)
    _check_weights(_shapes(tensors), _shapes(model.state_dict()), path=weights,
                   against="the given model")
    (load or (lambda m, w: m.load_state_dict(w)))(model, tensors)


def _require_optimizer_file(ckpt: Path) -> None:
    if not (ckpt / OPTIMIZER_FILE).is_file():
        raise CheckpointError(
            f"{ckpt / OPTIMIZER_FILE} is missing: the checkpoint was saved without an optimizer "
            "(an inference-only export); resume from a checkpoint saved with one, or pass "
            "optimizer=None to load only the weights and train state")


def load_optimizer_state(ckpt_dir: str | os.PathLike, optimizer: torch.optim.Optimizer, load=None) -> None:
    """Load a checkpoint's optimizer state into `optimizer`, through `load(optimizer, state)`
    when given (FSDP2 loads a full state into sharded parameters)."""
    ckpt = resolve_checkpoint(ckpt_dir)
    _require_optimizer_file(ckpt)
    path = ckpt / OPTIMIZER_FILE
    try:  # staged on the CPU: load_state_dict moves each tensor to its parameter's device
        # but keeps Adam's `step` where it was loaded, and a non-fused `step` on a GPU costs a
        # host sync per parameter per step
        optim_state = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        if "Weights only load failed" not in str(e):
            raise CheckpointError(f"{OPTIMIZER_FILE} at {path} is truncated or corrupt "
                                  f"({_reason(e)}); resume from an earlier checkpoint") from e
        found = re.search(r"unsupported (?:GLOBAL|global:?) ?([\w.]+)", str(e), re.IGNORECASE)
        what = f"a reference to {found[1]}" if found else "objects other than tensors"
        raise CheckpointError(f"{path} was refused: its pickle holds {what}, which loading would run or "
                              f"build, and an {OPTIMIZER_FILE} may hold only tensors and plain containers "
                              "(it is read with torch.load(weights_only=True)); bytemtp did not write it "
                              "so, or it was altered: resume from a checkpoint you trust") from e
    except (RuntimeError, EOFError) as e:
        raise CheckpointError(f"{OPTIMIZER_FILE} at {path} is truncated or corrupt "
                              f"({_reason(e)}); resume from an earlier checkpoint") from e
    try:
        (load or (lambda opt, st: opt.load_state_dict(st)))(optimizer, optim_state)
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"{path} does not fit the given optimizer ({_reason(e)}); build it "
                              "with the same parameter groups as the saved run") from e


def _require_file(path: Path) -> None:
    if not path.is_file():
        raise CheckpointError(f"{path} is missing; a checkpoint directory holds "
                              f"{', '.join(REQUIRED_FILES)} (and {OPTIMIZER_FILE} to resume training)")


def _corrupt_weights(path: Path, e: Exception) -> CheckpointError:
    return CheckpointError(f"{MODEL_FILE} at {path} is truncated or corrupt ({_reason(e)}); "
                           "use an earlier checkpoint")


def _read_json(path: Path) -> dict:
    _require_file(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}); the file is damaged, use an "
                              "earlier checkpoint") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} holds a JSON {type(data).__name__}, expected an object")
    return data


def _read_weights(path: Path, *, device: str | torch.device) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors file on `device`; never unpickles anything. safetensors places them
    on the CPU and CUDA itself; another device (the stand-in accelerator) takes them from the host."""
    _require_file(path)
    device = torch.device(device)
    try:
        tensors = load_file(path, device=str(device) if device.type in ("cpu", "cuda") else "cpu")
    except SafetensorError as e:
        raise _corrupt_weights(path, e) from e
    return tensors if device.type in ("cpu", "cuda") else {k: t.to(device) for k, t in tensors.items()}


def _shapes(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(t.shape) for k, t in tensors.items()}


def _check_weights(saved: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]], *,
                   path: Path, against: str) -> None:
    """Names and shapes of saved weights against a model's, with one readable error."""
    differ = "the weights and the model come from different configs"
    for key, want in expected.items():
        if key not in saved:
            raise CheckpointError(f"{path} has no weight {key!r} of shape {want}, which "
                                  f"{against} needs ({differ})")
        if saved[key] != want:
            raise CheckpointError(f"{path}: weight {key!r} has shape {saved[key]} but "
                                  f"{against} expects {want} ({differ})")
    for key, got in saved.items():
        if key not in expected:
            wrapped = key.startswith(("_orig_mod.", "module."))
            hint = "save the unwrapped model" if wrapped else differ
            raise CheckpointError(f"{path} has weight {key!r} of shape {got}, which "
                                  f"{against} does not have ({hint})")


def describe(path: str | os.PathLike) -> dict:
    """What a checkpoint holds, checked without loading its weights: the resolved directory,
    its config, train state, files and sizes, and the parameter count from the safetensors
    header (names and shapes are checked against the config)."""
    ckpt = resolve_checkpoint(path)
    cfg = load_config(ckpt)
    exported = "bytemtp" in _read_json(ckpt / CONFIG_FILE)  # a Hugging Face export keeps no train state
    state = {} if exported else _read_json(ckpt / STATE_FILE)
    weights = ckpt / MODEL_FILE
    _require_file(weights)
    try:
        with safe_open(weights, framework="pt") as f:
            saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except SafetensorError as e:
        raise _corrupt_weights(weights, e) from e
    with torch.device("meta"):
        model = ByteMTP(cfg.model)
    _check_weights(saved, _shapes(model.state_dict()), path=weights,
                   against=f"the model in {CONFIG_FILE}")
    return {
        "checkpoint": str(ckpt),
        "step": state.get("step"),
        "config": cfg,
        "train_state": state,
        "params": model.num_params(),
        "vocabulary": checkpoint_vocabulary(ckpt, cfg).describe(),
        "files": {p.name: p.stat().st_size for p in sorted(ckpt.iterdir()) if p.is_file()},
        "resumable": (ckpt / OPTIMIZER_FILE).is_file(),
    }


def _reason(e: BaseException) -> str:
    """The first sentence of an exception's message, for one-line errors."""
    line = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return line.split(". ")[0]
