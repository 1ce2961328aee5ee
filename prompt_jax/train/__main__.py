"""`python -m prompt_jax.train ...` == `prompt-jax train ...` (as t5x's `python -m t5x.train`)."""
import sys

from prompt_jax import cli

if __name__ == "__main__":
  sys.exit(cli.main(["train"] + sys.argv[1:]))
