"""Prompt methods through the real trainer (`prompt_jax.train.loop.train`), not a test loop:
the frozen backbone stays bit-identical, only the method's parameters train and are exported."""
import os

import gin
import numpy as np
import pytest

from prompt_jax import checkpoints
from prompt_jax import cli
from prompt_jax import trees
from prompt_jax.embedded import CHECKPOINT_DIR
from prompt_jax.train import loop
from tests.train import common


@pytest.mark.parametrize("method,expected_prefixes,extra", [
    # prefix.gin prefixes the encoder and the decoder (Li & Liang, Section 4.1), the decoder's
    # cross-attention too (their code's use_cross_prefix).
    ("prefix", ("encoder/layer_prompts/", "decoder/layer_prompts/",
                "decoder/cross_layer_prompts/"), ()),
    # DPT's r = 10 exceeds min(P, H) for a 4-token prompt (a ConfigError): r = 2.
    ("dpt", ("encoder/prompt/prompt/a", "encoder/prompt/prompt/b"), ("--gin.DPT_RANK=2",)),
])
def test_method_trains_only_its_parameters_in_the_trainer(tmp_path, method, expected_prefixes,
                                                          extra):
  model_dir = str(tmp_path / method)
  # The method file first: it must still win over the run file (no include-order trap).
  rest, bindings = cli.split_gin_dot_flags(
      [f"--gin_file=prompts/{method}.gin"]
      + common.flags(model_dir, 3, "--gin.PROMPT_LENGTH=4", *extra))
  cli.parse_gin([a.split("=", 1)[1] for a in rest], bindings, [])
  try:
    _, run, state = loop.train(return_state=True)
  finally:
    gin.clear_config()
  trainable = trees.flatten(state.params)
  assert trainable and all(k.startswith(expected_prefixes) for k in trainable), list(trainable)
  _, restored = checkpoints.load(CHECKPOINT_DIR)
  restored = trees.flatten(restored)
  frozen = trees.flatten(run.frozen)
  assert set(frozen) == set(restored)
  for name, value in frozen.items():
    assert np.asarray(value).tobytes() == restored[name].tobytes(), name
  exported = lambda step: {
      f: np.load(os.path.join(model_dir, "numpy_checkpoints", f"checkpoint_{step}", f))
      for f in os.listdir(os.path.join(model_dir, "numpy_checkpoints", f"checkpoint_{step}"))}
  first, last = exported(1), exported(3)
  assert set(first) == {k.replace("/", ".") + ".npy" for k in trainable}
  assert any(not np.array_equal(first[f], last[f]) for f in first)
