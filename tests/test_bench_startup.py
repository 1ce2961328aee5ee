"""`prompt-jax bench startup` (issue 11): the wait before the first step from a checkpoint, in a
fresh process with an empty compilation cache and again with that cache (no wall-time
assertions: the figures are reported, what they count is checked)."""
import os
import re
import tempfile

from prompt_jax import cli

_TINY = ["--num_layers=1", "--batch=2", "--inputs=16", "--targets=4", "--prompt_length=2"]


def _starts(out):
  """[(seconds, loaded, written)] of the first start and the restart lines."""
  return [(float(s), int(hit), int(wrote)) for s, hit, wrote in re.findall(
      r"first step ([0-9.]+) s after start .*; cache (\d+) loaded, (\d+) written\)", out)]


def test_restart_loads_every_program_from_the_cache_and_computes_the_same(
    tmp_path, monkeypatch, capsys):
  """The first start compiles and writes the cache, initialises the prompt and leaves a
  checkpoint in MODEL_DIR; the restart (a new process, the same checkpoint, cache and MODEL_DIR)
  resumes that state as `train` does: it compiles nothing new (every program's cache key is the
  same across processes: a step closing over a per-process constant would miss it) and loads
  fewer programs (no prompt init, no fresh optimizer state), and the program loaded from the
  cache computes, from the restored state, the loss the first start's next step computed,
  bitwise. The scratch folder (random checkpoint, cache, MODEL_DIR) is removed."""
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  # The user's own jax cache (which `train` would use) is neither read nor written: the first
  # start is cold whatever the user's earlier runs left there.
  users_cache = tmp_path.parent / f"{tmp_path.name}_users_cache"
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(users_cache))
  # min compile time 0: the tiny step compiles in well under jax's 1 s threshold.
  assert cli.main(["bench", "startup", *_TINY, "--cache_min_compile_secs=0"]) == 0
  out = capsys.readouterr().out
  assert re.search(r"from a t5x orbax checkpoint of random weights \(\d+M parameters", out), out
  (first_s, first_hits, first_writes), (again_s, again_hits, again_writes) = _starts(out)
  assert first_hits == 0 and first_writes >= 1, out
  assert again_writes == 0 and 1 <= again_hits < first_writes, out
  assert first_s > 0 and again_s > 0
  assert re.search(r"first start \(.*\): first step .* restore and prompt init", out), out
  assert re.search(r"restart \(.*\): +first step .* restore and state resume", out), out
  assert "the loss after the checkpoint, first start vs restart: equal" in out, out
  assert not os.listdir(tmp_path), os.listdir(tmp_path)
  assert not users_cache.exists() or not os.listdir(users_cache)


def test_a_checkpoint_of_other_shapes_and_a_reference_are_one_line_errors(capsys):
  """--checkpoint: the user's own checkpoint, read as `train` reads it; one whose shapes are not
  the preset's (the embedded tiny T5's, against T5 1.1 small) fails the start with one line
  naming what differs, and the checkpoint stays where it was. --reference is a one-line error."""
  from prompt_jax.embedded import embedded_checkpoint_path  # pylint: disable=g-import-not-at-top
  checkpoint = embedded_checkpoint_path()
  before = sorted(os.listdir(checkpoint))
  assert cli.main(["bench", "startup", *_TINY, f"--checkpoint={checkpoint}"]) == 1
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
  assert "INITIAL_CHECKPOINT_PATH" in err and "shape" in err, err
  assert sorted(os.listdir(checkpoint)) == before
  assert cli.main(["bench", "startup", "--reference=peft"]) == 2
  err = capsys.readouterr().err
  assert "bench startup has no library reference" in err and len(err.strip().splitlines()) == 1
