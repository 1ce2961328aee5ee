"""Inference evaluation: seqio.Evaluator driven by decoding (greedy, beam) or rank classification."""
