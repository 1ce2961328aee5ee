"""Run in a subprocess with 8 fake CPU devices (XLA_FLAGS must be set before jax is imported).

Beam search and label scoring of a prompted T5 on a 4 (data) x 2 (model) mesh, on one device,
and on one device in float64; writes them to the .npz named by argv[1] (the test bounds the
sharded scores by the single-device float32 error, tests/numerics.py).
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


def main():
  cfg = T5Config(vocab_size=128, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
                 num_encoder_layers=2, num_decoder_layers=2, dtype=jnp.float32,
                 mlp_activations=("gelu", "linear"), logits_via_embedding=False)
  prompt = prompt_factory(functools.partial(PromptTuning, length=3), length=3)
  model = T5(cfg, prompt=prompt)
  rng = np.random.RandomState(0)
  enc = rng.randint(2, 128, (8, 12))
  enc[3, 6:] = 0
  labels = np.array([[7, 1, 0], [9, 4, 1], [12, 1, 0]])
  dec = np.zeros((8, 4), np.int32)
  init = lambda: model.init(jax.random.PRNGKey(0), enc, dec, dec, enable_dropout=False)
  params = nn.meta.unbox(init())["params"]
  kernel = np.array(params["decoder"]["logits_dense"]["kernel"])
  kernel[:, 1] += 0.5  # EOS within reach: beams finish at several lengths
  params["decoder"]["logits_dense"]["kernel"] = kernel

  def run(model, params, enc):
    tokens, scores = decoding.beam_decode(model, params, enc, 6, beam_size=3, alpha=0.6)
    return (np.asarray(tokens), np.asarray(scores),
            np.asarray(decoding.score_targets(model, params, enc, labels)))

  with jax.default_device(jax.devices()[0]):
    single = run(model, params, enc)
    with jax.enable_x64(True):
      params64 = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), params)
      single64 = run(T5(cfg.replace(dtype=jnp.float64), prompt=prompt), params64, enc)

  mesh = partitioning.create_mesh(num_partitions=2)
  shardings = partitioning.logical_to_sharding(
      partitioning.logical_specs(jax.eval_shape(init)), mesh)["params"]
  with partitioning.axis_rules(mesh):
    sharded = run(model, jax.device_put(params, shardings),
                  jax.device_put(enc, partitioning.data_sharding(mesh)))
  names = ("tokens", "scores", "label_scores")
  np.savez(sys.argv[1], **{f"{k}_{n}": v for k, r in (("sharded", sharded), ("single", single),
                                                       ("single64", single64))
                           for n, v in zip(names, r)})


if __name__ == "__main__":
  main()
