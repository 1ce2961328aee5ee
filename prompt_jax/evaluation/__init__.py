"""Inference evaluation: seqio.Evaluator driven by greedy decoding or rank classification."""
