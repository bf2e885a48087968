"""The training loop: one `train(cfg, run_dir)` that reads top to bottom.

AdamW (fused on CUDA) with decoupled weight decay on matrices, linear warmup then cosine decay
to a fraction of the peak, gradient clipping and accumulation, bf16 autocast on CUDA, optional
torch.compile of each block, and the memory-efficient multi-head step by default. It stops by
steps, by bytes or by wall time, and on SIGTERM or Ctrl-C at the next step boundary; every stop
saves a checkpoint.

Exact resume: a checkpoint holds the weights, the optimizer state, the loader's position, the
RNG states and the loop's counters; the schedule is a function of the step. On the CPU a resumed
run's losses equal an uninterrupted run's bit for bit (a test kills a run with SIGKILL to show
it). The global torch RNG (dropout draws from it) is seeded from train.seed inside
`torch.random.fork_rng`, so the caller's RNG is left as it was.

Faults: a step whose loss or gradient norm is not finite is skipped (no parameter or optimizer
update, counted) and the run aborts after train.max_bad_steps in a row. A checkpoint that fails
to save (a full disk) leaves the previous one intact and the run says so and goes on; only a
failure of the final save ends the run with an error.

Run directory: `run-config.json` (the resolved configuration), `metrics.jsonl` (one JSON object
per logged step or validation), `checkpoints/step-NNNNNNNN/`.

Many processes: launched by torchrun, the same loop trains one model on every rank
(`bytemtp.distributed`: DDP or FSDP2 after train.parallel). Each rank reads its own share of the
corpus; loss and metrics are averaged over the ranks, the stop conditions (signal, time,
non-finite loss) are agreed at every step boundary so that all ranks stop at the same step, and
rank 0 alone logs and writes checkpoints, which hold every rank's loader position and RNG state.
A run resumes only with the number of processes that saved it. Restarted by torchrun
(--max-restarts), a run resumes from its newest checkpoint by itself.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from bytemtp import corpus
from bytemtp import distributed as dist_lib
from bytemtp import config as config_lib
from bytemtp.checkpoint import (
    CheckpointError, is_checkpoint_dir, latest_checkpoint, load_config, load_optimizer_state,
    load_train_state, read_train_state, save_checkpoint)
from bytemtp.config import Config, DataConfig, TrainConfig, to_dict, to_json
from bytemtp.evaluate import evaluate
from bytemtp.devices import resolve_device, rng_state, set_rng_state
from bytemtp.flops import peak_gpu_flops, step_flops
from bytemtp.loader import ByteLoader, combine_stats
from bytemtp.loss import LN2
from bytemtp.model import Block, ByteMTP
from bytemtp.step import forward_backward, plain_forward_backward

RUN_CONFIG = "run-config.json"
METRICS = "metrics.jsonl"


class TrainingError(RuntimeError):
    """The run cannot go on (too many non-finite steps, a failed final save)."""


@dataclass
class RunResult:
    step: int
    bytes_seen: int
    stopped_by: str  # steps, bytes, time or signal; done: the run had reached its limit before
    checkpoint: Path
    val_bpb: list[float] | None


def schedule_horizon(cfg: TrainConfig, bytes_per_step: int) -> int:
    """Steps over which warmup plus cosine decay run (0: no decay after warmup)."""
    if cfg.schedule_steps:
        return cfg.schedule_steps
    if cfg.steps:
        return cfg.steps
    if cfg.max_bytes:
        return -(-cfg.max_bytes // bytes_per_step)
    return 0


def lr_at(step: int, cfg: TrainConfig, horizon: int) -> float:
    """Linear warmup to the peak, then cosine decay to min_lr_ratio x peak at `horizon`."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if horizon <= cfg.warmup_steps:
        return cfg.lr
    progress = min(1.0, (step - cfg.warmup_steps) / (horizon - cfg.warmup_steps))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def build_optimizer(model: ByteMTP, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only; fused on CUDA."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             fused=device.type == "cuda")


def _encoded_rng(device: torch.device) -> dict:
    """The device's random state as text, for train_state.json."""
    return {name: base64.b64encode(t.numpy().tobytes()).decode() for name, t in rng_state(device).items()}


def _restore_rng(state: dict, device: torch.device) -> None:
    set_rng_state({name: torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)
                   for name, text in state.items()}, device)


def has_val_split(data: DataConfig) -> bool:
    """Whether the corpus is a prepared one whose val split holds documents (what validation reads)."""
    try:
        manifest = corpus.read_manifest(data.path)
    except corpus.CorpusError:
        return False
    return manifest.get("splits", {}).get("val", {}).get("documents", 0) > 0


@contextlib.contextmanager
def stop_on_signals():
    """SIGTERM and SIGINT set a flag that the loop reads at the next step boundary."""
    flag = {"signal": None}

    def handler(signum, frame):
        flag["signal"] = signal.Signals(signum).name

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _prepare_run_dir(run_dir: Path, cfg: Config, resume: bool, *, mutate: bool = True) -> Path | None:
    if resume:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise ValueError(f"no checkpoint to resume in {run_dir}: expected "
                             f"{run_dir / 'checkpoints' / 'step-*'}/; start a new run there instead")
        return ckpt
    if latest_checkpoint(run_dir) is not None:
        raise ValueError(f"run directory {run_dir} already exists; resume it, or choose another run directory")
    leftovers = {p.name for p in run_dir.iterdir()} if run_dir.exists() else set()
    if leftovers - {RUN_CONFIG, METRICS, "checkpoints"}:
        raise ValueError(f"{run_dir} exists and is not a run directory; choose another run directory")
    if mutate:  # a run that died before its first checkpoint: start it over
        (run_dir / METRICS).unlink(missing_ok=True)
        run_dir.mkdir(parents=True, exist_ok=True)
    return None


def _already_done(run_dir: Path, tc: TrainConfig) -> RunResult | None:
    """The newest checkpoint, as a result, when it has already reached the step or bytes limit
    (then resuming changes nothing); None when there is training left or no checkpoint."""
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        return None
    state = read_train_state(ckpt)
    step, seen = state.get("step", 0), state.get("bytes_seen", 0)
    if not ((tc.steps and step >= tc.steps) or (tc.max_bytes and seen >= tc.max_bytes)):
        return None
    return RunResult(step=step, bytes_seen=seen, stopped_by="done", checkpoint=ckpt,
                     val_bpb=state.get("val_bpb"))


def _keep_metrics_up_to(path: Path, step: int) -> None:
    """After a resume, drop the lines that the interrupted run logged past its checkpoint."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):  # a line torn by the crash
            continue
    path.write_text("".join(line + "\n" for line in kept))


def train(cfg: Config, run_dir: str | Path, *, resume: bool = False, show_progress: bool = True,
          say=tqdm.write) -> RunResult:
    """Train (or resume) the run in run_dir until a stop condition; return where it ended."""
    run_dir = Path(run_dir)
    cfg = absolute_corpus(cfg)
    tc = cfg.train
    if not (tc.steps or tc.max_bytes or tc.max_time):
        raise ValueError("no stop condition: set train.steps, train.max_bytes or train.max_time")
    if dist_lib.restarted() and latest_checkpoint(run_dir) is not None:
        resume = True  # torchrun restarted the job after a failure: go on from the newest checkpoint
    if resume and (done := _already_done(run_dir, tc)) is not None:
        return done
    with dist_lib.process_group(resolve_device(tc.device), timeout_s=tc.dist_timeout) as d:
        ckpt = _prepare_run_dir(run_dir, cfg, resume, mutate=d.is_main)
        if d.is_main:
            (run_dir / RUN_CONFIG).write_text(to_json(cfg) + "\n")
        dist_lib.barrier(d)
        with torch.random.fork_rng(devices=[d.device] if d.device.type == "cuda" else []):
            torch.manual_seed(tc.seed + d.rank)  # dropout differs between ranks
            return _train(cfg, run_dir, ckpt, d, show_progress=show_progress and d.is_main,
                          say=say if d.is_main else (lambda *_: None))


def _train(cfg: Config, run_dir: Path, ckpt: Path | None, d: dist_lib.Dist, *,
           show_progress: bool, say) -> RunResult:
    tc, mc = cfg.train, cfg.model
    device = d.device
    model = ByteMTP(mc).to(device)  # the same initial weights on every rank
    model.init_weights(generator=torch.Generator().manual_seed(tc.seed))
    loader = ByteLoader(cfg.data, seq_len=mc.seq_len, n_future=mc.n_future, rank=d.rank,
                        world_size=d.world_size)
    has_val = has_val_split(cfg.data)
    if not has_val:
        say(f"note: {cfg.data.path} has no val split (prepare it with `bytemtp prep`); "
            "no validation in this run")
    step, bytes_seen, elapsed, skipped, bad_run, val_bpb = 0, 0, 0.0, 0, 0, None
    state = load_train_state(ckpt, model=model) if ckpt is not None else None  # weights before wrapping
    wrapped = dist_lib.wrap_model(model, d, tc.parallel)
    optimizer = build_optimizer(model, tc, device)
    if state is not None:
        load_optimizer_state(ckpt, optimizer, load=dist_lib.load_optimizer(wrapped))
        loaders, rngs = state.get("loaders", [state.get("loader")]), state.get("rngs", [state.get("rng")])
        if len(loaders) != d.world_size:
            raise ValueError(f"{ckpt} was saved by {len(loaders)} process(es) and this run has "
                             f"{d.world_size}: each reads its own share of the corpus, so resume with "
                             f"{len(loaders)} (torchrun --nproc-per-node, --nnodes) or start a new run")
        loader.load_state_dict(loaders[d.rank])
        _restore_rng(rngs[d.rank], device)
        step, bytes_seen, elapsed = state["step"], state["bytes_seen"], state["elapsed_s"]
        skipped, bad_run, val_bpb = state["skipped_steps"], state["bad_run"], state.get("val_bpb")
        if d.is_main:  # the one writer of metrics.jsonl: two ranks rewriting it race and lose lines
            _keep_metrics_up_to(run_dir / METRICS, step)
        say(f"resumed {run_dir} from {ckpt.name}: step {step}, {bytes_seen:,} bytes seen")
    if tc.compile:
        for module in model.modules():
            if isinstance(module, Block):
                module.compile()
    step_fn = forward_backward if tc.memory_efficient else plain_forward_backward
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    bytes_per_step = cfg.data.batch_size * mc.seq_len * tc.grad_accum * d.world_size
    flops_per_step = step_flops(model, bytes_per_step, mc.seq_len)  # the model's, over all ranks
    peak_flops = peak_gpu_flops(device)
    horizon = schedule_horizon(tc, bytes_per_step)
    params = list(model.parameters())
    metrics, metrics_ok = open(run_dir / METRICS, "a") if d.is_main else None, True
    last_saved = last_val = step if ckpt is not None else -1

    def save(final: bool) -> Path | None:
        """Every rank takes part (gathering); rank 0 writes, and all agree on whether it worked."""
        nonlocal last_saved
        loaders, rngs = dist_lib.gather(loader.state_dict(), d), dist_lib.gather(_encoded_rng(device), d)
        stats = dist_lib.gather(loader.stats(), d)
        weights, optim = dist_lib.full_state(wrapped, optimizer)
        path, error = None, None
        if d.is_main:
            state = {"bytes_seen": bytes_seen, "elapsed_s": elapsed, "skipped_steps": skipped,
                     "bad_run": bad_run, "val_bpb": val_bpb, "world_size": d.world_size,
                     "loaders": loaders, "loader_stats": combine_stats(stats), "rngs": rngs}
            try:
                path = save_checkpoint(run_dir, step=step, model=model, config=cfg, train_state=state,
                                       keep=tc.keep_checkpoints, model_state=weights, optimizer_state=optim)
            except CheckpointError as e:
                error = e
        if dist_lib.any_rank(error is not None, d, device):
            message = str(error) if error is not None else "rank 0 could not save a checkpoint"
            if final:
                raise TrainingError(message)
            say(f"warning: {message}; training goes on")
            return None
        last_saved = step
        return path

    def log(record: dict) -> None:
        """One metrics line; non-finite numbers become null (strict JSON); a full disk warns."""
        nonlocal metrics_ok
        if metrics is None:
            return
        try:
            metrics.write(json.dumps(_finite(record)) + "\n")
            metrics.flush()
            metrics_ok = True
        except OSError as e:
            if metrics_ok:
                say(f"warning: cannot write {run_dir / METRICS} ({e.strerror}); training goes on")
            metrics_ok = False

    def run_validation() -> None:
        nonlocal val_bpb, last_val
        if not has_val:
            return
        with autocast:  # the first train.eval_batches batches of the val split, shared out over the ranks
            val_bpb = evaluate(model, cfg.data.path, split="val", batches=tc.eval_batches,
                               batch_size=cfg.data.batch_size, device=device, d=d,
                               mask_after_eos=cfg.loss.mask_after_eos)["bpb"]
        last_val = step
        log({"step": step, "bytes": bytes_seen, "val_bpb": val_bpb})
        say(f"step {step}: val bits/byte " + " ".join(f"h{k + 1} {b:.3f}" for k, b in enumerate(val_bpb)))

    total = tc.steps or None
    bar = tqdm(total=total, initial=step, desc="train", unit="step", disable=not show_progress,
               dynamic_ncols=True)
    started, stopped_by = time.perf_counter() - elapsed, None
    session_start = time.perf_counter()
    model.train()
    with stop_on_signals() as flag:
        while True:
            out_of_time = bool(tc.max_time) and time.perf_counter() - session_start >= tc.max_time
            if tc.steps and step >= tc.steps:
                stopped_by = "steps"
            elif tc.max_bytes and bytes_seen >= tc.max_bytes:
                stopped_by = "bytes"
            # clocks and signals differ between ranks: every rank stops when one must
            elif dist_lib.any_rank(out_of_time or bool(flag["signal"]), d, device):
                stopped_by = "time" if out_of_time else "signal"
            if stopped_by:
                break
            lr = lr_at(step, tc, horizon)
            for group in optimizer.param_groups:
                group["lr"] = lr
            t0 = time.perf_counter()
            loss, head_loss, head_acc = accumulate_gradients(
                model, wrapped, (next(loader).to(device, non_blocking=True) for _ in range(tc.grad_accum)),
                step_fn=step_fn, loss_cfg=cfg.loss, accum=tc.grad_accum, d=d, autocast=autocast)
            grad_norm = dist_lib.local(torch.nn.utils.clip_grad_norm_(params, tc.grad_clip or float("inf")))
            if torch.isfinite(loss) and torch.isfinite(grad_norm):
                optimizer.step()
                bad_run = 0
            else:
                skipped, bad_run = skipped + 1, bad_run + 1
                say(f"step {step + 1}: non-finite loss or gradient, step skipped ({bad_run} in a row)")
                if bad_run >= tc.max_bad_steps:
                    optimizer.zero_grad(set_to_none=True)
                    raise TrainingError(
                        f"{bad_run} consecutive steps had a non-finite loss or gradient "
                        f"(train.max_bad_steps={tc.max_bad_steps}); lower train.lr or check the data; "
                        f"the last good checkpoint is in {run_dir / 'checkpoints'}")
            optimizer.zero_grad(set_to_none=True)
            step += 1
            bytes_seen += bytes_per_step
            elapsed = time.perf_counter() - started
            step_s = time.perf_counter() - t0
            bpb = head_loss[0].item() / LN2
            bar.update()
            # the next-byte head's loss: the figure a byte model is judged by (the sum over heads is logged)
            bar.set_postfix_str(f"next-byte loss {head_loss[0].item():.3f} ({bpb:.3f} bits/byte) "
                                f"{bytes_per_step / step_s:,.0f} B/s", refresh=False)
            if step % tc.log_every == 0 or step == tc.steps:
                data_stats = combine_stats(dist_lib.gather(loader.stats(), d))
                gpu = {}
                if device.type == "cuda":  # model FLOP utilisation of all ranks' GPUs; this rank's memory
                    gpu["peak_mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
                    if peak_flops:
                        gpu["mfu"] = flops_per_step / step_s / (peak_flops * d.world_size)
                log({**gpu, "step": step, "bytes": bytes_seen, "loss": loss.item(), "bpb": bpb,
                     "head_loss": head_loss.tolist(), "head_acc": head_acc.tolist(), "lr": lr,
                     "grad_norm": grad_norm.item(), "bytes_per_s": bytes_per_step / step_s,
                     "skipped_steps": skipped, "elapsed_s": elapsed, "data": data_stats})
            if tc.eval_every and step % tc.eval_every == 0:
                run_validation()
            if step % tc.ckpt_every == 0:
                save(final=False)
        bar.close()
        if stopped_by == "signal":
            names = dist_lib.gather(flag["signal"], d)
            rank = next(r for r, name in enumerate(names) if name)
            where = f" (by rank {rank})" if d.active else ""
            say(f"{names[rank]} received{where}: saving step {step} and stopping")
        if last_val != step:
            run_validation()
        path = save(final=True) if last_saved != step else None
        dist_lib.barrier(d)
        path = path or latest_checkpoint(run_dir)
    if metrics is not None:
        metrics.close()
    return RunResult(step=step, bytes_seen=bytes_seen, stopped_by=stopped_by, checkpoint=path,
                     val_bpb=val_bpb)


def accumulate_gradients(model: ByteMTP, wrapped, batches, *, step_fn, loss_cfg, accum: int,
                         d: dist_lib.Dist, autocast=contextlib.nullcontext()):
    """Forward and backward of one optimizer step's `accum` micro-batches, with the gradients
    reduced once over the ranks; the loss, per-head loss and per-head accuracy averaged over the
    micro-batches and the ranks."""
    outs = []
    for micro, batch in enumerate(batches):
        with autocast, dist_lib.gradient_sync(wrapped, last=micro == accum - 1):
            outs.append(step_fn(model, batch, loss_cfg=loss_cfg, scale=1 / accum))
    dist_lib.reduce_gradients(wrapped, d)
    return tuple(dist_lib.mean(sum(values) / len(outs), d) for values in
                 zip(*((o.total, o.head_loss, o.head_accuracy) for o in outs)))


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def absolute_corpus(cfg: Config) -> Config:
    """cfg with data.path made absolute (against the current directory), so that the run's
    config.json names its corpus from anywhere."""
    path = cfg.data.path
    if os.path.isabs(path):
        return cfg
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=os.path.abspath(path)))


def same_corpus(a: str, b: str) -> bool:
    """Whether two corpus specs name the same corpus: the same real path, or two prepared corpora
    with the same manifest (a copy, or the same folder reached another way)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return corpus.read_manifest(a) == corpus.read_manifest(b)
    except corpus.CorpusError:
        return False


def resume_target(path: str | os.PathLike) -> tuple[Path, Path]:
    """(run directory, checkpoint) that resuming `path` continues: a run directory (its newest
    checkpoint), its checkpoints/ folder, or its newest checkpoint itself."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path} does not exist; resume a run directory that `bytemtp train` wrote")
    if is_checkpoint_dir(path):
        run_dir = path.parent.parent
        if path.parent.name != "checkpoints":
            raise ValueError(f"{path} is a checkpoint outside a run directory (RUN/checkpoints/step-*); "
                             "only a run can be resumed")
        latest = latest_checkpoint(run_dir)
        if latest is None or latest.resolve() != path.resolve():
            newer = f"{latest.name} is its newest" if latest is not None else "it is incomplete"
            raise ValueError(f"{path} is not the newest checkpoint of {run_dir} ({newer}); resume the run "
                             f"directory {run_dir} to go on from its newest, or delete the newer "
                             f"checkpoints in {path.parent} to go back to {path.name}")
        return run_dir, path
    run_dir = path.parent if path.name == "checkpoints" and not (path / "checkpoints").exists() else path
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise ValueError(f"no checkpoint to resume in {run_dir} (expected "
                         f"{run_dir / 'checkpoints' / 'step-*'}/); start a new run there instead")
    return run_dir, ckpt


@dataclass(frozen=True)
class RunPlan:
    """A run resolved and checked before any work: where it lives, its config and what to do."""

    run_dir: Path
    cfg: Config  # data.path absolute
    resume: bool
    checkpoint: Path | None  # the newest checkpoint, that a resumed run goes on from
    done: RunResult | None  # a resumed run that has already reached its step or bytes limit


def plan_run(path: str | os.PathLike, *, resume: bool = False, preset: str | None = None,
             config_file: str | None = None, overrides: list[str] = ()) -> RunPlan:
    """The run that `train(plan.cfg, plan.run_dir, resume=plan.resume)` starts or resumes.

    A new run: the preset (default small), then a config file, then each override; its run
    directory must be new (or left by a run that died before its first checkpoint) and its corpus
    must exist and not be a run directory. A resumed run (`path` a run directory, its checkpoints/
    folder or its newest checkpoint): the checkpoint's config takes the preset's place, a preset is
    refused, only train.* may change and data.path may name the same corpus another way."""
    if resume:
        if preset is not None:
            raise ValueError(f"preset {preset!r} is for a new run; a resumed run keeps its checkpoint's "
                             "settings (change train.* with a config file or overrides)")
        run_dir, ckpt = resume_target(path)
        saved = load_config(ckpt)
        cfg = config_lib.load_file(config_file, saved) if config_file else saved
        cfg = config_for_resume(saved, config_lib.apply_overrides(cfg, list(overrides)))
    else:
        run_dir, ckpt = Path(path), None
        cfg = config_lib.resolve(preset or "small", config_file=config_file, overrides=list(overrides))
        check_not_a_run(cfg.data.path)
    cfg = absolute_corpus(cfg)
    corpus.corpus_files(cfg.data.path)  # a missing corpus fails here, before any work
    if not resume and not dist_lib.restarted():  # (a restarted torchrun job resumes in train)
        _prepare_run_dir(run_dir, cfg, False, mutate=False)
    return RunPlan(run_dir=run_dir, cfg=cfg, resume=resume, checkpoint=ckpt,
                   done=_already_done(run_dir, cfg.train) if resume else None)


def check_not_a_run(spec) -> None:
    """Refuse a corpus that names a run directory (it holds checkpoints/ or run-config.json):
    training on checkpoint binaries is a mistake. Files inside a run can still be named one by
    one or with a glob."""
    for item in spec if isinstance(spec, (list, tuple)) else [spec]:
        path = Path(item)
        if path.is_dir() and ((path / "checkpoints").is_dir() or (path / RUN_CONFIG).is_file()):
            raise ValueError(f"the corpus {item} is a run directory (it holds "
                             f"{'checkpoints/' if (path / 'checkpoints').is_dir() else RUN_CONFIG}), not text to "
                             "train on; name a corpus, or its files with a glob if you mean them")


def config_for_resume(saved: Config, resolved: Config) -> Config:
    """On resume only train.* may change; a change elsewhere would not match the checkpoint.
    data.path may name the same corpus another way (another directory, a link, a copy)."""
    for section in ("model", "loss", "data"):
        before, after = to_dict(getattr(saved, section)), to_dict(getattr(resolved, section))
        for key in before:
            if section == "data" and key == "path":
                old, new = before[key], after[key]
                if old == new and not os.path.isabs(old) and not os.path.exists(old):
                    raise ValueError(f"the run's corpus {old} was named relative to the directory the "
                                     f"run started in and does not exist from here; name the corpus again (data.path)")
                if old == new or same_corpus(old, new) or (not os.path.isabs(old) and not os.path.exists(old)):
                    continue  # a relative name from another directory cannot be checked: the new one counts
            if before[key] != after[key]:
                raise ValueError(f"{section}.{key} cannot change when resuming (checkpoint has "
                                 f"{before[key]!r}, asked {after[key]!r}); start a new run instead")
    return resolved
