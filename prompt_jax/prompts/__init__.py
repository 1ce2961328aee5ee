"""Prompt methods behind one seam (seam.py): each a Flax module here and a spec in specs/."""
from prompt_jax.prompts.seam import Concat, Method, Prompt, prompt_factory, PLACEMENTS
from prompt_jax.prompts.initializers import PromptInit, uniform_init
from prompt_jax.prompts.tuning import PromptTuning
from prompt_jax.prompts import specs  # registers the methods' gin configurables
