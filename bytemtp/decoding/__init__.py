"""Floor 4, decoding: generation results (`generation`), sampling and its lossless
verification (`sampling`), the draft strategy as a typed value (`strategy`), draft shapes and the
cost-aware chooser (`drafting`), the compiled static step and the compile policy (`compiled`),
pass costs measured and calibrated (`calibration`), the state of a decoding call and which heads'
caches are complete (`batch`), the one owner of the pass cycle (`loop`), the steps of a pass and
plain and self-speculative decoding (`decode`), interleaved speed measurements with their
figures (`speed`) and how repetitive the text they were measured on is (`repetition`).
"""
