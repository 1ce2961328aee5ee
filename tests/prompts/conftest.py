"""Prompt-method tests compile many tiny programs: let XLA skip most optimisations for them."""
import jax
import pytest


@pytest.fixture(autouse=True, scope="module")
def _fast_compiles():
  previous = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", True)
  yield
  jax.config.update("jax_disable_most_optimizations", previous)
