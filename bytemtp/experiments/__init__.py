"""Floor 9, experiments: the benchmarks measured as ratios within one run (`bench`: the training
step, the loader, decoding, serving, all of them together), prep's speed on one core and on several
(`prep_bench`), a preset sized by measurement (`sweep`) and multi-token recipes against next-byte
training (`quality`, built on the sweep).
"""
