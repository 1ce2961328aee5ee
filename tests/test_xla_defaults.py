"""prompt_jax/xla_defaults.py: the XLA flags prompt-jax sets, never over the user's own."""
import numpy as np

from prompt_jax import xla_defaults
from tests.train import common

SCHEDULER = "--xla_cpu_enable_concurrency_optimized_scheduler"


def test_defaults_are_added_and_never_override_the_user():
  env = {}
  assert xla_defaults.apply(env) == f"{SCHEDULER}=false" == env["XLA_FLAGS"]
  env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
  assert xla_defaults.apply(env).split() == ["--xla_force_host_platform_device_count=4",
                                             f"{SCHEDULER}=false"]
  env = {"XLA_FLAGS": f"{SCHEDULER}=true --xla_cpu_use_onednn=true"}  # the user's choice wins
  assert xla_defaults.apply(env) == f"{SCHEDULER}=true --xla_cpu_use_onednn=true"
  assert xla_defaults.apply(env) == env["XLA_FLAGS"]  # idempotent
  assert xla_defaults.merge(f"{SCHEDULER}=false --a=1", f"{SCHEDULER}=true").split() == [
      "--a=1", f"{SCHEDULER}=true"]


def test_the_scheduler_changes_no_number(tmp_path):
  """The memory-minimising schedule orders the same operations: 3 train steps (1 x 4 mesh, so
  collectives are scheduled too) give bitwise the prompt of XLA's default schedule. Bitwise on
  purpose: scheduling runs after fusion and chooses only the order of the same instructions
  (no re-association), so any difference would be a change of arithmetic by a flag that must
  not change any."""
  prompts = {}
  for value in ("false", "true"):  # prompt-jax's default; XLA's default, set by the user
    model_dir = str(tmp_path / value)
    proc = common.cli_subprocess(["train"] + common.flags(model_dir, 3), devices=4,
                                 env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4 "
                                                   f"{SCHEDULER}={value}"})
    assert proc.returncode == 0, proc.stdout[-3000:]
    prompts[value] = common.prompt_at(model_dir, 3)
  assert np.abs(prompts["false"]).max() > 0
  assert prompts["false"].tobytes() == prompts["true"].tobytes()
