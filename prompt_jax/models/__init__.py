"""Frozen T5 backbones."""
from prompt_jax.models.config import PRESETS, T5Config, get_config
from prompt_jax.models.t5 import LayerContext, PromptContext, T5, float32_params
