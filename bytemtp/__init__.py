"""bytemtp: byte-level language models trained with multi-token prediction.

The library is importable without side effects. Modules, lowest layer first:
`config` and `vocab` (no torch), `model`, `loss`, `step`, `checkpoint`, `bench`.
The command line lives in the separate package `bytemtp_cli`.
"""

__version__ = "0.1.0"
