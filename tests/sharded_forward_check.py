"""Run in a subprocess with 8 fake CPU devices (XLA_FLAGS must be set before jax is imported).

Prints one JSON line: the specs of a few kernels on a 4 (data) x 2 (model) mesh; writes the
sharded, single-device and float64 single-device logits to the .npz named by argv[1] (the test
bounds the sharded result by the single-device float32 error, tests/numerics.py). argv[2], if
given, is the model's attention_implementation ('xla': jax.nn's kernel, which the encoder gives
its padding as sequence lengths, layers.PaddedBias).
"""
import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from prompt_jax import partitioning  # noqa: E402
from prompt_jax.models import T5, T5Config  # noqa: E402


def main():
  cfg = T5Config(vocab_size=128, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
                 num_encoder_layers=2, num_decoder_layers=2, dtype=jnp.float32,
                 mlp_activations=("gelu", "linear"), logits_via_embedding=False,
                 attention_implementation=sys.argv[2] if len(sys.argv) > 2 else "auto")
  model = T5(cfg)
  rng = np.random.RandomState(0)
  enc = rng.randint(1, 128, (8, 12))
  enc[3, 6:] = 0
  tgt = rng.randint(1, 128, (8, 6))
  dec = np.concatenate([np.zeros((8, 1), int), tgt[:, :-1]], axis=1)
  init = lambda: model.init(jax.random.PRNGKey(0), enc, dec, tgt, enable_dropout=False)
  params = nn.meta.unbox(init())["params"]
  with jax.default_device(jax.devices()[0]):
    single = np.asarray(model.apply({"params": params}, enc, dec, tgt, enable_dropout=False))
    with jax.enable_x64(True):
      params64 = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), params)
      single64 = np.asarray(T5(cfg.replace(dtype=jnp.float64)).apply(
          {"params": params64}, enc, dec, tgt, enable_dropout=False))

  mesh = partitioning.create_mesh(num_partitions=2)
  shardings = partitioning.logical_to_sharding(
      partitioning.logical_specs(jax.eval_shape(init)), mesh)["params"]
  sharded_params = jax.device_put(params, shardings)
  batch = [jax.device_put(x, partitioning.data_sharding(mesh)) for x in (enc, dec, tgt)]
  with partitioning.axis_rules(mesh):
    fwd = jax.jit(lambda p, e, d, t: model.apply({"params": p}, e, d, t, enable_dropout=False))
    sharded = fwd(sharded_params, *batch)
  layer = sharded_params["encoder"]["layers_0"]
  spec = lambda x: [str(a) for a in x.sharding.spec]
  print(json.dumps({
      "devices": jax.device_count(),
      "mesh": dict(mesh.shape),
      "wi_0": spec(layer["mlp"]["wi_0"]["kernel"]),
      "wo": spec(layer["mlp"]["wo"]["kernel"]),
      "query": spec(layer["attention"]["query"]["kernel"]),
      "out": spec(layer["attention"]["out"]["kernel"]),
      "embedding": spec(sharded_params["token_embedder"]["embedding"]),
      "norm": spec(layer["pre_mlp_layer_norm"]["scale"]),
      "logits": spec(sharded),
      "wi_0_shard_shape": list(layer["mlp"]["wi_0"]["kernel"].addressable_shards[0].data.shape),
  }))
  valid = tgt > 0  # padded targets attend nothing: their logits are arbitrary
  np.savez(sys.argv[1], sharded=np.asarray(sharded)[valid], single=single[valid],
           single64=single64[valid])


if __name__ == "__main__":
  main()
