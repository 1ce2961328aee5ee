"""prompt_jax under t5x's own binaries (`python -m t5x.train / t5x.eval / t5x.infer`).

The only part of prompt_jax that imports t5x. t5x is not on PyPI: install it from its repository
(or put its sources on PYTHONPATH) and prompt_jax's extra `t5x` for the packages it needs:

  pip install -e ".[t5x]"
  pip install "t5x @ git+https://github.com/google-research/t5x"

  python -m t5x.train --gin_search_paths=$(python -m prompt_jax.t5x gin_dir) \
    --gin_file=t5x/runs/embedded_default.gin --gin.MODEL_DIR="'/tmp/t5x_default'"

  network.py     the frozen T5 + a prompt method as the Flax module t5x's EncoderDecoderModel
                 calls (our `models.T5`: t5x's call signature, `encode` / `decode` and its cache)
  models.py      `PromptEncoderDecoderModel`: t5x's EncoderDecoderModel whose initial variables
                 carry t5x's `params_axes` (our parameters carry flax logical-axis boxes instead)
  optim.py       what trains (the method's trainable regex) for t5x's MultiOptimizer (and a
                 MultiOptimizer whose checkpoints t5x can resume from), and the prompt
                 parameters' logical axis rules
The gin files live in gin/t5x/ (models/, prompts/, runs/), in t5x's layout.
"""
INSTALL_HINT = (
    "prompt_jax.t5x needs t5x, which is not on PyPI: pip install -e \".[t5x]\" (fiddle, "
    "jaxtyping, chex, cached_property) and then t5x from its repository: "
    "pip install \"t5x @ git+https://github.com/google-research/t5x\" (or put its sources on "
    "PYTHONPATH)")


def require_t5x() -> None:
  """The install hint as an ImportError when t5x cannot be imported; then registers prompt_jax's
  gin configurables (`register`). Called on import by the modules gin/t5x files import
  (models.py, network.py, optim.py); `python -m prompt_jax.t5x gin_dir` imports none of them, so
  it needs nothing of t5x and starts no TensorFlow."""
  try:
    import t5x  # pylint: disable=g-import-not-at-top,unused-import,redefined-outer-name
    from t5x import models as _t5x_models  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:  # t5x or one of the packages it imports is missing
    raise ImportError(f"{INSTALL_HINT} ({e})") from None
  register()


def register() -> None:
  """Imports what registers the gin configurables prompt_jax's own gin files name (methods,
  initialisers, the backbone, the shipped checkpoint, `prompt_jax.train.optimizer` in method
  files) and prompt_jax's seqio tasks: t5x imports MIXTURE_OR_TASK_MODULE after parsing gin and
  refuses a module that registers gin configurables then, so they register here, before."""
  # pylint: disable=g-import-not-at-top,unused-import
  import prompt_jax.embedded
  import prompt_jax.embedded.task
  import prompt_jax.run_setup
  import prompt_jax.tasks
  import prompt_jax.train.loop


__all__ = ["INSTALL_HINT", "PromptEncoderDecoderModel", "prompt_network", "logical_axis_rules",
           "trainable_traversal"]
_WHERE = {"PromptEncoderDecoderModel": "models", "prompt_network": "network",
          "logical_axis_rules": "optim", "trainable_traversal": "optim"}


def __getattr__(name):  # `from prompt_jax.t5x import PromptEncoderDecoderModel` (or the hint)
  if name in _WHERE:
    import importlib  # pylint: disable=g-import-not-at-top
    require_t5x()
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
