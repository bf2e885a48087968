"""Floor 2, the model: the byte transformer with its prediction heads (`model`), what a decoding
pass runs after the trunk (`pass_heads`: one interface over the heads stacked, one by one, or head 1
and the draft heads of `draft`), the decoding cache (`kvcache`), the attention layout of a pass and its one builder (`layout`), the multi-token
loss (`loss`) and the arithmetic of a step (`flops`). Pure single-device PyTorch: no data,
checkpoints or processes.

Head types are the model's, described by `bytemtp.config.HeadType` (torch-free, on floor 0, since
the configuration's layer accounting needs it; `ModelConfig.head` is the type of a config): its
layers, whether its heads stack or skip, what a head reads and which cache layers a pass writes
(`ByteMTP.cache_layers`, `ByteMTP.layers_written`). The model, the training step and the compiled
decoding step ask the type, never compare its name. To add a head type: one `HeadType` subclass in
`bytemtp.config`, listed in `HEAD_TYPES`, plus its tests (tests/test_heads.py: its layer count,
whether it stacks and skips, and the cache layers a real pass writes; and its name in the
parametrised model, step and decoding tests). A head built of transformer blocks or one linear map
(`layered`) needs nothing here; one made of something else adds its module to `model.Head` and,
if it stacks, to `pass_heads.StackedHeads`. The exported remote code repeats the table
(`interop/remote_code/configuration_bytemtp.HEAD_TYPES`), since it may not import bytemtp.
"""
