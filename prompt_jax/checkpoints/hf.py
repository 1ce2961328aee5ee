"""Hugging Face T5 checkpoints (`save_pretrained` dirs) mapped onto t5x parameter names.

  shared.weight                                  -> token_embedder/embedding        [V, H]
  {stack}.block.{i}.layer.0.SelfAttention.{q,k,v,o}.weight  (torch Linear [out, in], transposed)
      -> encoder/layers_i/attention/{query,key,value,out}/kernel (decoder: self_attention)
  {stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight [buckets, heads]
      -> {stack}/relpos_bias/rel_embedding [heads, buckets]
  decoder.block.{i}.layer.1.EncDecAttention.*    -> decoder/layers_i/encoder_decoder_attention/*
  {stack}.block.{i}.layer.{j}.layer_norm.weight  -> pre_(self_|cross_)attention/pre_mlp norms
  {stack}.block.{i}.layer.{-1}.DenseReluDense.{wi,wi_0,wi_1,wo}.weight -> mlp/{...}/kernel
  {stack}.final_layer_norm.weight                -> {encoder_norm,decoder_norm}/scale
  lm_head.weight [V, H] (untied only)            -> decoder/logits_dense/kernel [H, V]

Safetensors files are read through their header and a numpy memmap (no torch needed; each
slice reads only its bytes); `pytorch_model.bin` goes through `torch.load(weights_only=True,
mmap=True)`. Sharded checkpoints (`*.index.json`) are supported.
"""
import json
import os
import pickle
import re
from typing import Any, Dict, Optional, Tuple

import jax.numpy as jnp
import numpy as np

from prompt_jax.checkpoints import arrays as arrays_lib
from prompt_jax.checkpoints import tree as tree_lib
from prompt_jax.checkpoints.tree import CheckpointError
from prompt_jax.models.config import T5Config

CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
_SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": jnp.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}
_ATTENTION = {"q": "query", "k": "key", "v": "value", "o": "out"}
_BLOCK_RE = re.compile(r"^(encoder|decoder)\.block\.(\d+)\.layer\.(\d+)\.(.+)\.weight$")
_REQUIRED = ("vocab_size", "d_model", "num_heads", "d_kv", "d_ff", "num_layers")
_LFS_POINTER = b"version https://git-lfs"
_DOWNLOAD_AGAIN = "download it again"


def is_hf_dir(path: str) -> bool:
  return (os.path.isfile(os.path.join(path, CONFIG_FILE))
          and any(os.path.isfile(os.path.join(path, f)) for f in WEIGHT_FILES))


def _activations(feed_forward_proj: str, path: str) -> Tuple[str, ...]:
  # HF's 'gated-gelu' is gelu_new (tanh approximation) = t5x's gated 'gelu'.
  known = {"relu": ("relu",), "gated-gelu": ("gelu", "linear")}
  if feed_forward_proj not in known:
    raise CheckpointError(f"{path}/{CONFIG_FILE}: unsupported feed_forward_proj "
                          f"{feed_forward_proj!r} (expected 'relu' or 'gated-gelu')")
  return known[feed_forward_proj]


_LAYER_NORM_EPSILON = 1e-6  # models/layers.py LayerNorm


def config_from_hf(hf: Dict[str, Any], path: str) -> T5Config:
  """The T5Config of an HF T5 `config.json` dict."""
  if hf.get("model_type", "t5") not in ("t5", "mt5"):
    raise CheckpointError(f"{path}/{CONFIG_FILE} has model_type {hf.get('model_type')!r}; "
                          "only 't5' and 'mt5' share T5's parameter layout")
  missing = [field for field in _REQUIRED if field not in hf]
  if missing:
    raise CheckpointError(f"{path}/{CONFIG_FILE} lacks required field(s) {', '.join(missing)} "
                          f"(a T5 config.json has {', '.join(_REQUIRED)}); use the model's "
                          f"own config.json")
  epsilon = hf.get("layer_norm_epsilon", _LAYER_NORM_EPSILON)
  if epsilon != _LAYER_NORM_EPSILON:  # every T5 (1.0, 1.1, flan, mT5) uses T5's 1e-6
    raise CheckpointError(f"{path}/{CONFIG_FILE} has layer_norm_epsilon={epsilon!r}; prompt_jax's "
                          f"T5 layer norms use T5's {_LAYER_NORM_EPSILON}, so its outputs would "
                          f"differ from the model's")
  num_layers = hf["num_layers"]
  return T5Config(
      vocab_size=hf["vocab_size"],
      emb_dim=hf["d_model"],
      num_heads=hf["num_heads"],
      head_dim=hf["d_kv"],
      mlp_dim=hf["d_ff"],
      num_encoder_layers=num_layers,
      num_decoder_layers=hf.get("num_decoder_layers") or num_layers,
      mlp_activations=_activations(hf.get("feed_forward_proj", "relu"), path),
      logits_via_embedding=_logits_via_embedding(hf),
      dropout_rate=hf.get("dropout_rate", 0.1),
      relative_attention_num_buckets=hf.get("relative_attention_num_buckets", 32),
      relative_attention_max_distance=hf.get("relative_attention_max_distance", 128),
  )


def _logits_via_embedding(hf: Dict[str, Any]) -> bool:
  """Whether the logits are the embedding's transpose times the output scaled by d_model^-0.5
  (T5 1.0) rather than an output projection (T5 1.1, flan, LM-adapted, mT5). transformers >= 5
  writes `tie_word_embeddings: true` for every T5 and says this in `scale_decoder_outputs`
  (its projection may then be `shared.weight` itself); earlier versions only in the tie."""
  if hf.get("model_type") == "mt5":  # never scaled; transformers 5 writes tie: true for it too
    return False
  if hf.get("tie_word_embeddings") is False:  # T5 1.1 as transformers 4 wrote it
    return False
  if hf.get("scale_decoder_outputs") is not None:
    return bool(hf["scale_decoder_outputs"])
  return True


def check_compatible(config: T5Config, checkpoint_config: T5Config, path: str):
  """Fields the shapes cannot show must still agree with the checkpoint's config.json."""
  for field in ("mlp_activations", "logits_via_embedding", "relative_attention_max_distance"):
    want, found = getattr(config, field), getattr(checkpoint_config, field)
    if isinstance(want, list):
      want = tuple(want)
    if want != found:
      raise CheckpointError(f"{path}/{CONFIG_FILE} has {field}={found!r} but the config "
                            f"expects {want!r}")


def t5x_name(hf_name: str, tied: bool) -> Optional[str]:
  """The t5x path of an HF T5 tensor name, or None for tensors t5x does not keep.

  Ignored: {encoder,decoder}.embed_tokens (copies of shared), lm_head when tied, relative
  attention tables of blocks > 0 and of cross-attention (present in old HF T5 files, unused).
  """
  if hf_name == "shared.weight":
    return tree_lib.EMBEDDING
  if hf_name == "lm_head.weight":
    return None if tied else tree_lib.LOGITS_DENSE
  match = re.fullmatch(r"(encoder|decoder)\.final_layer_norm\.weight", hf_name)
  if match:
    return f"{match.group(1)}/{match.group(1)}_norm/scale"
  match = _BLOCK_RE.match(hf_name)
  if not match:
    return None
  stack, rest = match.group(1), match.group(4)
  block, layer = int(match.group(2)), int(match.group(3))
  prefix = f"{stack}/layers_{block}"
  cross = stack == "decoder" and layer == 1
  mlp_layer = 1 if stack == "encoder" else 2
  if layer == 0 and rest == "SelfAttention.relative_attention_bias":
    return f"{stack}/relpos_bias/rel_embedding" if block == 0 else None
  attention = re.fullmatch(r"(SelfAttention|EncDecAttention)\.([qkvo])", rest)
  if attention and (layer, attention.group(1)) == (0, "SelfAttention"):
    module = "attention" if stack == "encoder" else "self_attention"
    return f"{prefix}/{module}/{_ATTENTION[attention.group(2)]}/kernel"
  if attention and cross and attention.group(1) == "EncDecAttention":
    return f"{prefix}/encoder_decoder_attention/{_ATTENTION[attention.group(2)]}/kernel"
  if rest == "layer_norm":
    if layer == 0:
      norm = "pre_attention_layer_norm" if stack == "encoder" else "pre_self_attention_layer_norm"
    elif cross:
      norm = "pre_cross_attention_layer_norm"
    elif layer == mlp_layer:
      norm = "pre_mlp_layer_norm"
    else:
      return None
    return f"{prefix}/{norm}/scale"
  mlp = re.fullmatch(r"DenseReluDense\.(wi|wi_\d+|wo)", rest)
  if mlp and layer == mlp_layer:
    return f"{prefix}/mlp/{mlp.group(1)}/kernel"
  return None


def _transposes(t5x: str) -> bool:
  """Linear weights and the relative attention table are stored transposed by torch/HF."""
  return t5x.endswith("/kernel") or t5x.endswith("relpos_bias/rel_embedding")


def _read_json(filename: str) -> Dict[str, Any]:
  """A JSON object file (config.json, an index); damaged or another kind: a CheckpointError."""
  try:
    with open(filename) as f:
      content = json.load(f)
  except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
    raise CheckpointError(f"{filename} is not valid JSON ({e}); {_DOWNLOAD_AGAIN}") from e
  if not isinstance(content, dict):
    raise CheckpointError(f"{filename} holds a JSON {type(content).__name__}, not an object; "
                          f"{_DOWNLOAD_AGAIN}")
  return content


# --- tensor files -------------------------------------------------------------------------


def _unreadable(filename: str, kind: str, reason: str) -> CheckpointError:
  return CheckpointError(f"{filename} is not a readable {kind} ({reason}: truncated or damaged "
                         f"download?); {_DOWNLOAD_AGAIN}")


def _check_not_lfs_pointer(filename: str) -> None:
  """A Git LFS pointer in place of the weights (a clone without `git lfs`) says so."""
  try:
    with open(filename, "rb") as f:
      head = f.read(len(_LFS_POINTER))
  except OSError as e:
    raise CheckpointError(f"{filename} cannot be read ({e.strerror or e})") from e
  if head == _LFS_POINTER:
    raise CheckpointError(f"{filename} is a Git LFS pointer, not the weights; fetch them with "
                          f"`git lfs pull` in {os.path.dirname(filename) or '.'} or "
                          f"{_DOWNLOAD_AGAIN}")


def _safetensors_header(filename: str) -> Tuple[int, Dict[str, Any]]:
  """(header size, header) of a .safetensors file, checked against the file's length."""
  _check_not_lfs_pointer(filename)
  size = os.path.getsize(filename)
  with open(filename, "rb") as f:
    head = f.read(8)
    header_size = int.from_bytes(head, "little") if len(head) == 8 else 0
    if not 0 < header_size <= size - 8:
      raise _unreadable(filename, "safetensors file", "no valid header")
    try:
      header = json.loads(f.read(header_size))
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
      raise _unreadable(filename, "safetensors file", "its header is not JSON") from e
  if not isinstance(header, dict):
    raise _unreadable(filename, "safetensors file", "its header is not a JSON object")
  for name, info in header.items():
    if name == "__metadata__":
      continue
    offsets = info.get("data_offsets") if isinstance(info, dict) else None
    if (not isinstance(offsets, list) or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets) or not {"dtype", "shape"} <= info.keys()):
      raise _unreadable(filename, "safetensors file", f"its header entry {name!r} is malformed")
    end = 8 + header_size + offsets[1]
    if end > size:
      raise _unreadable(filename, "safetensors file",
                        f"tensor {name} ends at byte {end}, the file at byte {size}")
    shape, dtype = info["shape"], _SAFETENSORS_DTYPES.get(info["dtype"])
    if dtype is not None and isinstance(shape, list) and all(isinstance(d, int) for d in shape):
      want = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
      if offsets[1] - offsets[0] != want:
        raise _unreadable(filename, "safetensors file",
                          f"tensor {name} spans {offsets[1] - offsets[0]} bytes, its shape "
                          f"{shape} and dtype {info['dtype']} need {want}")
  return header_size, header


def _safetensors_arrays(filename: str) -> Dict[str, arrays_lib.LazyArray]:
  """Lazy arrays of a .safetensors file: 8-byte header size, JSON header, raw C-order data."""
  header_size, header = _safetensors_header(filename)
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    if info["dtype"] not in _SAFETENSORS_DTYPES:
      raise CheckpointError(f"{filename}: tensor {name} has unsupported dtype {info['dtype']}")
    dtype = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]])
    shape = tuple(info["shape"])
    begin = 8 + header_size + info["data_offsets"][0]

    def read(index, shape=shape, dtype=dtype, begin=begin):
      if not shape or 0 in shape:
        return np.zeros(shape, dtype)[index]
      data = np.memmap(filename, dtype=dtype, mode="r", offset=begin, shape=shape)
      return np.array(data[index])

    out[name] = arrays_lib.LazyArray(shape=shape, dtype=dtype, read=read)
  return out


def _torch_arrays(filename: str) -> Dict[str, arrays_lib.LazyArray]:
  import torch  # pylint: disable=g-import-not-at-top

  _check_not_lfs_pointer(filename)
  # What torch.load raises for a truncated or damaged file (OSError: a truncated zip; a
  # missing or unreadable file was ruled out above). Its UnpicklingError text advises
  # weights_only=False, which would run arbitrary code: never shown.
  damaged = (pickle.UnpicklingError, EOFError, RuntimeError, OSError)
  try:
    try:
      state = torch.load(filename, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # Legacy (non-zip) torch files cannot be memory-mapped.
      state = torch.load(filename, map_location="cpu", weights_only=True)
  except damaged as e:
    raise _unreadable(filename, "PyTorch checkpoint", "torch.load(weights_only=True) failed"
                      ) from e
  if not isinstance(state, dict):
    raise CheckpointError(f"{filename} holds a {type(state).__name__}, not a state dict of "
                          f"tensors; save the model with save_pretrained")
  out = {}
  for name, tensor in state.items():
    bf16 = tensor.dtype == torch.bfloat16

    def read(index, tensor=tensor, bf16=bf16):
      piece = tensor[index]
      return piece.float().numpy().astype(jnp.bfloat16) if bf16 else piece.numpy().copy()

    dtype = np.dtype(jnp.bfloat16) if bf16 else np.dtype(str(tensor.dtype).split(".")[-1])
    out[name] = arrays_lib.LazyArray(shape=tuple(tensor.shape), dtype=dtype, read=read)
  return out


def _tensor_arrays(path: str) -> Dict[str, arrays_lib.LazyArray]:
  for index_name, reader in (("model.safetensors.index.json", _safetensors_arrays),
                             ("pytorch_model.bin.index.json", _torch_arrays)):
    index_file = os.path.join(path, index_name)
    if os.path.isfile(index_file):
      weight_map = _read_json(index_file).get("weight_map")
      if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index_file} has no weight_map object; {_DOWNLOAD_AGAIN}")
      out = {}
      for shard in sorted(set(weight_map.values())):
        if not os.path.isfile(os.path.join(path, shard)):
          raise CheckpointError(f"{index_file} names shard {shard!r}, which is not in {path}; "
                                f"download it")
        out.update(reader(os.path.join(path, shard)))
      return out
  if os.path.isfile(os.path.join(path, "model.safetensors")):
    return _safetensors_arrays(os.path.join(path, "model.safetensors"))
  return _torch_arrays(os.path.join(path, "pytorch_model.bin"))


class HFCheckpoint:
  """An HF T5 directory's weights under t5x names, read lazily; `config` from config.json."""

  format = "hf"

  def __init__(self, path: str):
    self.path = path
    hf = _read_json(os.path.join(path, CONFIG_FILE))
    self.config = config_from_hf(hf, path)
    tied = self.config.logits_via_embedding
    tensors = _tensor_arrays(path)
    if "shared.weight" not in tensors and "encoder.embed_tokens.weight" in tensors:
      tensors["shared.weight"] = tensors["encoder.embed_tokens.weight"]
    if (not tied and hf.get("tie_word_embeddings") is not False
        and "lm_head.weight" not in tensors and "shared.weight" in tensors):
      # An output projection tied to the embedding (transformers >= 5 saves it once, as
      # shared.weight): the same matrix, without T5 1.0's scaling. A config that says the two
      # are untied keeps lm_head.weight required (a file without it is incomplete).
      tensors["lm_head.weight"] = tensors["shared.weight"]
    self.arrays: Dict[str, arrays_lib.LazyArray] = {}
    for hf_name, lazy in tensors.items():
      name = t5x_name(hf_name, tied)
      if name is not None:
        self.arrays[name] = lazy.transposed() if _transposes(name) else lazy
    self.shapes = {name: lazy.shape for name, lazy in self.arrays.items()}

  def restore(self, names, dtype, shardings=None) -> Dict[str, Any]:
    return arrays_lib.materialize({n: self.arrays[n] for n in names}, dtype, shardings)
