"""`python -m prompt_jax.evaluation ...` == `prompt-jax eval ...` (t5x's `python -m t5x.eval`)."""
import sys

from prompt_jax import cli

if __name__ == "__main__":
  sys.exit(cli.main(["eval"] + sys.argv[1:]))
