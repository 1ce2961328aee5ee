"""`python -m prompt_jax.t5x gin_dir`: the directory to give t5x as --gin_search_paths (it holds
prompt_jax's gin files: t5x/models, t5x/prompts, t5x/runs and the method files they include)."""
import sys

from prompt_jax import paths


def main(argv) -> int:
  if argv[1:] != ["gin_dir"]:
    print("usage: python -m prompt_jax.t5x gin_dir", file=sys.stderr)
    return 2
  print(paths.gin_dir())
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
