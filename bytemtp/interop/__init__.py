"""Floor 7, interoperability: the lm-evaluation-harness model (`harness`), the Hugging Face
export (`export`) and the code that export ships (`remote_code`, which imports nothing from
bytemtp).
"""
