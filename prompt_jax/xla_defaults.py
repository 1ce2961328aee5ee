"""XLA flags `prompt-jax` sets for the user, unless their own XLA_FLAGS names the flag.

  --xla_cpu_enable_concurrency_optimized_scheduler=false
      XLA CPU's default schedule runs independent ops concurrently and keeps alive what they
      need. On a 2-core CPU, T5 1.1 small, batch 8 x 612, the float32 train step
      (`prompt-jax bench train_step`) then peaks at 4663 MB RSS and 7.35 s/step; with the
      memory-minimising scheduler, 2780 MB and 6.42 s/step (docs/benchmarks.md). A schedule
      orders the same operations, so the numbers computed do not change (tested). CPU only:
      GPU and TPU compilers ignore `xla_cpu_*` flags.

They must be in the environment before JAX starts its backend, and are inherited by the
processes a command starts (bench sides, plan on fake devices, local sweep jobs).
"""
import os
from typing import MutableMapping, Optional

DEFAULTS = ("--xla_cpu_enable_concurrency_optimized_scheduler=false",)


def _name(flag: str) -> str:
  return flag.split("=", 1)[0]


def merge(flags: str, extra: str) -> str:
  """`flags` with each flag of `extra` added, replacing a flag of the same name."""
  names = {_name(f) for f in extra.split()}
  return " ".join([f for f in flags.split() if _name(f) not in names] + extra.split())


def apply(environ: Optional[MutableMapping[str, str]] = None) -> str:
  """Adds each of DEFAULTS to environ['XLA_FLAGS'] (os.environ by default) unless a flag of that
  name is already there; returns the resulting XLA_FLAGS."""
  environ = os.environ if environ is None else environ
  flags = environ.get("XLA_FLAGS", "")
  present = {_name(f) for f in flags.split()}
  for flag in DEFAULTS:
    if _name(flag) not in present:
      flags = f"{flags} {flag}".strip()
  environ["XLA_FLAGS"] = flags
  return flags
