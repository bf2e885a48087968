"""Floor 3, where a model runs: devices and RNG state (`devices`), checkpoints on disk
(`checkpoint`), and many processes under torchrun (`distributed`: DDP or FSDP2 applied from
outside the model).
"""
