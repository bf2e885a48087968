"""Floor 2, the model: the byte transformer with its prediction heads (`model`), the decoding
cache (`kvcache`), the attention layout of a pass and its one builder (`layout`), the multi-token
loss (`loss`) and the arithmetic of a step (`flops`). Pure single-device PyTorch: no data,
checkpoints or processes.
"""
