"""The SGLang-compatible local engine: a small PyTorch/transformers model on the CPU."""
