"""GPU check, part (c): training speed and model FLOP utilisation of the `base` preset.

    python3 scripts/gpu/train.py [--out DIR] [--carry .gpu] [--preset base] [--dry-run]

`bench train-step --preset base --device cuda` compiled (`--compile on`, as train.compile takes
it on a GPU) and eager (`--compile off`), in bf16 (train.precision auto on a GPU): per variant
(next-byte, the memory-efficient 8-head step, the plain 8-head step) bytes a second, MFU (the
H200's bf16 peak, bytemtp/model/flops.py) and peak memory, and the 8-head step's time over the
next-byte step's. One table, $OUT/train.json (both runs' JSON) and $OUT/train.log.
`--dry-run` runs both on the CPU with the tiny preset, eager, in well under a minute.
"""

from __future__ import annotations

import sys

from part import Part, arguments, fmt, outcome_table, read_json

VARIANTS = (("ntp", "next-byte"), ("mtp", "8 heads, memory-efficient"), ("mtp_plain", "8 heads, plain"))


def options(parser) -> None:
    parser.add_argument("--preset", default="base", help="the preset whose step is timed (default base)")
    parser.add_argument("--steps", type=int, default=6, help="timed rounds (bench train-step --steps)")


def run(p: Part) -> dict[str, dict]:
    """bench train-step compiled, then eager; the JSON of those that ran."""
    a, results = p.args, {}
    preset, steps = ("tiny", ["--steps", "1", "--warmup", "1", "--min-sample-s", "0", "--batch-size", "2"]) \
        if a.dry_run else (a.preset, ["--steps", str(a.steps)])
    for label, compile_mode in (("compiled", "on"), ("eager", "off")):
        if a.dry_run and compile_mode == "on":
            p.skip(f"train-step {label}", "dry run: compiling takes minutes on a CPU (the eager step below runs)")
            continue
        json_path = p.work / f"train-step-{label}.json"
        outcome = p.bytemtp(f"train-step {label}", "bench", "train-step", "--preset", preset, *steps,
                            "--compile", compile_mode, "--device", p.device, "--json", str(json_path),
                            timeout=270)
        data = read_json(json_path) if outcome.status == "PASS" else None
        if data is not None:
            results[label] = data
    return results


def table(results: dict[str, dict]) -> list[str]:
    head = f"{'step':<9} {'variant':<26} {'bytes/s':>10} {'ms/step':>8} {'MFU':>6} {'peak MB':>8}"
    lines = [head, "-" * len(head)]
    for label, d in results.items():
        for key, name in VARIANTS:
            mfu = d.get(f"{key}_mfu")
            lines.append(f"{label:<9} {name:<26} {fmt(d.get(f'{key}_bytes_s'), ',.0f'):>10} "
                         f"{fmt(1000 * d[f'{key}_step_s'] if d.get(f'{key}_step_s') else None, '.1f'):>8} "
                         f"{fmt(None if mfu is None else 100 * mfu, '.1f') + ('%' if mfu is not None else ''):>6} "
                         f"{fmt(d.get(f'{key}_peak_mb'), ',.0f'):>8}")
        lines.append(f"{label:<9} 8 heads / next-byte: time {fmt(d.get('time_ratio'))} "
                     f"({fmt(d.get('time_ratio_min'))}-{fmt(d.get('time_ratio_max'))}"
                     f"{', noisy' if d.get('time_ratio_noisy') else ''}), memory {fmt(d.get('memory_ratio'))}; "
                     f"{d['preset']}, batch {d['batch_size']} x {d['seq_len']}, device {d['device']}")
    return lines


def main() -> int:
    args = arguments(__doc__.splitlines()[0], extra=options)
    p = Part("train", args)
    if p.install_wheels().status == "FAIL":
        return p.finish()
    results = run(p)
    return p.finish(table=table(results) + ["", *outcome_table(p.outcomes)], runs=results)


if __name__ == "__main__":
    sys.exit(main())
