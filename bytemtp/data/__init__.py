"""Floor 1, data: corpora as users have them (`corpus`: finding files; `compression`: strict zstd,
gzip and plain files; `readers`: the file formats, one reader class each with its resume position),
the prepared-shard format (`shards`), what a corpus holds by split (`splits`: held-out text,
prompts), preparing a corpus (`prep`: dedup, split, bad-record policy)
and the stateful streaming loader that packs documents into windows (`loader`, its document
stream in `stream`). No torch model here.
"""
