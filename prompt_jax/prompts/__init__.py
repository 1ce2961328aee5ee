"""Prompt methods behind one seam (see seam.py); gin specs of each method in specs.py."""
from prompt_jax.prompts.seam import Concat, Prompt, prompt_factory, PLACEMENTS
from prompt_jax.prompts.tuning import PromptTuning, uniform_init
from prompt_jax.prompts import specs  # registers the methods' gin configurables
