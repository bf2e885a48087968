"""Floor 1, data: corpora as users have them (`corpus`: finding and decompressing files), the
prepared-shard format (`shards`), preparing a corpus (`prep`: dedup, split, bad-record policy) and
the stateful streaming loader that packs documents into windows (`loader`). No torch model here.
"""
