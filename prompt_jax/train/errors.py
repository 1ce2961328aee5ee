"""One error type for bad run configurations: the CLI prints its message as one line."""


class ConfigError(ValueError):
  """A run configuration that cannot work (message names the macro/value and what is expected)."""
