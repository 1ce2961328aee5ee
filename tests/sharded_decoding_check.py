"""Run in a subprocess with 8 fake CPU devices (XLA_FLAGS must be set before jax is imported).

Beam search and label scoring of a prompted T5 on a 4 (data) x 2 (model) mesh and on one device,
each in float32 and float64, and the penalised teacher-forced log-likelihoods of the sequences
the float32 mesh run returned (float32 and float64, on one device); writes them to the .npz
named by argv[1]. The test compares the searches' choices (tokens) in float64 and bounds the
float32 scores by the single-device float32 error (tests/numerics.py).
"""
import functools
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from prompt_jax import partitioning  # noqa: E402
from prompt_jax.models import T5, T5Config  # noqa: E402
from prompt_jax.models import decoding  # noqa: E402
from prompt_jax.prompts import PromptTuning, prompt_factory  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.models.test_decoding import _lengths, teacher_forced  # noqa: E402  pylint: disable=g-import-not-at-top


def main():
  cfg = T5Config(vocab_size=128, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
                 num_encoder_layers=2, num_decoder_layers=2, dtype=jnp.float32,
                 mlp_activations=("gelu", "linear"), logits_via_embedding=False)
  prompt = prompt_factory(functools.partial(PromptTuning, length=3), length=3)
  model = T5(cfg, prompt=prompt)
  rng = np.random.RandomState(0)
  # int32 as the data pipeline gives them: numpy's default int64 became s64 arrays under
  # enable_x64 and s32 outside it, and one CI run (d776e22) died in XLA with an executable
  # compiled for the s64 [2, 12] shards handed an s32 buffer (not reproduced in 5 runs since).
  enc = rng.randint(2, 128, (8, 12)).astype(np.int32)
  enc[3, 6:] = 0
  labels = np.array([[7, 1, 0], [9, 4, 1], [12, 1, 0]], np.int32)
  dec = np.zeros((8, 4), np.int32)
  init = lambda: model.init(jax.random.PRNGKey(0), enc, dec, dec, enable_dropout=False)
  params = nn.meta.unbox(init())["params"]
  kernel = np.array(params["decoder"]["logits_dense"]["kernel"])
  kernel[:, 1] += 0.5  # EOS within reach: beams finish at several lengths
  params["decoder"]["logits_dense"]["kernel"] = kernel

  beam_size, length, alpha = 3, 6, 0.6

  def run(model, params, enc):
    tokens, scores = decoding.beam_decode(model, params, enc, length, beam_size=beam_size,
                                          alpha=alpha)
    return (np.asarray(tokens), np.asarray(scores),
            np.asarray(decoding.score_targets(model, params, enc, labels)))

  def penalised(model, params, tokens):
    """Teacher-forced log-likelihoods [N, K] of `tokens` [N, K, L] / the length penalty."""
    finished = (tokens == 1).any(-1)
    penalty = np.where(finished.any(-1, keepdims=True),
                       ((5.0 + _lengths(tokens)) / 6.0) ** alpha, 1.0)
    ll = teacher_forced(model, params, jnp.repeat(jnp.asarray(enc), beam_size, axis=0),
                        jnp.asarray(tokens.reshape(-1, length)))
    return np.asarray(ll).reshape(tokens.shape[:2]) / penalty

  model64 = T5(cfg.replace(dtype=jnp.float64), prompt=prompt)
  mesh = partitioning.create_mesh(num_partitions=2)
  shardings = partitioning.logical_to_sharding(
      partitioning.logical_specs(jax.eval_shape(init)), mesh)["params"]
  with partitioning.axis_rules(mesh):
    sharded = run(model, jax.device_put(params, shardings),
                  jax.device_put(enc, partitioning.data_sharding(mesh)))
    with jax.enable_x64(True):
      params64 = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), params)
      sharded64 = run(model64, jax.device_put(params64, shardings),
                      jax.device_put(enc, partitioning.data_sharding(mesh)))

  with jax.default_device(jax.devices()[0]):
    single = run(model, params, enc)
    forced = penalised(model, params, sharded[0])
    with jax.enable_x64(True):
      single64 = run(model64, params64, enc)
      forced64 = penalised(model64, params64, sharded[0])

  names = ("tokens", "scores", "label_scores")
  runs = (("sharded", sharded), ("sharded64", sharded64), ("single", single),
          ("single64", single64))
  np.savez(sys.argv[1], forced_scores=forced, forced64_scores=forced64,
           **{f"{k}_{n}": v for k, r in runs for n, v in zip(names, r)})


if __name__ == "__main__":
  main()
