"""Floor 5, evaluation: bits per byte and acceptance of every head (`evaluate`), byte
log-likelihoods (`likelihood`), the synthetic tasks (`tasks`), HumanEval (`humaneval`) and the
isolated execution of model-written programs (`execution`, with `guard` run inside the child).
"""
