"""Errors a user can act on: the CLI prints their message as one line and exits 2."""


class ConfigError(ValueError):
  """A run configuration that cannot work (message names the macro/value and what is expected)."""
