"""bytemtp's training step against nanoGPT's at nanoGPT's CPU-recipe shape, in one process, interleaved
(BENCHMARKS.md):

    python scripts/nanogpt-step.py NANOGPT_CHECKOUT [--config examples/nanogpt-shakespeare.toml]
        [--steps 40] [--arms compiled,eager] [--set key=value ...]

Each round takes one step of nanoGPT's model (`model.GPT` from the checkout: 4 layers of width 128,
4 heads, context 64, batch 12, fp32 and AdamW as its README's CPU command runs it) and then one of
each bytemtp arm (the config's model and optimizer; `compiled` as train.compile=on takes it, `eager`
the reference), on random ids, each step timed from its forward to its optimizer's zero_grad. It
prints each arm's median ms a step and the ratio to nanoGPT's, with the spread of the round-by-round
ratios (min, median, max). `scripts/nanogpt-peer.sh` trains both for real; this isolates the step.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time

import torch

from bytemtp.config_io import resolve
from bytemtp.model.model import ByteMTP
from bytemtp.runtime.devices import autocast
from bytemtp.training.optimizer import build_optimizer
from bytemtp.training.step import compile_blocks, forward_backward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("nanogpt", help="a nanoGPT checkout (its model.py)")
    ap.add_argument("--config", default="examples/nanogpt-shakespeare.toml")
    ap.add_argument("--steps", type=int, default=40, help="timed rounds")
    ap.add_argument("--arms", default="compiled,eager")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    args = ap.parse_args()
    cfg = resolve("small", config_file=args.config, overrides=args.sets)
    mc, tc, device = cfg.model, cfg.train, torch.device("cpu")
    B, T = cfg.data.batch_size, mc.seq_len
    gen = torch.Generator().manual_seed(1)

    def bytemtp_arm(compiled: bool):
        torch.manual_seed(0)
        model = ByteMTP(mc)
        optimizer = build_optimizer(model, tc, device)
        if compiled:
            compile_blocks(model)
        step_fn = functools.partial(forward_backward, loss_cfg=cfg.loss, compiled=compiled)
        batches = [torch.randint(0, 256, (B, T + mc.n_future), generator=gen) for _ in range(8)]
        context = autocast(device, tc.precision)

        def step(i: int) -> float:
            t0 = time.perf_counter()
            with context:
                step_fn(model, batches[i % 8])
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return time.perf_counter() - t0
        return step

    sys.path.insert(0, args.nanogpt)
    from model import GPT, GPTConfig  # nanoGPT's

    torch.manual_seed(0)
    gpt = GPT(GPTConfig(block_size=64, vocab_size=65, n_layer=4, n_head=4, n_embd=128, dropout=0.0, bias=False))
    gpt_opt = gpt.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    gpt_batches = [(torch.randint(0, 65, (12, 64), generator=gen), torch.randint(0, 65, (12, 64), generator=gen))
                   for _ in range(8)]

    def nanogpt_step(i: int) -> float:
        t0 = time.perf_counter()
        x, y = gpt_batches[i % 8]
        _, loss = gpt(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gpt.parameters(), 1.0)
        gpt_opt.step()
        gpt_opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    arms = {"nanoGPT": nanogpt_step}
    arms.update({name: bytemtp_arm(name == "compiled") for name in args.arms.split(",")})
    for name, step in arms.items():  # warm-up: the compiled arm compiles here
        t0 = time.perf_counter()
        for i in range(3):
            step(i)
        print(f"{name}: warm-up {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    times = {name: [] for name in arms}
    for i in range(args.steps):
        for name, step in arms.items():
            times[name].append(step(i))
    base = statistics.median(times["nanoGPT"])
    print(f"batch {B} x {T}, {mc.n_layers} layers of width {mc.d_model}, {tc.optimizer}, precision {tc.precision}, "
          f"{torch.get_num_threads()} threads, {args.steps} interleaved rounds")
    print(f"nanoGPT        {1000 * base:6.1f} ms a step")
    for name in list(arms)[1:]:
        ratios = sorted(a / b for a, b in zip(times[name], times["nanoGPT"]))
        print(f"bytemtp {name:8s} {1000 * statistics.median(times[name]):6.1f} ms a step: "
              f"{statistics.median(times[name]) / base:.3f}x nanoGPT's (round by round {ratios[0]:.2f}-"
              f"{statistics.median(ratios):.2f}-{ratios[-1]:.2f})")


if __name__ == "__main__":
    main()
