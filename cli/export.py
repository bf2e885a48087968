"""`bytemtp export`: a checkpoint in another tool's format (a Hugging Face `transformers` folder)."""

from __future__ import annotations

import click


@click.command("export")
@click.option("--format", "fmt", type=click.Choice(["hf"]), default="hf", show_default=True,
              help="hf: a Hugging Face transformers folder (AutoModelForCausalLM with trust_remote_code).")
@click.option("--ckpt", required=True, help="A run directory (its newest checkpoint) or a checkpoint.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="The folder to write.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default=None,
              help="Dtype of the exported weights.  [default: the saved one]")
@click.option("--force", is_flag=True, help="Replace an existing non-empty --out folder.")
def export_cmd(fmt: str, ckpt: str, out: str, dtype: str | None, force: bool) -> None:
    """Write a checkpoint as a Hugging Face transformers folder: weights under bytemtp's own names
    (every head kept), the model and byte tokenizer code, and a model card.

    transformers loads it with trust_remote_code=True (forward gives the next-byte head's logits;
    future_logits all heads'); bytemtp loads it back as a checkpoint (--ckpt FOLDER), for
    self-speculative decoding. Writing needs no transformers.
    """
    from bytemtp.interop.export import export_hf
    from bytemtp.runtime.checkpoint import describe

    try:
        folder = export_hf(ckpt, out, dtype=dtype, overwrite=force)
    except ValueError as e:  # CheckpointError is one: a user's error, one line
        raise click.ClickException(str(e)) from None
    info = describe(folder)
    click.echo(f"wrote {folder}: {info['params']:,} parameters, {sum(info['files'].values()) / 1e6:,.1f} MB "
               f"in {len(info['files'])} files; load it with")
    for cls, name in (("AutoModelForCausalLM", "model"), ("AutoTokenizer", "tokenizer")):
        click.echo(f"  {name} = transformers.{cls}.from_pretrained({str(folder)!r}, trust_remote_code=True)")
