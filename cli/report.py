"""What the commands print: tables, short text reports and their JSON.

A command's report goes to stdout, or to stderr when stdout carries its JSON (`--json -`);
`generate` keeps stdout for the generated text and reports on stderr. The benchmarks' results
render their own tables (`table()`), which the commands only print; the aligned-column `table` is
the library's (`bytemtp.tables`), as is the line on what compiling cost (`speed.compile_line`).
"""

from __future__ import annotations

import dataclasses
import json
import os

import click

from bytemtp.tables import table


def echo(text: str) -> None:
    """A command's report: on stdout, or on stderr when stdout carries its JSON (--json -)."""
    ctx = click.get_current_context(silent=True)
    click.echo(text, err=ctx is not None and ctx.params.get("json_path") == "-")


def write_json(path: str | None, data) -> None:
    """`data` as JSON, a typed result (or one inside it) in its JSON form (`to_json`)."""
    if path == "-":
        click.echo(json.dumps(data, indent=2, default=_json_form))
    elif path:
        with open(path, "w") as f:
            json.dump(data, f, indent=2, default=_json_form)
        echo(f"wrote {path}")


def _json_form(value):
    return value.to_json() if hasattr(value, "to_json") else str(value)


def split_line(manifest: dict) -> str:
    """How a prepared corpus was split, from its manifest's record."""
    split = manifest.get("split")
    if split is None:
        return "split: by document hash (not recorded: prepared before the manifest kept it)"
    if split["method"] == "inputs":
        return (f"split: val is {split.get('val_files', '?')} val input file(s) whole "
                f"({', '.join(split['val_inputs'])}), train every other input")
    if split["method"] == "tail":
        return f"split: the last {split['val_tail']:g} of each document's bytes to val, the rest to train"
    return f"split: by document hash, val fraction {split['val_fraction']:g}"


def corpus_table(manifest: dict) -> str:
    rows = []
    for name, split in manifest["splits"].items():
        ratio = split["bytes"] / split["compressed_bytes"] if split["compressed_bytes"] else 0.0
        rows.append((name, f"{split['documents']:,}", f"{split['bytes']:,}",
                     f"{split['compressed_bytes']:,}", f"{ratio:.2f}", len(split["shards"])))
    lines = [table(rows, ("split", "documents", "bytes", "compressed", "ratio", "shards")), split_line(manifest)]
    skipped = {k: v for k, v in manifest.get("skipped", {}).items() if v}
    lines.append(f"duplicates removed: {manifest.get('duplicates', 0):,}; skipped: "
                 + (", ".join(f"{k} {v:,}" for k, v in sorted(skipped.items())) or "none"))
    if all("shard_files" in split for split in manifest["splits"].values()):
        lines.append("integrity: each shard's size and index sha256 recorded (checked whenever the corpus is "
                     "opened); bytemtp verify checks every document")
    else:
        lines.append("integrity: no per-shard record (prepared before it was kept), so opening the corpus checks "
                     "nothing; bytemtp verify checks its splits' documents, and prep again records it")
    return "\n".join(lines)


def model_line(m, params: int) -> str:
    """One line that says what a model is."""
    drafts = f" + {m.n_future - 1} {m.draft} draft heads" if m.drafts.heads else ""
    return (f"{params:,} parameters: {m.trunk_layers} trunk layers + {m.n_future} {m.head_type} heads{drafts}, "
            f"width {m.d_model}, context {m.seq_len}")


def train_header(cfg, run_dir, *, resume: bool) -> str:
    """Device, parameters, corpus and run directory; the full config goes to RUN/run-config.json."""
    import torch

    from bytemtp.model.flops import step_flops
    from bytemtp.model.model import ByteMTP
    from bytemtp.runtime.devices import autocast, resolve_device
    from bytemtp.training.runs import RUN_CONFIG

    with torch.device("meta"):
        model = ByteMTP(cfg.model)
    m, world = cfg.model, int(os.environ.get("WORLD_SIZE", "1"))
    device = resolve_device(cfg.train.device)
    step_bytes = cfg.data.batch_size * m.seq_len * cfg.train.grad_accum * world
    flops = step_flops(model, step_bytes, m.seq_len)
    rows = [("run", f"{os.path.abspath(run_dir)} ({'resumed' if resume else 'new'}; all settings in {RUN_CONFIG})"),
            ("corpus", cfg.data.path),
            ("model", model_line(m, model.num_params())),
            ("device", f"{device}" + (f" x {world} processes" if world > 1 else "") +
             (", bf16 autocast" if isinstance(autocast(device, cfg.train.precision), torch.autocast) else ", fp32")),
            ("batch", f"{step_bytes:,} bytes a step"),
            ("compute", compute_line(cfg.train, device, flops=flops, step_bytes=step_bytes, devices=world)),
            ("optim", optimizer_line(cfg.train))]
    return "\n".join(f"{name:8s} {value}" for name, value in rows)


def compute_line(tc, device, *, flops: float, step_bytes: int, devices: int) -> str:
    """Model FLOPs a step and a byte, the peak that MFU is a share of (where known), and whether
    the step is compiled (train.compile) and why. The progress line shows bytes/s (and MFU)."""
    from bytemtp.model.flops import peak_flops
    from bytemtp.training.step import compile_choice

    _, compiled = compile_choice(tc, device, flops_per_step=flops, bytes_per_step=step_bytes)
    peak = peak_flops(device, tc.peak_flops)
    mfu = (f"MFU of {devices} x {peak:.3g} FLOP/s" if peak else
           "no MFU (a peak unknown: set train.peak_flops)")
    return f"{flops:.3g} FLOP a step ({flops / step_bytes:,.0f} a byte), {mfu}; compile {compiled}"


def optimizer_line(tc) -> str:
    """The optimizer, its peak learning rates and the schedule's shape and length."""
    opt = (f"muon lr {tc.muon_lr:g} on the hidden matrices, adamw lr {tc.lr:g} on the rest" if tc.optimizer == "muon"
           else f"adamw lr {tc.lr:g}")
    shape = f"wsd (decay over the last {tc.decay_fraction:.0%})" if tc.schedule == "wsd" else tc.schedule
    if tc.schedule_steps:
        length = f"{tc.schedule_steps} steps"
    elif tc.steps or tc.max_bytes:
        length = f"{tc.steps} steps" if tc.steps else "the bytes budget"
        length += ", or the steps the time budget buys where fewer" if tc.max_time else ""
    elif tc.max_time:
        length = "the steps that the time budget buys (fitted)"
    else:
        length = "none: the peak after warmup"
    return f"{opt}; {tc.warmup_steps} warmup steps, then {shape} to {tc.min_lr_ratio:g} x the peak over {length}"


def stats_dict(st) -> dict:
    out = {"bytes": st.bytes_out, "forward_passes": st.forward_passes,
           "bytes_per_forward": round(st.bytes_per_forward, 3), "wall_s": round(st.wall_s, 4),
           "stopped_by": st.stopped_by}
    if getattr(st, "drafted", None):
        out["acceptance"] = [round(r, 4) for r in st.acceptance]
        out["heads_used"] = {str(k): n for k, n in sorted(st.heads_used.items())}
    if getattr(st, "lookup_passes", 0):
        out["lookup_passes"], out["lookup_bytes"] = st.lookup_passes, st.lookup_accepted
    return out


def stats_lines(st) -> str:
    return (f"{st.bytes_out} bytes in {st.forward_passes} forward passes ({st.bytes_per_forward:.2f} bytes/pass), "
            f"{st.wall_s:.2f} s, {st.bytes_out / max(st.wall_s, 1e-9):,.0f} bytes/s; stopped by {st.stopped_by}")


def repetition_line(rep: dict) -> str:
    """How repetitive the decoded text is (a `repetition.Repetition` in its JSON form): distinct
    8-grams and zstd ratio, beside the real continuation's and the ratio of the zstd ratios where
    the prompts had one."""
    def figures(f: dict) -> str:
        distinct = "-" if f["distinct_8grams"] is None else f"{f['distinct_8grams']:.2f}"
        ratio = "-" if f["zstd_ratio"] is None else f"{f['zstd_ratio']:.2f}x"
        return f"distinct 8-grams {distinct}, zstd ratio {ratio}"
    line = f"repetition, decoded text ({rep['decoded']['bytes']:,} bytes): {figures(rep['decoded'])}"
    if rep.get("real") is not None:
        line += f"; real continuation: {figures(rep['real'])}"
        if rep["zstd_ratio_over_real"] is not None:
            line += f"; decoded zstd ratio {rep['zstd_ratio_over_real']:.2f}x the real's"
    return line


def draft_summary(st, decoder) -> str:
    """What the decoder chose: heads per pass, the commonest draft shapes, acceptance per depth."""
    total = max(1, sum(st.heads_used.values()))
    heads = ", ".join(f"{k} ({100 * n / total:.0f}%)" for k, n in
                      sorted(st.heads_used.items(), key=lambda kv: -kv[1]))
    shapes = ", ".join(f"{s} ({100 * n / total:.0f}%)" for s, n in
                       sorted(st.shapes.items(), key=lambda kv: -kv[1])[:3])
    rates = " ".join(f"d{j + 1} {r:.2f}" for j, r in enumerate(st.acceptance) if st.drafted[j])
    lines = [f"heads run: {heads}; drafts: {shapes}", f"draft acceptance by depth: {rates or 'none drafted'}"]
    choice = decoder.last_choice
    if choice is not None and choice.speedup:
        lines.append(f"last plan: {choice.heads} heads, {choice.tree.describe()}, expected "
                     f"{choice.bytes_per_pass:.2f} bytes/pass and {choice.speedup:.2f}x plain")
    if st.lookup_passes:
        lines.append(f"prompt lookup drafted in {st.lookup_passes} passes ({100 * st.lookup_passes / total:.0f}%) "
                     f"and gave {st.lookup_accepted} bytes ({100 * st.lookup_accepted / max(1, st.bytes_out):.0f}%)")
    if st.slides:
        lines.append(f"the window slid {st.slides} times")
    return "\n".join(lines)


def comparison(res, mode: str) -> str:
    """`generate --compare` (a `speed.Comparison`): plain and speculative speeds, the speedup and
    its runs, identity, how repetitive the output is; on the compiled step also eager plain
    decoding and the speedups over it."""
    step = "compiled" if res.compiled else "eager"
    fig = res.figures
    lines = []
    if res.compiled:
        lines.append(f"plain greedy, eager:          {res.eager_plain_bytes_s:8,.0f} bytes/s, 1.00 bytes/pass")
    lines += [f"plain greedy, {step + ':':15s} {fig.plain_bytes_s:8,.0f} bytes/s, 1.00 bytes/pass",
              f"speculative, {mode:16s} {fig.spec_bytes_s:8,.0f} bytes/s, {fig.bytes_per_forward:.2f} bytes/pass",
              f"speedup {fig.speedup.mid:.2f}x over {step} plain "
              f"(runs: {', '.join(f'{r:.2f}' for r in fig.speedup.runs)}); "
              f"outputs identical: {'yes' if res.identical else 'NO'}",
              repetition_line(dataclasses.asdict(fig.repetition))]
    if res.compiled:
        lines.append(f"over eager plain: compiled plain {res.compiled_plain_speedup:.2f}x, speculative "
                     f"{res.eager_speedup:.2f}x")
        if res.compile_stats:
            lines.append(compile_line(res.compile_stats))
    if res.degenerate:
        lines.append(f"note: the output is one byte repeated ({res.output[:1]!r}): a degenerate "
                     "continuation says little about speed; try another prompt")
    return "\n".join(lines)


def compile_line(stats: dict) -> str:
    """`bytemtp.decoding.speed.compile_line`, imported when a command reports (the CLI starts
    without torch)."""
    from bytemtp.decoding.speed import compile_line as line

    return line(stats)


def eval_table(res) -> str:
    """Per head (of an `evaluate.EvalResult`): bits/byte and accuracy; per k: heads 2..k right
    about the text and in agreement with head 1, and the bytes per pass each predicts for a chain
    of k heads."""
    def by_k(key, k, spec):
        return format(getattr(res, key).get(k + 1, 1.0), spec) if k else "-"
    rows = [(f"h{k + 1}", f"{b:.3f}", f"{a:.3f}", by_k("acceptance", k, ".3f"), by_k("bytes_per_forward", k, ".2f"),
             by_k("agreement", k, ".3f"), by_k("agreed_bytes_per_forward", k, ".2f"))
            for k, (b, a) in enumerate(zip(res.bpb, res.accuracy))]
    return table(rows, ("head", "bits/byte", "accuracy", "2..k right", "bytes/pass", "2..k agree with h1",
                        "bytes/pass (agreed)"))


def tune_table(before, after) -> str:
    """Before and after a tune (`evaluate.DraftReport`s, before None when its source is gone):
    head 1's bits/byte (unchanged), how often heads 2..k all agree with head 1 (k = 2, 4, n), the
    bytes per pass that predicts, and the bytes per pass decoded."""
    n = len(after.bpb)
    ks = sorted({2, min(4, n), n})
    decoded = sorted(after.decoded_bytes_per_forward)
    header = ("heads", "h1 bits/byte", *(f"2..{k} agree" for k in ks), f"agreed bytes/pass ({n})",
              *(f"{name} bytes/pass" for name in decoded))

    def row(name, res):
        return (name, f"{res.bpb[0]:.4f}", *(f"{res.agreement[k]:.3f}" for k in ks),
                f"{res.agreed_bytes_per_forward[n]:.2f}",
                *(f"{res.decoded_bytes_per_forward[d]:.2f}" for d in decoded))

    rows = ([row("before", before)] if before else []) + [row("after", after)]
    where = f"{after.bytes:,} bytes of the {after.split} split"
    if decoded:
        where += f"; decoded: {after.prompts} held-out prompts, {after.max_bytes} bytes each, greedy"
    return where + "\n" + table(rows, header)


def decoded_line(dec) -> str:
    """`evaluate.HeldOutDecoding` in one line."""
    shapes = ", ".join(f"{name} {bpp:.2f}" for name, bpp in dec.bytes_per_forward.items())
    return (f"decoded: {dec.prompts} held-out prompts, {dec.max_bytes} greedy bytes each; "
            f"bytes per pass: {shapes}")


def task_table(header: str, sizes: dict, accuracy: dict, scores: dict, overall: float) -> str:
    rows = [(g, n, f"{accuracy[g]:.3f}", f"{scores[g]['byte_accuracy']:.3f}", f"{scores[g]['bpb']:.3f}")
            for g, n in sizes.items()] + [("all", sum(sizes.values()), f"{overall:.3f}", "", "")]
    return table(rows, (header, "problems", "exact match", "answer byte acc", "answer bits/byte"))


def checkpoint_report(info: dict) -> str:
    lines = [f"checkpoint  {info['checkpoint']}", f"step        {info['step']}",
             f"model       {model_line(info['config'].model, info['params'])}, "
             f"{info['config'].model.unembed} unembedding",
             f"vocabulary  {info['vocabulary']}",
             f"resumable   {'yes' if info['resumable'] else 'no (no optimizer.pt: inference only)'}",
             table([(name, f"{size:,}") for name, size in info["files"].items()], ("file", "bytes"))]
    extra = {k: v for k, v in info["train_state"].items() if k != "step" and not isinstance(v, (dict, list))}
    if extra:
        lines.append(table(sorted(extra.items()), ("train state", "value")))
    return "\n".join(lines)


class StageBars:
    """One tqdm bar per stage of a `progress(stage, done, total)` callback, each opened when its
    stage starts and the previous one closed (decode over problems, then execute over programs)."""

    def __init__(self, units: dict[str, str]):
        self.units, self.stage, self.bar = units, None, None

    def update(self, stage: str, done: int, total: int) -> None:
        from tqdm import tqdm

        if stage != self.stage:
            self.close()
            self.stage, self.bar = stage, tqdm(total=total, desc=stage, unit=self.units.get(stage, "it"))
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "StageBars":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def humaneval_report(res, *, source: str, ckpt: str, device: str, dtype: str) -> str:
    """`eval-task humaneval` (a `humaneval_records.HumanEvalRun`): pass@k, the verdicts' shares,
    decoding statistics and the context."""
    s, dec, check = res.settings, res.decoding, res.check
    n = check.problems
    how = "greedy" if s.temperature == 0 else f"temperature {s.temperature:g}, top-p {s.top_p:g}, seed {s.seed}"
    lines = [f"{n} problems of {source}, {s.samples} sample(s) each ({how}), "
             f"at most {s.max_bytes} bytes; {ckpt}, {device} {dtype}"]
    rows = [(k, f"{v:.4f}") for k, v in check.pass_at_k.items()]
    rows += [(verdict, f"{100 * share:.1f}% of {check.completions}") for verdict, share in check.shares.items()]
    lines.append(table(rows, ("score", "value")))
    rates = ", ".join(f"d{j + 1} {a:,}/{d:,}" for j, (a, d) in enumerate(zip(dec.accepted, dec.drafted)) if d)
    lines.append(f"decoding: {dec.bytes:,} bytes in {dec.forward_passes:,} forward passes "
                 f"({dec.bytes_per_forward:.2f} bytes/pass), {dec.bytes_per_s:,.0f} bytes/s; heads "
                 f"{s.heads}; drafts accepted/drafted by depth: {rates or 'none drafted'}")
    if res.comparison is not None:
        c = res.comparison
        lines.append(f"speedup over plain greedy decoding: {c.speedup.mid:.2f}x ({c.speedup.low:.2f}-"
                     f"{c.speedup.high:.2f} over {c.batches} batches, interleaved); outputs identical: "
                     f"{'yes' if c.identical else 'NO'}" + (f"\nnote: {c.note}" if c.note else ""))
    else:
        lines.append("speedup over plain decoding: not measured (--compare decodes plainly too); bytes/pass "
                     "is its upper bound")
    longer = sum(not t.prompt_fits for t in check.tasks)
    lines.append(f"context: {longer} of {n} prompts are longer than the model's {s.seq_len} bytes "
                 f"and {res.slid} of {check.completions} completions slid the window (the model saw "
                 "only the newest bytes)" if longer or res.slid else
                 f"context: every prompt fits the model's {s.seq_len} bytes")
    return "\n".join(lines)
