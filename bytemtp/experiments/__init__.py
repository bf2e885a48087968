"""Floor 9, experiments: the benchmarks measured as ratios within one run (`bench`: the training
step, the loader, decoding, serving, all of them together), prep's speed on one core and on several
(`prep_bench`), a preset sized by measurement (`sweep`) and multi-token recipes against next-byte
training (`quality`, built on the sweep). Each returns small frozen dataclasses that own their JSON
form (`to_json`, read back by `from_json`): the JSON that the `bench` commands write and that a
resumed sweep reads back, unchanged from when these results were string-keyed dicts.
"""
