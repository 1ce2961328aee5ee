"""Prompt methods behind one seam (see seam.py)."""
from prompt_jax.prompts.seam import Prompt, prompt_factory, PLACEMENTS
from prompt_jax.prompts.tuning import PromptTuning, uniform_init
