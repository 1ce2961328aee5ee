"""A gs:// path on a machine that cannot reach Google Cloud Storage is one line at once.

Offline, `prompt-jax train --gin.INITIAL_CHECKPOINT_PATH='gs://...'` hung for minutes in GCS's
credential and retry loops (C++ log lines about gcloud credentials), and a gs:// MODEL_DIR
failed with libcurl's "FailedPreconditionError: ... code 6". The lookup is simulated here, so
the tests mean the same on a machine that is online.
"""
import socket
import time

import pytest

from prompt_jax import paths
from tests.evaluation.test_ensemble import run_cli


def _offline(host, port):
  raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


@pytest.fixture
def offline(monkeypatch):
  for name in paths._GCS_ELSEWHERE:  # pylint: disable=protected-access
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setattr(socket, "getaddrinfo", _offline)


@pytest.mark.parametrize("argv,name", [
    (["train", "--gin_file=runs/embedded_default.gin", "--gin.TRAIN_STEPS=2",
      "--gin.INITIAL_CHECKPOINT_PATH='gs://t5-data/t5_1_1_small/checkpoint_1000000'"],
     "INITIAL_CHECKPOINT_PATH gs://t5-data/t5_1_1_small/checkpoint_1000000"),
    (["eval", "--gin_file=runs/embedded_default.gin",
      "--gin.PROMPT_FILE='gs://b/prompts/p.npy'"], "PROMPT_FILE gs://b/prompts/p.npy"),
])
def test_a_gs_path_offline_is_one_line_and_writes_nothing(offline, tmp_path, argv, name):
  model_dir = tmp_path / "run"
  start = time.monotonic()
  code, out, err = run_cli([*argv, f"--gin.MODEL_DIR='{model_dir}'"])
  assert code == 2 and out == "", (out, err)
  assert err == (f"prompt-jax {argv[0]}: error: {name} is on Google Cloud Storage, which this "
                 f"machine cannot reach (storage.googleapis.com does not resolve: no network?); "
                 f"copy it to a local path, or run where GCS is reachable\n")
  assert not model_dir.exists()
  assert time.monotonic() - start < 60  # (it hung for minutes)


def test_a_gs_model_dir_offline_is_one_line(offline):
  code, out, err = run_cli(["describe", "--gin.MODEL_DIR='gs://b/run'"])
  assert code == 2 and out == ""
  assert err.startswith("prompt-jax describe: error: MODEL_DIR gs://b/run is on Google Cloud "
                        "Storage, which this machine cannot reach"), err


def test_the_lookup_answers_none_when_gcs_resolves_is_elsewhere_or_is_slow(monkeypatch):
  for name in paths._GCS_ELSEWHERE:  # pylint: disable=protected-access
    monkeypatch.delenv(name, raising=False)
  asked = []
  assert paths.unreachable_gcs(resolve=lambda h, p: asked.append((h, p))) is None
  assert asked == [("storage.googleapis.com", 443)]
  assert paths.unreachable_gcs(resolve=_offline) == "storage.googleapis.com does not resolve"
  # A slow resolver is not waited for: GCS's own client decides.
  start = time.monotonic()
  assert paths.unreachable_gcs(0.2, resolve=lambda h, p: time.sleep(3)) is None
  assert time.monotonic() - start < 2
  # Behind a proxy the proxy resolves the host: not asked.
  monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
  assert paths.unreachable_gcs(resolve=_offline) is None
