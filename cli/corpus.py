"""`bytemtp verify`: a prepared corpus checked document by document against its manifest."""

from __future__ import annotations

import click


@click.command("verify")
@click.argument("corpus")
def verify_cmd(corpus: str) -> None:
    """Check every document of a prepared corpus against its manifest (sha256 per shard and split),
    and every shard's size and index: one line and exit status 0 when it is intact, 1 when not.

    Loading a corpus already checks the shards' sizes and indexes (cheap: nothing is decoded);
    this reads everything.
    """
    from tqdm import tqdm

    from bytemtp.data import shards

    try:
        total = sum(split.get("bytes", 0) for split in shards.read_manifest(corpus)["splits"].values())
        with tqdm(total=total, desc="verify", unit="B", unit_scale=True, leave=False) as bar:
            res = shards.verify(corpus, progress=bar.update)
    except ValueError as e:  # CorpusError is one: a user's error, one line
        raise click.ClickException(str(e)) from None
    note = ("" if res["per_shard"] else "; its manifest predates per-shard records (sizes, index and document "
            "digests), so shards were checked as a whole split: prepare it again to record them")
    click.echo(f"OK {corpus}: {res['documents']:,} documents ({res['bytes']:,} bytes) in {res['shards']} shard(s) "
               f"of {res['splits']} split(s) match the manifest's sha256{note}")
