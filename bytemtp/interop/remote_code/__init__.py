"""The code of a Hugging Face `transformers` export, loaded with `trust_remote_code=True`.

`bytemtp export --format hf` (bytemtp.interop.export) copies these files into the exported folder beside the
weights: `configuration_bytemtp` (the config class), `modeling_bytemtp` (the model), and
`tokenization_bytemtp` (the byte tokenizer). They import only torch, transformers and the
standard library, never bytemtp, so a folder loads where bytemtp is not installed; this package
itself imports nothing, so bytemtp needs transformers only for loading a folder, not for writing one.
"""

FILES = ("configuration_bytemtp.py", "modeling_bytemtp.py", "tokenization_bytemtp.py")
