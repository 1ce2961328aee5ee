"""The embedded default: a tiny pretrained T5 and a synthetic task, both shipped with prompt_jax.

`prompt-jax train --gin_file=runs/embedded_default.gin --gin.MODEL_DIR="'/tmp/pj_default'"`
prompt-tunes the tiny model (launch/pretrain_embedded.py made it) on `embedded_last_letter`
fully offline. See task.py for the data and the instructions the model was pretrained on.
"""
import os

import gin

CHECKPOINT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoint")


@gin.configurable(module="prompt_jax")
def embedded_checkpoint_path() -> str:
  """The shipped tiny T5 checkpoint (t5x legacy layout)."""
  return CHECKPOINT_DIR
