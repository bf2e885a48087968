"""Floor 4, decoding: generation results (`generation`), sampling and its lossless
verification (`sampling`), draft shapes and the cost-aware chooser (`drafting`), the compiled
static step (`compiled`), plain and self-speculative decoding (`decode`) and interleaved speed
measurements (`speed`).
"""
