"""bytemtp: byte-level language models trained with multi-token prediction.

The library is importable without side effects. Its floors, lowest first; a module imports only
from its own floor's package or from lower floors (tests/test_layering.py keeps it so):

    0  config, config_docs, vocab, spread, tables
                         frozen configuration, head types and presets, their docs; byte ids and UTF-8
                         output, and the BPE baseline's vocabulary; a figure's spread over its runs and
                         the text tables results render (no torch)
    1  config_io         configurations in and out: dicts, JSON, files, overrides (no torch)
       data/             corpus files, prepared shards, prep, the streaming loader
    2  model/            the byte transformer and its heads, KV cache and layout, loss, flops
    3  runtime/          devices, checkpoints, torchrun processes (DDP, FSDP2)
    4  decoding/         draft strategy, sampling, drafting, compiled step, pass costs, the pass cycle,
                         decoding, speed,
                         the repetition of decoded text
    5  evaluation/       bits per byte, likelihoods, synthetic tasks, HumanEval, sandboxed execution
    6  training/         the step, rollouts, optimizer and schedule, run directories, the training loop, plots
    7  interop/          lm-evaluation-harness model, Hugging Face export and its remote code
    8  serving/          continuous batching of requests, the OpenAI-compatible HTTP server
    9  experiments/      every benchmark, prep's speed, a preset sized by measurement (the sweep), and
                         multi-token recipes against next-byte training at equal wall time and over seeds

The command line lives in the separate package `bytemtp_cli`.
"""

__version__ = "0.1.0"
