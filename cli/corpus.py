"""`bytemtp prep` and `bytemtp verify`: a corpus prepared (deduplicated, split, written as shards) and
a prepared corpus checked document by document against its manifest."""

from __future__ import annotations

import sys

import click


@click.command("prep")
@click.argument("sources", nargs=-1, required=True)
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="New corpus directory, e.g. data/corpus/NAME.")
@click.option("--field", default="text", show_default=True, help="JSON field holding the text.")
@click.option("--val-fraction", default=0.01, show_default=True, type=click.FloatRange(0, 1),
              help="The default split: this fraction of the documents goes to val, chosen by a hash of each.")
@click.option("--val", "val", multiple=True, metavar="PATH",
              help="Val inputs (file, folder, glob or prepared corpus; repeatable): they go to val whole, every "
                   "other input to train, with no hash split. --include/--exclude do not apply to them.")
@click.option("--val-tail", default=None, metavar="F", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="Split by bytes: the last F of each document goes to val as a document of its own, the rest "
                   "to train (0.1 on one file is nanoGPT's 90%/10% split).")
@click.option("--level", default=10, show_default=True, type=click.IntRange(1, 22),
              help="zstd compression level.")
@click.option("--include", multiple=True, metavar="GLOB",
              help="Only files whose path below a source directory matches (repeatable).")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Skip files that match (repeatable).")
@click.option("--name", "source_name", default=None, help="Source name for the manifest.")
@click.option("--licence", default="unknown", show_default=True, help="Licence for the manifest.")
@click.option("--max-bad-fraction", default=0.01, show_default=True, type=click.FloatRange(0, 1),
              help="Abort when more than this fraction of records is unusable.")
@click.option("--workers", default=None, type=click.IntRange(1), metavar="N",
              help="Cores to use: N threads compress, and from 5 workers on one process for every 4 reads and "
                   "parses the inputs  [default: the cores there are]. The corpus is the same, byte for byte, "
                   "for every N.")
@click.option("--part", default=None, metavar="I/N",
              help="Prepare part I of N (0 <= I < N) of the documents, chosen by a hash of each, as one of N "
                   "independent jobs (a Slurm array, say); join the N parts with --merge.")
@click.option("--merge", is_flag=True,
              help="SOURCES are the N parts of one `prep --part I/N`: join them into --out without compressing "
                   "again. The options that choose documents and the split come from the parts.")
def prep_cmd(sources: tuple[str, ...], out: str, field: str, val_fraction: float, val: tuple[str, ...],
             val_tail: float | None, level: int, include: tuple[str, ...], exclude: tuple[str, ...],
             source_name: str | None, licence: str, max_bad_fraction: float, workers: int | None,
             part: str | None, merge: bool) -> None:
    """Prepare a corpus: deduplicate, split train/val, write shards of the documents' exact bytes
    (any bytes: raw files are documents as they are) in 1 MiB zstd frames with an index.

    The split is one of: by hash (--val-fraction, the default), the --val inputs, or --val-tail.
    With --part I/N, N jobs each prepare one part; `prep --merge PART... --out CORPUS` joins them."""
    import os

    from tqdm import tqdm

    from bytemtp.data import corpus, intake, prep

    if merge:
        _merge(sources, out)
        return
    readers, threads = intake.plan(workers or len(os.sched_getaffinity(0)))
    try:
        part = intake.Part.parse(part) if part is not None else None
    except ValueError as e:
        raise click.BadParameter(str(e).removeprefix(f"--part {part!r} "), param_hint="--part") from None

    given = click.get_current_context().get_parameter_source("val_fraction") != click.core.ParameterSource.DEFAULT
    split = dict(val_fraction=val_fraction if given else None, val=list(val) or None, val_tail=val_tail)
    prep.split_record(**split)  # a conflict is one line before any file is read
    files = corpus.select_files(corpus.corpus_files(list(sources), split=None), include=include,
                                exclude=exclude)
    total = sum(f.stat().st_size for f in [*files, *(prep.val_files(list(val), inputs=files) if val else [])])
    with tqdm(total=total, desc="prep", unit="B", unit_scale=True) as bar:
        def progress(bytes_read: int, docs: int) -> None:
            bar.update(min(bytes_read, total) - bar.n)  # tqdm redraws at most every 0.1 s
            bar.set_postfix_str(f"{docs:,} docs", refresh=False)

        manifest = prep.prepare(files, out, field=field, **split, level=level,
                                source_name=source_name or " ".join(sources), licence=licence,
                                progress=progress, max_bad_fraction=max_bad_fraction, readers=readers,
                                threads=threads, part=part,
                                say=lambda text: tqdm.write(text, file=sys.stderr))
    click.echo(f"wrote {out}" + (f", part {part.index}/{part.of}: join the {part.of} parts with `bytemtp prep "
                                 f"--merge PART... --out CORPUS`" if part else ""))
    click.echo(corpus.corpus_table(manifest))


def _merge(parts: tuple[str, ...], out: str) -> None:
    """`prep --merge`: the options that choose documents must not be given (they come from the parts)."""
    from tqdm import tqdm

    from bytemtp.data import merge
    from bytemtp.data.corpus import corpus_table

    context = click.get_current_context()
    given = [param.opts[0] for param in context.command.params
             if param.name not in ("sources", "out", "merge")
             and context.get_parameter_source(param.name) != click.core.ParameterSource.DEFAULT]
    if given:
        raise click.UsageError(f"--merge joins parts as they were prepared, so {', '.join(given)} cannot be given "
                               f"with it; give them to each `bytemtp prep --part I/N`")
    parts = merge.read_parts(list(parts))
    total = sum(split["bytes"] for _, manifest in parts for split in manifest["splits"].values())
    with tqdm(total=total, desc="merge", unit="B", unit_scale=True) as bar:
        manifest = merge.merge([folder for folder, _ in parts], out, progress=bar.update,
                               say=lambda text: tqdm.write(text, file=sys.stderr))
    click.echo(f"wrote {out} from {len(parts)} parts")
    click.echo(corpus_table(manifest))


@click.command("verify")
@click.argument("corpus")
@click.option("--field", default="text", show_default=True,
              help="JSON field or table column holding the text (a corpus that is not prepared).")
def verify_cmd(corpus: str, field: str) -> None:
    """Check every document of a prepared corpus against its manifest (sha256 per shard and split),
    and every shard's size and index: one line and exit status 0 when it is intact, 1 when not.

    Loading a corpus already checks the shards' sizes and indexes (cheap: nothing is decoded);
    this reads everything. Any other corpus (files, folders, globs: JSONL, Parquet, Arrow, ...) is
    read document by document through its files' readers: one line with what they hold, or the one
    line naming the file (and row group) that cannot be read. A prepared corpus whose manifest.json
    is gone is refused: there is no record left to check its shards against.
    """
    import os

    from tqdm import tqdm

    from bytemtp.data import integrity, shards
    from bytemtp.data.corpus import describe

    try:
        prepared = (shards.corpus_dir(corpus) / shards.MANIFEST).is_file()
        if not prepared and (os.path.exists(corpus) or any(c in corpus for c in "*?[")):
            integrity.refuse_lost_manifest(corpus)
            info = describe(corpus, field=field)
            skipped = ", ".join(f"{reason} {n:,}" for reason, n in info["skipped"].items() if n) or "none"
            click.echo(f"OK {corpus}: {info['documents']:,} documents ({info['bytes']:,} bytes) in {info['files']} "
                       f"file(s) read through their readers; skipped: {skipped}")
            return
        total = sum(split.get("bytes", 0) for split in shards.read_manifest(corpus)["splits"].values())
        with tqdm(total=total, desc="verify", unit="B", unit_scale=True, leave=False) as bar:
            res = integrity.verify(corpus, progress=bar.update)
    except ValueError as e:  # CorpusError is one: a user's error, one line
        raise click.ClickException(str(e)) from None
    note = ("" if res["per_shard"] else "; its manifest predates per-shard records (sizes, index and document "
            "digests), so shards were checked as a whole split: prepare it again to record them")
    click.echo(f"OK {corpus}: {res['documents']:,} documents ({res['bytes']:,} bytes) in {res['shards']} shard(s) "
               f"of {res['splits']} split(s) match the manifest's sha256{note}")
