"""Configuration: frozen dataclasses, their validation, the head types. The presets, where every
configuration starts, are `bytemtp.config_io`'s.

No torch here, so the CLI can parse and validate a configuration before paying for the torch
import. Each field carries a one-line docstring under it; `bytemtp.config_docs` reads those
docstrings back from the source, so the CLI's help describes the same thing as the code. Reading
and writing configurations (dicts, JSON, files, `--set` overrides) is `bytemtp.config_io`'s.

Layer accounting (`ModelConfig.param_match`, on by default): `n_layers` is the total number of
transformer layers in the model, trunk and heads together, as in the paper's released code (the
next-byte model is a trunk of n_layers - 1 layers plus one head layer). With n_future heads of
`head_layers` layers each, the trunk has n_layers - n_future * head_layers layers, so a model with
8 heads and the next-byte baseline with the same `n_layers` have the same layer count and, up to
the extra unembeddings, the same parameter count. With `param_match` off the trunk keeps the
next-byte size (n_layers - head_layers) and the extra heads come on top. Linear heads take none.

Head types: `head_type` stays a name (in config.json, and `--set model.head_type=causal`);
`ModelConfig.head` is its `HeadType`, which answers what the rest asks of a kind of head (its
layers, whether it stacks or skips, what it reads, which cache layers a pass writes), so no module
compares names. It lives here because the accounting above needs it and floor-0 modules import no
other (tests/test_layering.py); what a head computes stays in `bytemtp.model.model`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, TypeVar

UNEMBED_TYPES = ("shared", "replicated")
MLP_TYPES = ("swiglu", "gelu")
HEAD_WEIGHTS = ("uniform", "geometric")
HEAD_SCHEDULES = ("constant", "forward", "reverse")  # how heads 2..n's weights follow training's progress
COMPILE = ("auto", "on", "off")  # compiled training (train.compile): auto compiles where it pays
PRECISIONS = ("auto", "bf16", "fp32")  # of training's matmuls (bf16: autocast; weights stay fp32)
PARALLEL = ("ddp", "fsdp")  # how many processes share a model: DistributedDataParallel or FSDP2
TRAINABLE = ("all", "draft-heads")  # what trains: the whole model, or heads 2..n only (tune-heads)
DIVERGENCES = ("kl", "tv")  # the teacher term: KL from head 1, or total variation (1 - speculative acceptance)
SCHEDULES = ("cosine", "wsd", "linear")  # the learning rate's decay after warmup
OPTIMIZERS = ("adamw", "muon")  # muon: Muon on the trunk's and heads' matrices, AdamW on the rest
LOG_TARGETS = ("jsonl", "tensorboard", "wandb")  # where training's metrics go (train.log_to; jsonl always)


def _check(ok: bool, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{name}={value!r} is not allowed; {allowed}")


def check_device(name: str, value: Any) -> None:
    """A device setting: auto, cpu, cuda, cuda:N (N what torch holds: 0 to 127; it took cuda:128 as
    cuda:-128, a longer number with a traceback), or the tests' stand-in accelerator (standin)."""
    _check(isinstance(value, str) and re.fullmatch(r"auto|cpu|cuda(:(1[01]\d|12[0-7]|[1-9]?\d))?|standin(:0)?", value)
           is not None, name, value, "choose auto, cpu, cuda or cuda:N (N from 0 to 127)")


def _positive_int(name: str, value: Any) -> None:
    _check(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
           name, value, "expected an integer >= 1")


# --- head types -------------------------------------------------------------------------------

State = TypeVar("State")  # a head's input or output state: a tensor to the model, anything here


class HeadType:
    """One kind of future-byte head, one stateless instance a type (`HEAD_TYPES`). `layered`: a head is
    `head_layers` transformer layers (else one D x D map); `stackable`: the first k run as one batched
    layer; `skippable`: a head can be left out while later ones run; `chained`: head k reads head k-1's
    state (else every head reads the trunk's)."""

    name: str
    layered: bool
    stackable: bool
    skippable: bool
    chained: bool

    def layers_per_head(self, head_layers: int) -> int:
        return head_layers if self.layered else 0

    def trunk_layers(self, *, n_layers: int, n_future: int, head_layers: int, param_match: bool) -> int:
        """n_layers less the layers of every head (param_match) or of the next-byte model's one head."""
        return n_layers - (n_future if param_match else 1) * self.layers_per_head(head_layers)

    def head_input(self, k: int, trunk: State, previous: State | None) -> State:
        """What head k (from 0) runs on: the trunk's state, or head k-1's for chained heads."""
        if self.chained and k > 0:
            assert previous is not None, f"{self.name} head {k} needs head {k - 1}'s state"
            return previous
        return trunk

    def skipped(self, weights: list[float]) -> frozenset[int]:
        """The heads a training step does not run for their weight of 0: each such head where heads
        can be skipped, else the heads after the last one with weight (the others feed them)."""
        if self.skippable:
            return frozenset(k for k, w in enumerate(weights) if w == 0)
        return frozenset(range(1 + max(k for k, w in enumerate(weights) if w), len(weights)))

    def cache_layers(self, *, trunk_layers: int, head_layers: int, heads: int, stacked: bool) -> tuple[int, ...]:
        """The cache layers a pass of the first `heads` heads writes, in the order it writes them:
        the trunk's, then every layer of head 0, of head 1, ... (one by one) or layer i of every
        head in turn, i = 0, 1, ... (stacked). Head j's layer i is layer trunk_layers + j * per + i."""
        assert self.stackable or not stacked, f"{self.name} heads do not stack"
        t, per = trunk_layers, self.layers_per_head(head_layers)
        pairs = [(j, i) for i in range(per) for j in range(heads)] if stacked else \
            [(j, i) for j in range(heads) for i in range(per)]
        return tuple(range(t)) + tuple(t + j * per + i for j, i in pairs)


class TransformerHeads(HeadType):
    """The paper's heads: `head_layers` transformer layers each on the trunk's state, independent."""
    name, layered, stackable, skippable, chained = "transformer", True, True, True, False


class LinearHeads(HeadType):
    """One D x D linear map each on the trunk's state: no layer taken from the trunk, nothing cached."""
    name, layered, stackable, skippable, chained = "linear", False, True, True, False


class CausalHeads(HeadType):
    """Transformer layers, head k on head k-1's state (DeepSeek-V3's sequential modules): run in order."""
    name, layered, stackable, skippable, chained = "causal", True, False, False, True


HEAD_TYPES: dict[str, HeadType] = {t.name: t for t in (TransformerHeads(), LinearHeads(), CausalHeads())}


@dataclass(frozen=True)
class DraftDesign:
    """A design of draft heads beside the training heads (`model.draft`; modules: `bytemtp.model.draft`), asked
    as head types are, never named: `heads`, whether there are any; `reads_bytes`, whether depth d reads d - 1's byte."""
    name: str
    heads: bool
    reads_bytes: bool = False


DRAFT_DESIGNS = {d.name: d for d in (DraftDesign("none", False), DraftDesign("medusa", True), DraftDesign("hydra", True, True))}


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the byte transformer: a shared trunk and n_future future-byte heads."""

    n_layers: int = 12
    """Total transformer layers, trunk and heads together (see the module docstring)."""
    d_model: int = 256
    """Width of the residual stream."""
    n_attn_heads: int = 4
    """Attention heads per layer; d_model must divide by it into an even head size."""
    n_future: int = 8
    """Number of output heads; head k predicts the byte k positions ahead (1 = next byte)."""
    head_type: str = "transformer"
    """Head architecture: transformer (independent layers), linear, or causal (head k runs on head k-1's state)."""
    head_layers: int = 1
    """Transformer layers in each transformer or causal head."""
    unembed: str = "replicated"
    """Unembedding: one matrix per head (replicated, the paper's byte models) or one shared by all."""
    draft: str = "none"
    """Cheap draft heads for decoding beside the training heads: none, medusa (n_future - 1 parallel residual blocks on head 1's state) or hydra (sequential blocks that also read the byte drafted before); trained by `bytemtp tune-heads --draft`."""
    param_match: bool = True
    """Take the heads' layers out of the trunk so the layer count does not grow with n_future."""
    doc_mask: bool = False
    """Attend only within each document of a packed window (an EOS starts a document); off: causal across them."""
    seq_len: int = 512
    """Context length in bytes (positions the model attends over; tokens where vocab_size is a BPE's)."""
    vocab_size: int = 259
    """Ids the model predicts: 259 for bytes (256 byte values, BOS, EOS, PAD); a byte-level BPE's size (its merges from id 264 on) for the token baseline of `bench tokens` (with data.tokenizer). Tables are padded to a multiple of 8."""
    mlp: str = "swiglu"
    """Feed-forward block: swiglu or gelu."""
    ffn_hidden: int = 0
    """Feed-forward hidden width; 0 picks 8/3 d_model (swiglu) or 4 d_model (gelu), rounded up to 64."""
    rope_theta: float = 10000.0
    """Base of the rotary position embedding."""
    dropout: float = 0.0
    """Dropout on attention weights and residual branches during training."""
    norm_eps: float = 1e-5
    """Epsilon of the RMSNorm layers."""
    init_std: float = 0.02
    """Standard deviation of the normal weight initialisation (residual outputs are scaled down by depth)."""
    value_embeds: int = 0
    """Trunk layers, the first ones, whose attention values add a learned embedding of each position's own id (modded-nanogpt's value embeddings: a table of vocab x d_model a layer, looked up, no arithmetic); 0: none."""
    ngram_embeds: int = 0
    """Largest n of the hashed n-gram tables added to each position's embedding (BLT's hash embeddings): one table for each n of 2..ngram_embeds, looked up by a hash of the position's id and the n - 1 ids before it; 0 or 1: none."""
    ngram_rows: int = 8192
    """Rows of each hashed n-gram table (model.ngram_embeds)."""

    @property
    def table_rows(self) -> int:
        """Rows of the embedding and unembedding tables: vocab_size padded to a multiple of 8."""
        return -(-self.vocab_size // 8) * 8  # as bytemtp.vocab.table_rows (config imports no other module)

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_attn_heads", "n_future", "head_layers", "seq_len", "ngram_rows"):
            _positive_int(f"model.{name}", getattr(self, name))
        _check(isinstance(self.vocab_size, int) and (self.vocab_size == 259 or self.vocab_size > 264),
               "model.vocab_size", self.vocab_size, "expected 259 (bytes) or a BPE's size (above 264, "
               "with data.tokenizer)")
        _check(self.head_type in HEAD_TYPES, "model.head_type", self.head_type,
               f"choose one of {', '.join(HEAD_TYPES)}")
        _check(self.unembed in UNEMBED_TYPES, "model.unembed", self.unembed,
               f"choose one of {', '.join(UNEMBED_TYPES)}")
        _check(self.draft in DRAFT_DESIGNS, "model.draft", self.draft, f"choose one of {', '.join(DRAFT_DESIGNS)}")
        _check(not self.drafts.heads or self.n_future >= 2, "model.draft", self.draft,
               "draft heads draft bytes 2..n_future ahead; set model.n_future >= 2")
        _check(self.mlp in MLP_TYPES, "model.mlp", self.mlp, f"choose one of {', '.join(MLP_TYPES)}")
        for name in ("param_match", "doc_mask"):
            _check(isinstance(getattr(self, name), bool), f"model.{name}", getattr(self, name), "expected true or false")
        _check(self.d_model % self.n_attn_heads == 0 and (self.d_model // self.n_attn_heads) % 2 == 0,
               "model.n_attn_heads", self.n_attn_heads, f"d_model={self.d_model} must split into n_attn_heads heads of even size")
        for name in ("rope_theta", "norm_eps", "init_std"):
            _check(getattr(self, name) > 0, f"model.{name}", getattr(self, name), "expected a number > 0")
        _check(0.0 <= self.dropout < 1.0, "model.dropout", self.dropout, "expected 0 <= dropout < 1")
        for name in ("value_embeds", "ngram_embeds", "ffn_hidden"):
            _check(type(getattr(self, name)) is int and getattr(self, name) >= 0, f"model.{name}", getattr(self, name),
                   "expected an integer >= 0")
        if self.trunk_layers < 1:
            need = self.n_layers - self.trunk_layers + 1
            raise ValueError(f"model.n_layers={self.n_layers} leaves no trunk layer for n_future={self.n_future} "
                             f"{self.head_type} heads of head_layers={self.head_layers}; use n_layers >= {need}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_attn_heads

    @property
    def head(self) -> HeadType:
        """The type of the heads, which whatever depends on the kind of head asks (never the name)."""
        return HEAD_TYPES[self.head_type]

    @property
    def drafts(self) -> DraftDesign:
        """The design of the draft heads (`model.draft`), which what depends on it asks."""
        return DRAFT_DESIGNS[self.draft]

    @property
    def layers_per_head(self) -> int:
        """Transformer layers inside one head (0 for linear heads)."""
        return self.head.layers_per_head(self.head_layers)

    @property
    def trunk_layers(self) -> int:
        return self.head.trunk_layers(n_layers=self.n_layers, n_future=self.n_future,
                                      head_layers=self.head_layers, param_match=self.param_match)

    @property
    def window(self) -> int:
        """Ids in one training window: seq_len inputs and n_future more, so that every head has a
        target for every input. The loader cuts windows of this size (consecutive windows
        overlapping by n_future), and the loss takes T = window - n_future from a window's shape."""
        return self.seq_len + self.n_future

    @property
    def total_layers(self) -> int:
        """Transformer layers in the built model (trunk plus all heads)."""
        return self.trunk_layers + self.n_future * self.layers_per_head

    @property
    def ffn_dim(self) -> int:
        if self.ffn_hidden:
            return self.ffn_hidden
        width = 8 * self.d_model / 3 if self.mlp == "swiglu" else 4 * self.d_model
        return 64 * math.ceil(width / 64)


@dataclass(frozen=True)
class LossConfig:
    """How the n per-head cross-entropies combine into the training loss."""

    head_weights: str = "uniform"
    """Weight of head k: uniform (1 each, the paper's plain sum) or geometric (decay ** (k - 1))."""
    geometric_decay: float = 0.8
    """Ratio between successive head weights when head_weights is geometric."""
    head_schedule: str = "constant"
    """How the weights of heads 2..n follow training: constant, forward (they join one by one, each ramping up from 0, over the first head_schedule_span of the schedule) or reverse (they fade one by one, the farthest first, to head_schedule_floor over the first head_schedule_span)."""
    head_schedule_span: float = 0.5
    """The share of the schedule's steps over which a forward or reverse head schedule moves (then it holds)."""
    head_schedule_floor: float = 0.0
    """The share of its weight a head keeps once a reverse schedule has faded it (0: the head stops training, and its forward and backward are skipped)."""
    mask_after_eos: bool = True
    """Ignore targets that lie beyond the end of the document the prediction starts in."""
    teacher_weight: float = 0.0
    """Weight of the teacher term of heads 2..n: the KL from head 1's distribution (detached), where the head's byte is next, to the head's own (0: off)."""
    teacher_divergence: str = "kl"
    """The teacher term's divergence: kl (from head 1's distribution) or tv (total variation to it: one minus the acceptance rate of speculative sampling)."""
    teacher_temperature: float = 1.0
    """Temperature of head 1's distribution as the teacher; below 1 sharpens it toward head 1's greedy byte."""
    draft_data_weight: float = 1.0
    """Weight of the cross-entropy on the data of heads 2..n (1: the paper's loss; 0: the teacher term alone)."""
    rollout_bytes: int = 0
    """Self-generated targets: the last this many inputs of every window are the model's own greedy continuation (needs train.trainable=draft-heads; 0: off)."""

    def __post_init__(self) -> None:
        _check(self.head_weights in HEAD_WEIGHTS, "loss.head_weights", self.head_weights, f"choose one of {', '.join(HEAD_WEIGHTS)}")
        _check(0.0 < self.geometric_decay <= 1.0, "loss.geometric_decay", self.geometric_decay, "expected 0 < decay <= 1")
        _check(isinstance(self.mask_after_eos, bool), "loss.mask_after_eos", self.mask_after_eos, "expected true or false")
        _check(self.head_schedule in HEAD_SCHEDULES, "loss.head_schedule", self.head_schedule, f"choose one of {', '.join(HEAD_SCHEDULES)}")
        _check(isinstance(self.head_schedule_span, (int, float)) and 0.0 < self.head_schedule_span <= 1.0,
               "loss.head_schedule_span", self.head_schedule_span, "expected 0 < span <= 1")
        _check(isinstance(self.head_schedule_floor, (int, float)) and 0.0 <= self.head_schedule_floor <= 1.0,
               "loss.head_schedule_floor", self.head_schedule_floor, "expected 0 <= floor <= 1")
        for name in ("teacher_weight", "draft_data_weight"):
            value = getattr(self, name)
            _check(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                   and value >= 0, f"loss.{name}", value, "expected a number >= 0")
        _check(self.teacher_divergence in DIVERGENCES, "loss.teacher_divergence", self.teacher_divergence,
               f"choose {' or '.join(DIVERGENCES)}")
        _check(isinstance(self.teacher_temperature, (int, float)) and self.teacher_temperature > 0,
               "loss.teacher_temperature", self.teacher_temperature, "expected a number > 0")
        _check(isinstance(self.rollout_bytes, int) and not isinstance(self.rollout_bytes, bool)
               and self.rollout_bytes >= 0, "loss.rollout_bytes", self.rollout_bytes, "expected an integer >= 0")
        _check(self.teacher_weight > 0 or self.draft_data_weight > 0, "loss.draft_data_weight",
               self.draft_data_weight, "heads 2..n need a data term or a teacher term (set loss.teacher_weight)")

    def weights(self, n_future: int) -> list[float]:
        if self.head_weights == "uniform":
            return [1.0] * n_future
        return [self.geometric_decay**k for k in range(n_future)]


@dataclass(frozen=True)
class DataConfig:
    """Where training bytes come from and how they are packed and shuffled."""

    path: str = "data/corpus/stdlib"
    """Corpus: a prepared corpus directory, a directory of files, a glob, or one file."""
    field: str = "text"
    """JSON field (JSONL files) or column (Parquet, Arrow files) that holds the text."""
    batch_size: int = 8
    """Windows per batch (per process)."""
    shuffle_buffer: int = 16384
    """Windows shuffled together: each reader reads this many windows of its stream (fewer at an epoch's end) and hands them out in one random order, at about 2.5 x shuffle_buffer x seq_len bytes of memory; 1 keeps the packing order."""
    seed: int = 0
    """Seed of the shard order (a new order every epoch) and of the shuffle."""
    num_workers: int = 0
    """DataLoader worker processes per rank; 0 reads in the training process."""
    max_bad_fraction: float = 0.01
    """Abort when more than this fraction of records is unusable (JSONL lines of invalid JSON or no text, null table rows)."""
    tokenizer: str = ""
    """A byte-level BPE's tokenizer.json (from `bench tokens`) to train on its tokens instead of bytes, with model.vocab_size its size; empty: bytes."""

    def __post_init__(self) -> None:
        _check(isinstance(self.path, str) and bool(self.path), "data.path", self.path, "expected a corpus path")
        _positive_int("data.batch_size", self.batch_size)
        _positive_int("data.shuffle_buffer", self.shuffle_buffer)
        _check(isinstance(self.seed, int) and not isinstance(self.seed, bool), "data.seed", self.seed,
               "expected an integer")
        _check(isinstance(self.num_workers, int) and self.num_workers >= 0, "data.num_workers",
               self.num_workers, "expected an integer >= 0")
        _check(0.0 <= self.max_bad_fraction <= 1.0, "data.max_bad_fraction", self.max_bad_fraction,
               "expected 0 <= fraction <= 1")
        _check(isinstance(self.tokenizer, str), "data.tokenizer", self.tokenizer,
               "expected the path of a tokenizer.json, or empty for bytes")


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation loop: optimizer, schedule, stopping, checkpoints, validation, faults."""

    steps: int = 0
    """Stop after this many optimizer steps (0: no step limit)."""
    max_bytes: int = 0
    """Stop once this many training bytes were consumed (0: no limit)."""
    max_time: float = 0.0
    """Stop after this many seconds of training in this process (0: no limit)."""
    optimizer: str = "adamw"
    """adamw, or muon (Muon on the trunk's and heads' matrices; AdamW at train.lr on the embedding, norms and unembeddings)."""
    lr: float = 1e-3
    """Peak learning rate of AdamW."""
    min_lr_ratio: float = 0.1
    """The decay ends at this fraction of the peak."""
    warmup_steps: int = 100
    """Steps of linear warmup from 0 to the peak."""
    schedule: str = "cosine"
    """Decay after warmup: cosine, linear, or wsd (warmup-stable-decay: the peak, then a linear decay over the last decay_fraction of the schedule)."""
    decay_fraction: float = 0.2
    """The share of the schedule's steps that the wsd schedule spends decaying."""
    schedule_steps: int = 0
    """Length of warmup plus decay; 0 uses `steps`, else the bytes budget, else one fitted to max_time from the measured step rate."""
    weight_decay: float = 0.1
    """Decoupled weight decay of AdamW on matrices (not on norms)."""
    muon_lr: float = 0.02
    """Peak learning rate of Muon (train.optimizer=muon), on the schedule's shape."""
    muon_momentum: float = 0.95
    """Muon's (Nesterov) momentum."""
    muon_weight_decay: float = 0.0
    """Muon's decoupled weight decay."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2 (0.95 as in the paper)."""
    grad_clip: float = 1.0
    """Clip the gradient norm to this (0: no clipping)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    memory_efficient: bool = True
    """Run the heads' forward and backward one at a time (paper Fig. 2); false uses one backward."""
    compile: str | bool = "auto"
    """Compiled training: on (torch.compile every transformer block and each head's loss), off (eager, the reference), or auto (on where it pays: a CUDA device or a run of at least a minute or about 2e12 FLOP on the CPU, where a C++ compiler is at hand; true and false are on and off)."""
    peak_flops: float = 0.0
    """The device's peak FLOP/s, for model FLOP utilisation in the progress line and metrics (0: known GPUs' bf16 peak, else none shown)."""
    precision: str = "auto"
    """Matmuls of training and validation: bf16 (autocast; weights and optimizer state stay fp32), fp32, or auto (bf16 on CUDA and on a CPU with native bf16, AVX512-BF16 or AMX; else fp32)."""
    device: str = "auto"
    """auto (CUDA when available, else CPU), cpu, cuda or cuda:N."""
    seed: int = 0
    """Seed of the weight initialisation and of dropout."""
    log_every: int = 10
    """Write a metrics line every this many steps."""
    log_to: str = "jsonl"
    """Where the metrics go, comma-separated: jsonl (RUN/metrics.jsonl, always written), tensorboard (RUN/tensorboard/; pip install 'bytemtp[tensorboard]'), wandb (Weights & Biases, offline unless set up; pip install 'bytemtp[wandb]'); e.g. jsonl,tensorboard."""
    eval_every: int = 200
    """Validate every this many steps (and at the end); 0: only at the end."""
    eval_batches: int = 20
    """Batches of the val split per validation."""
    ckpt_every: int = 200
    """Save a checkpoint every this many steps (and at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk (at least 2)."""
    max_bad_steps: int = 10
    """Abort after this many consecutive steps with a non-finite loss or gradient."""
    parallel: str = "ddp"
    """Under torchrun: ddp (replicate the model) or fsdp (FSDP2: shard it, for models that do not fit)."""
    dist_timeout: float = 600.0
    """Seconds a process waits in a collective before the job ends with an error (a stuck rank)."""
    init: str = ""
    """Weights a new run starts from: a checkpoint or a run (its newest) of the same model settings; empty: random."""
    trainable: str = "all"
    """What trains: all, or draft-heads (heads 2..n and their own unembeddings; embedding, trunk and head 1 frozen)."""

    def __post_init__(self) -> None:
        for name in ("steps", "max_bytes", "warmup_steps", "schedule_steps", "eval_every", "seed"):
            value = getattr(self, name)
            _check(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                   f"train.{name}", value, "expected an integer >= 0")
        for name in ("grad_accum", "log_every", "eval_batches", "ckpt_every", "max_bad_steps"):
            _positive_int(f"train.{name}", getattr(self, name))
        _check(self.keep_checkpoints >= 2, "train.keep_checkpoints", self.keep_checkpoints,
               "keep at least the two newest checkpoints (>= 2)")
        _check(self.max_time >= 0, "train.max_time", self.max_time, "expected seconds >= 0")
        _check(self.lr > 0, "train.lr", self.lr, "expected a number > 0")
        _check(0.0 <= self.min_lr_ratio <= 1.0, "train.min_lr_ratio", self.min_lr_ratio, "expected 0 <= ratio <= 1")
        _check(self.weight_decay >= 0, "train.weight_decay", self.weight_decay, "expected >= 0")
        _check(0.0 <= self.beta1 < 1.0 and 0.0 <= self.beta2 < 1.0, "train.beta1/beta2",
               (self.beta1, self.beta2), "expected 0 <= beta < 1")
        _check(self.grad_clip >= 0, "train.grad_clip", self.grad_clip, "expected >= 0")
        _check(self.parallel in PARALLEL, "train.parallel", self.parallel, f"choose {' or '.join(PARALLEL)}")
        _check(self.dist_timeout > 0, "train.dist_timeout", self.dist_timeout, "expected seconds > 0")
        check_device("train.device", self.device)
        _check(isinstance(self.init, str), "train.init", self.init, "expected a checkpoint or run path")
        _check(self.trainable in TRAINABLE, "train.trainable", self.trainable, f"choose {' or '.join(TRAINABLE)}")
        if isinstance(self.compile, bool):  # an older run's config said true or false
            object.__setattr__(self, "compile", "on" if self.compile else "off")
        _check(self.peak_flops >= 0, "train.peak_flops", self.peak_flops, "expected FLOP/s >= 0 (0: known GPUs)")
        _check(self.compile in COMPILE, "train.compile", self.compile, f"choose one of {', '.join(COMPILE)}")
        _check(self.precision in PRECISIONS, "train.precision", self.precision, f"choose one of {', '.join(PRECISIONS)}")
        _check(self.schedule in SCHEDULES, "train.schedule", self.schedule, f"choose one of {', '.join(SCHEDULES)}")
        _check(0.0 < self.decay_fraction <= 1.0, "train.decay_fraction", self.decay_fraction,
               "expected 0 < fraction <= 1")
        _check(self.optimizer in OPTIMIZERS, "train.optimizer", self.optimizer, f"choose {' or '.join(OPTIMIZERS)}")
        _check(self.muon_lr > 0, "train.muon_lr", self.muon_lr, "expected a number > 0")
        _check(0.0 <= self.muon_momentum < 1.0, "train.muon_momentum", self.muon_momentum, "expected 0 <= momentum < 1")
        _check(self.muon_weight_decay >= 0, "train.muon_weight_decay", self.muon_weight_decay, "expected >= 0")
        _check(isinstance(self.log_to, str) and set(self.log_targets) <= set(LOG_TARGETS), "train.log_to",
               self.log_to, f"a comma-separated list of {', '.join(LOG_TARGETS)}")
        _check(not (self.optimizer == "muon" and self.parallel == "fsdp"), "train.optimizer", self.optimizer,
               "Muon does not run under train.parallel=fsdp: its Newton-Schulz step orthogonalises whole "
               "matrices and FSDP2 shards each one over the ranks; use train.parallel=ddp or train.optimizer=adamw")

    @property
    def log_targets(self) -> tuple[str, ...]:
        """train.log_to's names, each once, jsonl first (it is always written)."""
        return tuple(dict.fromkeys(["jsonl", *(n.strip() for n in self.log_to.split(",") if n.strip())]))


@dataclass(frozen=True)
class Config:
    """Everything a run is built from; saved as config.json beside every checkpoint."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The model's shape."""
    loss: LossConfig = field(default_factory=LossConfig)
    """The training objective."""
    data: DataConfig = field(default_factory=DataConfig)
    """The training corpus and its loader."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The training loop."""

    def __post_init__(self) -> None:
        _check(not self.model.drafts.heads or self.train.trainable == "draft-heads", "model.draft", self.model.draft,
               "draft heads train with the rest frozen (train.trainable=draft-heads, as tune-heads --drafter sets)")
        if self.loss.rollout_bytes:
            _check(self.train.trainable == "draft-heads", "loss.rollout_bytes", self.loss.rollout_bytes,
                   "self-generated targets need the trunk and head 1 frozen (train.trainable=draft-heads, "
                   "as bytemtp tune-heads sets)")
            _check(self.loss.rollout_bytes <= self.model.seq_len, "loss.rollout_bytes", self.loss.rollout_bytes,
                   f"expected at most model.seq_len={self.model.seq_len}")
        _check((self.model.vocab_size == 259) == (not self.data.tokenizer), "model.vocab_size", self.model.vocab_size,
               "259 trains on bytes (data.tokenizer empty); a BPE's size needs its tokenizer.json in data.tokenizer"
               if self.data.tokenizer else "a size above 259 needs the BPE's tokenizer.json in data.tokenizer")
