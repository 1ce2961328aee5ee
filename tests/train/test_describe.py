"""`prompt-jax describe`: counts from abstract shapes only."""
import gin

from prompt_jax import cli
from prompt_jax.train import describe


def test_t5_1_1_large_with_100_token_prompt_has_102400_trainable(capsys):
  cli.parse_gin(["models/t5_1_1_large.gin", "runs/prompt_finetune.gin"],
                ["PROMPT_LENGTH = 100"], [])
  result = describe.describe()
  gin.clear_config()
  assert result["trainable"] == 102_400
  assert result["parameters"] == {"encoder/prompt/prompt/prompt": (100, 1024)}
  assert result["frozen"] > 700_000_000
  assert "trainable parameters: 102,400" in capsys.readouterr().out


def test_model_finetune_trains_everything():
  cli.parse_gin(["models/embedded_tiny.gin", "runs/model_finetune.gin"], [], [])
  result = describe.describe(print_fn=lambda *_: None)
  gin.clear_config()
  assert result["frozen"] == 0 and result["trainable"] > 300_000
