"""`train` compiles its step on a background thread while the backbone is read (issue 11,
start-up): the step's first call then finds the program in jit's caches and compiles nothing.

The same tiny run with and without `compile_ahead` must compile the same number of programs
(jax.monitoring's backend-compile events): had the first call missed what the background thread
compiled, it would compile the step a second time. With it, exactly one of them ran on the
background thread; and the trained prompt is the same (the step runs `run_setup.step_model`).
"""
import json

import numpy as np

from tests.train import common

COUNTING_TRAIN = """
import json, sys, threading
import jax
from prompt_jax import cli
threads = []
def on_duration(event, duration, **kwargs):
  if event == "/jax/core/compile/backend_compile_duration":
    threads.append(threading.current_thread().name)
jax.monitoring.register_event_duration_secs_listener(on_duration)
code = cli.main(sys.argv[1:])
print("THREADS", json.dumps(threads))
sys.exit(code)
"""


def _run(model_dir: str, *extra: str) -> list:
  proc = common.cli_subprocess(["train"] + common.flags(model_dir, 2, *extra),
                               python_code=COUNTING_TRAIN,
                               env={"PROMPT_JAX_COMPILATION_CACHE": "off"})
  assert proc.returncode == 0, proc.stdout[-3000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith("THREADS ")][-1]
  return json.loads(line[len("THREADS "):])


def test_the_step_compiled_ahead_is_the_one_the_loop_runs(tmp_path):
  ahead = _run(str(tmp_path / "ahead"))
  after = _run(str(tmp_path / "after"), "--gin.prompt_jax.train.compile_ahead=False")
  assert ahead.count("prompt_jax-compile-ahead") == 1, ahead
  assert "prompt_jax-compile-ahead" not in after, after
  assert len(ahead) == len(after), (ahead, after)
  np.testing.assert_array_equal(common.prompt_at(str(tmp_path / "ahead"), 2),
                                common.prompt_at(str(tmp_path / "after"), 2))
