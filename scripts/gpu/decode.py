"""GPU check, part (b): decoding speed of the carried tuned `small` model.

    python3 scripts/gpu/decode.py [--out DIR] [--carry .gpu] [--budget 450] [--dry-run]

`bench decode` on the carried model (prepare.py's .gpu/model) over the carried held-out code
prompts (.gpu/prompts.jsonl, `--prompts`), at batch 1, 8 and 16: plain against the heads alone
(auto) and the default (auto+lookup), greedy and sampled at temperature 0.8, on the compiled step
(CUDA graphs; the first case's compile time is reported) and eager, in bf16, and float32 compiled
greedy. Cases run in that order while the part's time budget lasts; those left over are SKIP.
One table row a case, batch size and mode (plain B/s, speedups, bytes per pass, a plain pass in ms,
host transfers a pass and the share of time outside the step where bench decode reports them), each
case with the model's bits/byte and the decoded text's repetition; every case's JSON in
$OUT/decode.json, the commands' output in $OUT/decode.log.
"""

from __future__ import annotations

import sys
import time

from part import Outcome, Part, arguments, fmt, outcome_table, point_run_at_corpus, read_json

# (label, --compile, --dtype, --temperature, batch sizes): the headline first
CASES = [("bf16 compiled greedy", "on", "bfloat16", 0.0, "1,8,16"),
         ("bf16 compiled t0.8", "on", "bfloat16", 0.8, "1,8,16"),
         ("bf16 eager greedy", "off", "bfloat16", 0.0, "1,8,16"),
         ("bf16 eager t0.8", "off", "bfloat16", 0.8, "1,8,16"),
         ("fp32 compiled greedy", "on", "float32", 0.0, "1,16")]
NEW_FIELDS = ("host_transfers_per_pass", "outside_step_share")  # printed where bench decode writes them


def options(parser) -> None:
    parser.add_argument("--budget", type=float, default=450, help="seconds for all cases (default 450)")
    parser.add_argument("--n-prompts", type=int, default=16)
    parser.add_argument("--max-bytes", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)


def run_cases(p: Part, model: str, prompts: str) -> dict[str, dict]:
    """Each case's `bench decode` while the budget lasts; the JSON of those that ran."""
    a, dry, results = p.args, p.args.dry_run, {}
    n_prompts, max_bytes, rounds = (2, 8, 1) if dry else (a.n_prompts, a.max_bytes, a.rounds)
    deadline = p.t0 + a.budget
    for label, compile_mode, dtype, temperature, sizes in CASES:
        left = deadline - time.perf_counter()
        if left < 30:
            p.skip(label, f"the part's budget of {a.budget:.0f} s is spent")
            continue
        if dry and len(p.outcomes) > 2:  # wheels, one greedy case, one sampled
            p.skip(label, "dry run: the commands above with another --compile or --dtype")
            continue
        if dry:  # compiling takes minutes on a CPU, bf16 is slow there: eager, float32, tiny
            compile_mode, dtype, sizes = "off", "float32", "1,2"
        json_path = p.work / f"decode-{len(results)}.json"
        sampling = ["--temperature", str(temperature), "--top-p", "0.95", "--seed", "1"] if temperature else []
        modes = "auto,auto+lookup" if not temperature else "auto"  # prompt lookup drafts greedy rows only
        outcome = p.bytemtp(label, "bench", "decode", "--ckpt", model, "--prompts", prompts,
                            "--n-prompts", str(n_prompts), "--max-bytes", str(max_bytes), "--batch-sizes", sizes,
                            "--draft", modes, "--rounds", str(rounds), "--compile", compile_mode,
                            "--device", p.device, "--dtype", dtype, *sampling, "--json", str(json_path),
                            timeout=min(left, 300))
        data = read_json(json_path) if outcome.status == "PASS" else None
        if data is not None:
            results[label] = data
            outcome.figures = {"val_bpb": data.get("val_bpb"), "compile": data.get("compile"),
                               "compile_stats": data.get("compile_stats")}
    return results


def table(results: dict[str, dict]) -> list[str]:
    """One line a case, batch size and mode; each case's header line gives bits/byte, repetition
    and (compiled) what compiling took."""
    lines = []
    head = (f"{'B':>3}  {'mode':<12} {'plain B/s':>10} {'speedup':>8} {'vs eager':>8} {'B/pass':>7} "
            f"{'plain ms':>8} {'transfers':>9} {'outside':>7} {'identical':>9}  repetition (8-grams, zstd x)")
    for label, d in results.items():
        stats = d.get("compile_stats") or {}
        compile_s = next((stats[k] for k in ("compile_s", "first_compile_s", "seconds") if k in stats), None)
        lines += ["", f"{label}: compile {d['compile']}, {d['dtype']}, val bits/byte {fmt(d.get('val_bpb'), '.3f')}, "
                      f"{d['prompts']} prompts x {d['max_bytes']} bytes"
                      + (f", compiling took {fmt(compile_s, '.1f')} s" if d["compile"] == "on" else ""),
                  head, "-" * len(head)]
        for c in d["cases"]:
            plain_ms = 1000 * c["batch_size"] / c["plain_bytes_s"] if c.get("plain_bytes_s") else None
            rep = c.get("repetition", {}).get("decoded", {})
            new = [fmt(c.get(k), ".2f") for k in NEW_FIELDS]
            lines.append(f"{c['batch_size']:>3}  {c['mode']:<12} {fmt(c.get('plain_bytes_s'), '.0f'):>10} "
                         f"{fmt(c.get('speedup')):>8} {fmt(c.get('eager_speedup')):>8} "
                         f"{fmt(c.get('bytes_per_forward')):>7} {fmt(plain_ms):>8} {new[0]:>9} {new[1]:>7} "
                         f"{'yes' if c.get('identical') else 'no':>9}  "
                         f"{fmt(rep.get('distinct_8grams'))}, {fmt(rep.get('zstd_ratio'))}")
    return lines


def main() -> int:
    args = arguments(__doc__.splitlines()[0], extra=options)
    p = Part("decode", args)
    model, prompts, corpus = p.carry / "model", p.carry / "prompts.jsonl", p.carry / "corpus"
    if p.install_wheels().status == "FAIL":
        return p.finish()
    missing = [str(x) for x in (model, prompts, corpus) if not x.exists()]
    if missing:
        p.skip("bench decode", f"not carried: {', '.join(missing)} (run scripts/gpu/prepare.py, make gpu-prep)")
        return p.finish() or 1
    damaged = point_run_at_corpus(model, corpus)
    if damaged:
        p.record(Outcome("bench decode", "FAIL", 0.0, note=damaged))
        return p.finish()
    results = run_cases(p, str(model), str(prompts))
    lines = table(results) + ["", *outcome_table(p.outcomes)]
    return p.finish(table=lines, cases=results)


if __name__ == "__main__":
    sys.exit(main())
