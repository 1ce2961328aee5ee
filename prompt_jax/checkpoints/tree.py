"""The T5 parameter tree: expected shapes, config inference and validation of checkpoints.

Parameter paths are '/'-joined, exactly as t5x's `examples/t5` names them (and as t5x's legacy
checkpoints spell them under `optimizer/target/`), e.g. 'encoder/layers_0/attention/query/kernel'.
"""
import re
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Tuple, Union

import jax

from prompt_jax.models.config import T5Config

Shape = Tuple[int, ...]

EMBEDDING = "token_embedder/embedding"
LOGITS_DENSE = "decoder/logits_dense/kernel"

# Paths that belong to the T5 backbone. A checkpoint parameter outside these (a prompt, say) is
# not the model's and is skipped; one inside them that the config does not expect is an error.
_BACKBONE_RE = re.compile(
    r"^(token_embedder/|(encoder|decoder)/(layers_\d+|relpos_bias|encoder_norm|decoder_norm|"
    r"logits_dense)/)")
_LAYER_RE = re.compile(r"^(encoder|decoder)/layers_(\d+)/")


class CheckpointError(ValueError):
  """A checkpoint that cannot be found, read, or does not fit the model. One-line message."""


def _attention_shapes(config: T5Config) -> Dict[str, Shape]:
  joined = config.num_heads * config.head_dim
  return {
      "query": {"kernel": (config.emb_dim, joined)},  # [embed, heads*kv]
      "key": {"kernel": (config.emb_dim, joined)},
      "value": {"kernel": (config.emb_dim, joined)},
      "out": {"kernel": (joined, config.emb_dim)},  # [heads*kv, embed]
  }


def _mlp_shapes(config: T5Config) -> Dict[str, Any]:
  names = ["wi"] if len(config.mlp_activations) == 1 else [
      f"wi_{i}" for i in range(len(config.mlp_activations))]
  shapes = {name: {"kernel": (config.emb_dim, config.mlp_dim)} for name in names}  # [embed, mlp]
  shapes["wo"] = {"kernel": (config.mlp_dim, config.emb_dim)}  # [mlp, embed]
  return shapes


def expected_shapes(config: T5Config) -> Dict[str, Any]:
  """The nested dict of parameter shapes of t5x's `examples/t5` Transformer for `config`."""
  scale = {"scale": (config.emb_dim,)}  # [embed]
  relpos = {"rel_embedding": (config.num_heads, config.relative_attention_num_buckets)}
  encoder = {"relpos_bias": relpos, "encoder_norm": scale}
  for i in range(config.num_encoder_layers):
    encoder[f"layers_{i}"] = {
        "pre_attention_layer_norm": scale,
        "attention": _attention_shapes(config),
        "pre_mlp_layer_norm": scale,
        "mlp": _mlp_shapes(config),
    }
  decoder = {"relpos_bias": relpos, "decoder_norm": scale}
  for i in range(config.num_decoder_layers):
    decoder[f"layers_{i}"] = {
        "pre_self_attention_layer_norm": scale,
        "self_attention": _attention_shapes(config),
        "pre_cross_attention_layer_norm": scale,
        "encoder_decoder_attention": _attention_shapes(config),
        "pre_mlp_layer_norm": scale,
        "mlp": _mlp_shapes(config),
    }
  if not config.logits_via_embedding:
    decoder["logits_dense"] = {"kernel": (config.emb_dim, config.vocab_size)}  # [embed, vocab]
  return {
      "token_embedder": {"embedding": (config.vocab_size, config.emb_dim)},  # [vocab, embed]
      "encoder": encoder,
      "decoder": decoder,
  }


def flatten(tree: Mapping[str, Any], is_leaf: Optional[Callable[[Any], bool]] = None,
            prefix: str = "") -> Dict[str, Any]:
  """{'a': {'b': x}} -> {'a/b': x}. Mappings are nodes unless `is_leaf` says otherwise."""
  flat = {}
  for key, value in tree.items():
    path = f"{prefix}{key}"
    if isinstance(value, Mapping) and not (is_leaf and is_leaf(value)):
      flat.update(flatten(value, is_leaf, path + "/"))
    else:
      flat[path] = value
  return flat


def unflatten(flat: Mapping[str, Any]) -> Dict[str, Any]:
  """{'a/b': x} -> {'a': {'b': x}}."""
  tree: Dict[str, Any] = {}
  for path, value in flat.items():
    node = tree
    *parents, leaf = path.split("/")
    for key in parents:
      node = node.setdefault(key, {})
    node[leaf] = value
  return tree


def is_backbone_param(path: str) -> bool:
  return bool(_BACKBONE_RE.match(path))


def _count_layers(shapes: Mapping[str, Shape], stack: str) -> int:
  indices = [int(m.group(2)) for m in map(_LAYER_RE.match, shapes) if m and m.group(1) == stack]
  return max(indices) + 1 if indices else 0


def infer_config(shapes: Mapping[str, Shape], path: str, **defaults) -> T5Config:
  """The T5Config that a checkpoint's flat parameter shapes imply.

  vocab/embed from the embedding, heads from the relative position table, head_dim from the
  query kernel, gating from `wi_0`, untied logits from `logits_dense`, layers from `layers_N`.
  Fields that shapes cannot tell (max distance, dtype, dropout) keep T5Config's defaults (t5x's
  standard values) unless given in `defaults`.
  """
  required = [EMBEDDING, "encoder/relpos_bias/rel_embedding",
              "encoder/layers_0/attention/query/kernel", "encoder/layers_0/mlp/wo/kernel"]
  for name in required:
    if name not in shapes:
      raise CheckpointError(
          f"cannot infer a T5Config from {path}: parameter '{name}' is missing "
          f"(found {len(shapes)} parameters); pass config= explicitly")
  vocab_size, emb_dim = shapes[EMBEDDING]
  num_heads, num_buckets = shapes["encoder/relpos_bias/rel_embedding"]
  joined_kv = shapes["encoder/layers_0/attention/query/kernel"][1]
  if joined_kv % num_heads:
    raise CheckpointError(
        f"cannot infer a T5Config from {path}: query kernel width {joined_kv} is not a multiple "
        f"of the {num_heads} heads of 'encoder/relpos_bias/rel_embedding'")
  gated = "encoder/layers_0/mlp/wi_0/kernel" in shapes
  fields = dict(
      vocab_size=vocab_size,
      emb_dim=emb_dim,
      num_heads=num_heads,
      head_dim=joined_kv // num_heads,
      mlp_dim=shapes["encoder/layers_0/mlp/wo/kernel"][0],
      num_encoder_layers=_count_layers(shapes, "encoder"),
      num_decoder_layers=_count_layers(shapes, "decoder"),
      mlp_activations=("gelu", "linear") if gated else ("relu",),
      logits_via_embedding=LOGITS_DENSE not in shapes,
      relative_attention_num_buckets=num_buckets,
  )
  fields.update(defaults)
  return T5Config(**fields)


def _config_hint(name: str, config: T5Config) -> str:
  match = _LAYER_RE.match(name)
  if match:
    count = getattr(config, f"num_{match.group(1)}_layers")
    return f"config has num_{match.group(1)}_layers={count}"
  if name == LOGITS_DENSE:
    return f"config has logits_via_embedding={config.logits_via_embedding}"
  return "the config has no such parameter"


def validate(shapes: Mapping[str, Shape], config: T5Config, path: str) -> Dict[str, Shape]:
  """Checks a checkpoint's flat shapes against `config`; returns the expected flat shapes.

  Raises CheckpointError naming the first shape mismatch (with both shapes), else the first
  missing parameter, else the first backbone parameter the config does not expect. Parameters
  outside the backbone (e.g. a prompt stored alongside) are ignored.
  """
  expected = flatten(expected_shapes(config))
  for name, shape in expected.items():
    if name in shapes and tuple(shapes[name]) != tuple(shape):
      raise CheckpointError(
          f"checkpoint {path}: parameter '{name}' has shape {tuple(shapes[name])} but the "
          f"config expects {tuple(shape)}")
  missing = [name for name in expected if name not in shapes]
  if missing:
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    raise CheckpointError(
        f"checkpoint {path} is missing parameter '{missing[0]}'{more}; the config expects it "
        f"with shape {tuple(expected[missing[0]])}")
  unexpected = [n for n in shapes if n not in expected and is_backbone_param(n)]
  if unexpected:
    more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
    raise CheckpointError(
        f"checkpoint {path} has parameter '{unexpected[0]}'{more} that the config does not "
        f"expect ({_config_hint(unexpected[0], config)})")
  return expected


ShardingsArg = Union[None, jax.sharding.Sharding, Mapping[str, Any],
                     Callable[[str], jax.sharding.Sharding]]


def resolve_shardings(shardings: ShardingsArg,
                      names: Iterable[str]) -> Optional[Dict[str, jax.sharding.Sharding]]:
  """Flat {path: Sharding} from a pytree of shardings, a callable path -> sharding, or one."""
  if shardings is None:
    return None
  names = list(names)
  if isinstance(shardings, jax.sharding.Sharding):
    return {name: shardings for name in names}
  if callable(shardings) and not isinstance(shardings, Mapping):
    resolved = {name: shardings(name) for name in names}
  else:
    flat = flatten(shardings)
    absent = [name for name in names if name not in flat]
    if absent:
      raise CheckpointError(f"shardings has no entry for parameter '{absent[0]}'")
    resolved = {name: flat[name] for name in names}
  for name, sharding in resolved.items():
    if not isinstance(sharding, jax.sharding.Sharding):
      raise CheckpointError(
          f"shardings['{name}'] is {type(sharding).__name__}, not a jax.sharding.Sharding")
  return resolved
