"""trees: TRAINABLE_REGEX matching, and a pattern that is not a regular expression as one line."""
import contextlib
import io
import os

import pytest

from prompt_jax import cli
from prompt_jax import trees
from prompt_jax.errors import ConfigError
from tests.train import common


def test_trainable_regex_fully_matches_the_path():
  assert trees.is_trainable("encoder/prompt/prompt", "encoder/prompt/.*")
  assert not trees.is_trainable("encoder/prompt/prompt", "prompt")
  trainable, frozen = trees.split({"encoder": {"prompt": 1, "norm": 2}}, "encoder/prompt")
  assert trainable == {"encoder": {"prompt": 1}} and frozen == {"encoder": {"norm": 2}}


@pytest.mark.parametrize("regex,reason", [
    ("encoder/(prompt", "missing ), unterminated subpattern at position 8"),
    ("*prompt", "nothing to repeat at position 0"),
])
def test_an_invalid_trainable_regex_is_a_config_error(regex, reason):
  with pytest.raises(ConfigError) as e:
    trees.split({"encoder": {"prompt": 1}}, regex)
  message = str(e.value)
  assert message.startswith(f"TRAINABLE_REGEX {regex!r} is not a valid regular expression")
  assert reason in message and "\n" not in message


def test_a_trainable_regex_that_is_not_a_string_is_a_config_error():
  with pytest.raises(ConfigError, match=r"TRAINABLE_REGEX 3 is not a string"):
    trees.is_trainable("encoder/prompt", 3)


def test_train_with_an_invalid_trainable_regex_is_one_line_and_writes_nothing(tmp_path):
  model_dir = str(tmp_path / "run")
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    code = cli.main(["train", *common.flags(model_dir, 1, "--gin.TRAINABLE_REGEX='enc(oder'")])
  lines = [l for l in err.getvalue().splitlines() if "error:" in l]
  assert code == 2, err.getvalue()
  assert len(lines) == 1 and "Traceback" not in err.getvalue()
  assert "TRAINABLE_REGEX 'enc(oder' is not a valid regular expression (missing )" in lines[0]
  assert not os.path.exists(model_dir)
