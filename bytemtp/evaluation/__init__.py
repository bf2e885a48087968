"""Floor 5, evaluation: bits per byte and acceptance of every head, as typed results
(`evaluate`), byte log-likelihoods (`likelihood`), the synthetic tasks (`tasks`), HumanEval
(`humaneval`, its records in `humaneval_records`) and the isolated execution of model-written
programs (`execution`, with `guard` run inside the child).
"""
