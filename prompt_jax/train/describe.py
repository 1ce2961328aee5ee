"""`prompt-jax describe`: trainable parameters of a gin config, from abstract shapes only."""
from typing import Optional

import gin
import numpy as np

from prompt_jax import run_setup
from prompt_jax import trees

_SHAPE_LENGTHS = {"inputs": 8, "targets": 4}  # parameter shapes do not depend on lengths


@gin.configurable(module="prompt_jax")
def describe(model: Optional[run_setup.ModelSpec] = None, print_fn=print) -> dict:
  """Prints each trainable parameter (path, shape, count), the trainable and frozen totals."""
  model = model or run_setup.model_spec()
  boxed = run_setup.abstract_variables(run_setup.build_model(model.config, model.prompt),
                                       _SHAPE_LENGTHS)
  flat = trees.flatten(trees.unbox(boxed))
  trainable = {k: v.shape for k, v in flat.items() if trees.is_trainable(k, model.trainable_regex)}
  frozen = {k: v.shape for k, v in flat.items() if k not in trainable}
  n_trainable = sum(int(np.prod(s)) for s in trainable.values())
  n_frozen = sum(int(np.prod(s)) for s in frozen.values())
  print_fn(f"TRAINABLE_REGEX {model.trainable_regex!r}")
  for path, shape in sorted(trainable.items()):
    print_fn(f"  {path:<60} {str(tuple(shape)):<20} {int(np.prod(shape)):>15,}")
  print_fn(f"trainable parameters: {n_trainable:,}")
  print_fn(f"frozen parameters:    {n_frozen:,}")
  total = n_trainable + n_frozen
  print_fn(f"trainable fraction:   {n_trainable / max(total, 1):.6%}")
  return {"trainable": n_trainable, "frozen": n_frozen,
          "parameters": {k: tuple(v) for k, v in trainable.items()}}
