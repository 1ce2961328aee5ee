"""`python -m prompt_jax <command> ...` == `prompt-jax <command> ...`."""
import sys

from prompt_jax import cli

if __name__ == "__main__":
  sys.exit(cli.console_main())
