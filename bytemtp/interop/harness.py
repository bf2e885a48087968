"""A bytemtp model for EleutherAI's lm-evaluation-harness, registered there as `bytemtp`.

    import bytemtp.interop.harness, lm_eval
    lm_eval.simple_evaluate(model="bytemtp", model_args="ckpt=runs/demo,device=cpu", tasks=[...])

or from the shell, `bytemtp lm-eval --model bytemtp --model_args ckpt=runs/demo --tasks ...`
(lm_eval's own command line with this model registered: lm_eval finds models only in its own
package). It needs the optional extra: `pip install 'bytemtp[harness]'`.

The three request types, over bytes (a request's text is its UTF-8 bytes; no tokenizer):
- `loglikelihood` and `loglikelihood_rolling`: the next-byte head's log-probabilities, batched,
  each sequence after EOS (a new document), windows sliding by `bytemtp.evaluation.likelihood`'s rule, the
  one that `bytemtp eval` scores its stream by;
- `generate_until`: self-speculative decoding (`bytemtp.decoding.decode.Decoder`, drafts chosen from
  measured costs unless `draft=` fixes them), greedy or sampled (`do_sample`, `temperature`,
  `top_k`, `top_p`; seeded by `seed`), until a stop string, EOS or `max_gen_toks` bytes. Greedy
  output is exactly plain greedy decoding's; sampled output has the model's distribution.

One process: the model answers every request itself (no data-parallel ranks).
"""

from __future__ import annotations

import logging

import torch
from tqdm import tqdm

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import simple_parse_args_string
except ModuleNotFoundError as e:
    if not (e.name or "").startswith("lm_eval"):
        raise
    raise ModuleNotFoundError("the lm-evaluation-harness model needs lm-eval: pip install 'bytemtp[harness]'",
                              name=e.name) from None

from bytemtp.decoding.decode import Decoder
from bytemtp.decoding.generation import as_bytes
from bytemtp.decoding.sampling import Sampling
from bytemtp.decoding.strategy import Draft
from bytemtp.evaluation.likelihood import loglikelihoods, n_windows
from bytemtp.runtime.checkpoint import load_model
from bytemtp.runtime.devices import resolve_device

DEFAULT_MAX_GEN_BYTES = 256
log = logging.getLogger(__name__)
_GEN_KWARGS = {"until", "max_gen_toks", "do_sample", "temperature", "top_k", "top_p"}


def _batch_size(value, device: torch.device) -> int:
    """An lm-eval batch size: a number, or 'auto' (32 on a GPU, 8 on the CPU)."""
    if isinstance(value, str) and value.startswith("auto"):
        return 32 if device.type == "cuda" else 8
    try:
        size = int(value)
    except (TypeError, ValueError):
        size = 0
    if size < 1:
        raise ValueError(f"batch_size={value!r} is not allowed; expected a number >= 1 or auto")
    return size


@register_model("bytemtp")
class ByteMTPLM(LM):
    """lm-eval's view of a bytemtp checkpoint (a run directory or one of its checkpoints).

    ckpt: the run or checkpoint; device: auto, cpu, cuda, cuda:N; dtype: the weights' dtype
    (float32, bfloat16; default as saved); batch_size: windows or prompts per forward pass;
    max_gen_toks: bytes generated at most when a request does not say; draft: auto, plain,
    chain-K or tree-K; seed: of the sampling generator (it repeats a sample under any draft:
    each byte is drawn by its position).
    """

    def __init__(self, ckpt: str, *, device: str | None = "auto", dtype: str | None = None,
                 batch_size: int | str = 8, max_batch_size: int | None = None,
                 max_gen_toks: int = DEFAULT_MAX_GEN_BYTES, draft: str = "auto", seed: int = 1234):
        super().__init__()
        self._device = resolve_device(device or "auto")
        self.model, _ = load_model(ckpt, device=self._device, dtype=dtype, bytes_only="the lm-evaluation-harness model")
        self.batch_size = _batch_size(batch_size, self._device)
        if max_batch_size is not None:
            self.batch_size = min(self.batch_size, _batch_size(max_batch_size, self._device))
        if int(max_gen_toks) < 1:
            raise ValueError(f"max_gen_toks={max_gen_toks!r} is not allowed; expected >= 1 (bytes)")
        self.max_gen_bytes = int(max_gen_toks)
        self.draft = Draft.parse(str(draft) if self.model.config.n_future > 1 else "plain")
        self.generator = torch.Generator(self._device).manual_seed(int(seed))
        self._decoder: Decoder | None = None

    # lm-eval adds its own --batch_size and --device (defaults included) to model_args; those
    # written into model_args win, so `--model_args ...,batch_size=8` means what it says
    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> ByteMTPLM:
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> ByteMTPLM:
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        if "device" in extra and "device" not in arg_dict:  # lm_eval's --device, cuda:0 by default
            try:
                resolve_device(str(extra["device"]))
            except ValueError as e:
                log.warning("%s; using device auto instead", e)
                extra["device"] = "auto"
        args = {**extra, **arg_dict}
        if "ckpt" not in args:
            raise ValueError("model_args needs ckpt=RUN (a bytemtp run directory or checkpoint)")
        unknown = set(args) - {"ckpt", "device", "dtype", "batch_size", "max_batch_size", "max_gen_toks",
                               "draft", "seed"}
        if unknown:
            raise ValueError(f"unknown model_args {', '.join(sorted(unknown))}; bytemtp takes ckpt, device, "
                             "dtype, batch_size, max_batch_size, max_gen_toks, draft, seed")
        return cls(args.pop("ckpt"), **args)

    @property
    def max_length(self) -> int:
        return self.model.config.seq_len

    @property
    def tokenizer_name(self) -> str:
        return "bytes"

    # --- scores ----------------------------------------------------------------------------

    def _loglikelihoods(self, pairs: list[tuple[bytes, bytes]], *, disable_tqdm: bool) -> list[tuple[float, bool]]:
        with tqdm(total=n_windows(pairs, seq_len=self.max_length), desc="bytemtp loglikelihood",
                  unit="window", disable=disable_tqdm) as bar:
            return loglikelihoods(self.model, pairs, batch_size=self.batch_size, progress=bar.update)

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [(as_bytes(ctx), as_bytes(cont)) for ctx, cont in (r.args for r in requests)]
        results = self._loglikelihoods(pairs, disable_tqdm=disable_tqdm)
        for r, result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", r.args, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        pairs = [(b"", as_bytes(r.args[0])) for r in requests]
        results = [lp for lp, _ in self._loglikelihoods(pairs, disable_tqdm=disable_tqdm)]
        for r, result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood_rolling", r.args, result)
        return results

    # --- generation ------------------------------------------------------------------------

    def _settings(self, gen_kwargs: dict) -> tuple[tuple[str, ...], int, Sampling]:
        """A request's stop strings, byte limit and sampling rule, from lm-eval's gen_kwargs."""
        unknown = set(gen_kwargs) - _GEN_KWARGS
        if unknown:
            raise ValueError(f"generation_kwargs {', '.join(sorted(unknown))} are not supported by bytemtp; "
                             f"it takes {', '.join(sorted(_GEN_KWARGS))}")
        until = gen_kwargs.get("until") or ()
        until = (until,) if isinstance(until, str) else tuple(until)
        max_bytes = int(gen_kwargs.get("max_gen_toks", self.max_gen_bytes))
        temperature = float(gen_kwargs.get("temperature", 1.0 if gen_kwargs.get("do_sample") else 0.0))
        if not gen_kwargs.get("do_sample", temperature > 0):
            temperature = 0.0
        sampling = Sampling(temperature=temperature, top_k=int(gen_kwargs.get("top_k") or 0),
                            top_p=float(gen_kwargs.get("top_p") or 1.0),
                            generator=None if temperature == 0 else self.generator)
        return until, max_bytes, sampling

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        if self._decoder is None:
            self._decoder = Decoder(self.model)  # heads stacked and pass costs measured once
        groups: dict[tuple, list[int]] = {}  # requests with the same settings decode together
        for i, r in enumerate(requests):
            gen_kwargs = dict(r.args[1] or {})
            key = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in gen_kwargs.items()))
            groups.setdefault(key, []).append(i)
        results: list[str] = [""] * len(requests)
        with tqdm(total=len(requests), desc="bytemtp generate_until", unit="request", disable=disable_tqdm) as bar:
            for indices in groups.values():
                until, max_bytes, sampling = self._settings(dict(requests[indices[0]].args[1] or {}))
                stops = tuple(s.encode() for s in until if s)
                for first in range(0, len(indices), self.batch_size):
                    chunk = indices[first:first + self.batch_size]
                    gens = self._decoder.generate([as_bytes(requests[i].args[0]) for i in chunk], max_bytes=max_bytes,
                                                  draft=self.draft, sampling=sampling, stop=stops)
                    for i, gen in zip(chunk, gens):
                        text = gen.output.decode("utf-8", errors="replace")
                        for s in until:  # the text before the first stop string
                            text = text.split(s)[0] if s else text
                        results[i] = text
                        self.cache_hook.add_partial("generate_until", requests[i].args, text)
                    bar.update(len(chunk))
        return results
