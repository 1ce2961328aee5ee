"""gin-configurable method specs: what `--gin_file=prompts/<method>.gin` binds.

A spec is a method before the frozen model is loaded. Like `run_setup.PromptSpec` it has
`length`, `placement` and `factory(embedding, vocabulary)`; it also takes the T5Config
(`config=`, for methods whose shapes depend on layers/heads/vocab), may give a per-layer hook
(`layer_factory`), names the parameters it trains (`trainable_regex`) and counts them
(`num_trainable_params(config)`, the formula in its module's docstring).

`model_kwargs(spec, config, embedding, vocabulary)` builds the keyword arguments of
`T5(config, prompt=..., layer_prompts=..., decoder_layer_prompts=...)` from any spec
(run_setup.PromptSpec included): `T5(config, **model_kwargs(spec, config, ...))`.
"""
import dataclasses
import functools
import inspect
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import gin

from prompt_jax.errors import ConfigError
from prompt_jax.prompts import idpg, initializers, ipt, low_rank, prefix, residual, seam
from prompt_jax.prompts.tuning import PromptTuning

DEFAULT_REGEX = r"encoder/(prompt|layer_prompts)/.*"


def resolve_placement(placement, vocabulary=None):
  """A placement name, function, or 'between:<separator text>' (needs the vocabulary)."""
  if isinstance(placement, str) and placement.startswith("between:"):
    text = placement[len("between:"):]
    if vocabulary is None:  # shapes only: any insertion point gives the same shapes
      return seam.suffix
    return seam.between_segments(seam.separator_ids(vocabulary, text))
  try:
    return seam.get_placement(placement)
  except ValueError as e:
    raise ConfigError(str(e)) from e


def _check_length(length: int, minimum: int = 1) -> None:
  if length < minimum:
    raise ConfigError(f"PROMPT_LENGTH must be >= {minimum}, got {length}")


@dataclasses.dataclass(frozen=True)
class MethodSpec:
  """Base: subclasses define `method(embedding, vocabulary, config)` (or None) and counts."""
  length: int
  placement: Any = "prefix"
  trainable_regex: str = DEFAULT_REGEX

  def method(self, embedding, vocabulary, config) -> Optional[Callable]:
    raise NotImplementedError

  def factory(self, embedding=None, vocabulary=None, config=None):
    method = self.method(embedding, vocabulary, config)
    if method is None:
      return None
    return seam.prompt_factory(method, self.length, resolve_placement(self.placement, vocabulary))

  def layer_factory(self, embedding=None, vocabulary=None, config=None):
    return None

  def num_trainable_params(self, config) -> int:
    raise NotImplementedError


def model_kwargs(spec, config, embedding=None, vocabulary=None) -> Dict[str, Any]:
  """{'prompt', 'layer_prompts', 'decoder_layer_prompts'} factories (those not None) for T5."""
  if spec is None:
    return {}
  kw = dict(embedding=embedding, vocabulary=vocabulary)
  if "config" in inspect.signature(spec.factory).parameters:
    kw["config"] = config
  out = {"prompt": spec.factory(**kw)}
  for arg, name in (("layer_prompts", "layer_factory"),
                    ("decoder_layer_prompts", "decoder_layer_factory")):
    fn = getattr(spec, name, None)
    out[arg] = fn(**kw) if fn else None
  return {k: v for k, v in out.items() if v is not None}


def build_factories(spec, config, embedding=None, vocabulary=None) -> Tuple[Any, Any]:
  """(prompt, layer_prompts) factories; see `model_kwargs` for decoder prefixes too."""
  kw = model_kwargs(spec, config, embedding, vocabulary)
  return kw.get("prompt"), kw.get("layer_prompts")


def check_fits(spec, inputs_length: int, max_encoder_length: Optional[int] = None) -> None:
  """The trainer's check of PROMPT_LENGTH against the task's `inputs` feature length."""
  reads = isinstance(spec, IPTSpec) and spec.mode == "lookup"
  length = spec.ipt_length if reads else getattr(spec, "length", 0)
  input_level = 0 if isinstance(spec, DeepPrefixSpec) else getattr(spec, "length", 0)
  if isinstance(spec, DeepPrefixSpec) and spec.input_prompt is not None:
    input_level = spec.input_prompt.length
  try:
    if reads:
      seam.check_prompt_length(length, inputs_length, reads_input_tokens=True)
    seam.check_prompt_length(input_level, inputs_length, max_encoder_length)
  except ValueError as e:
    raise ConfigError(str(e)) from e


def _init(spec_or_init, embedding, vocabulary, default=None):
  return initializers.resolve(spec_or_init or default, embedding, vocabulary)


# ===== DPT =====

@dataclasses.dataclass(frozen=True)
class DPTSpec(MethodSpec):
  rank: int = 8
  init: str = "uniform"  # 'uniform' (+-0.5, reference code) or 'normal' (paper option)

  def method(self, embedding, vocabulary, config):
    _check_length(self.length)
    if self.rank <= 0:
      raise ConfigError(f"DPT rank r must be > 0, got {self.rank}")
    inits = {"uniform": initializers.symmetric_uniform_init(0.5),
             "normal": initializers.normal_init(0.5)}
    if self.init not in inits:
      raise ConfigError(f"DPT init must be one of {sorted(inits)}, got {self.init!r}")
    return functools.partial(low_rank.LowRankPrompt, length=self.length, rank=self.rank,
                             init_a=inits[self.init], init_b=inits[self.init])

  def num_trainable_params(self, config):
    return low_rank.num_trainable_params(self.length, config.emb_dim, self.rank)


@gin.configurable(module="prompt_jax")
def dpt(length: int = 100, rank: int = 8, init: str = "uniform", placement="prefix") -> DPTSpec:
  """Decomposed prompt tuning: prompt = A [P, r] · B [r, H]."""
  return DPTSpec(length=length, placement=placement, rank=rank, init=init)


# ===== Residual prompt tuning =====

@dataclasses.dataclass(frozen=True)
class ResidualSpec(MethodSpec):
  bottleneck: int = 400
  separate_mlps: bool = False
  dropout_rate: float = 0.0
  init: Any = None  # a spec or closure; default sampled vocabulary

  def method(self, embedding, vocabulary, config):
    _check_length(self.length)
    if self.bottleneck <= 0:
      raise ConfigError(f"residual MLP bottleneck must be > 0, got {self.bottleneck}")
    init = _init(self.init, embedding, vocabulary, initializers.from_sampled_vocab())
    return functools.partial(residual.ResidualPrompt, length=self.length,
                             bottleneck=self.bottleneck, separate_mlps=self.separate_mlps,
                             dropout_rate=self.dropout_rate, init=init)

  def num_trainable_params(self, config):
    return residual.num_trainable_params(self.length, config.emb_dim, self.bottleneck,
                                         self.separate_mlps)


@gin.configurable(module="prompt_jax")
def residual_prompt(length: int = 100, bottleneck: int = 400, separate_mlps: bool = False,
                    dropout_rate: float = 0.0, init=None, placement="prefix") -> ResidualSpec:
  """Residual prompt tuning: P0 + LN(W2 relu(W1 P0 + b1) + b2)."""
  return ResidualSpec(length=length, placement=placement, bottleneck=bottleneck,
                      separate_mlps=separate_mlps, dropout_rate=dropout_rate, init=init)


# ===== Prefix / deep prompts =====

@dataclasses.dataclass(frozen=True)
class DeepPrefixSpec(MethodSpec):
  hidden: Optional[int] = None
  dropout_rate: float = 0.0
  input_prompt: Any = None  # optional input-level spec (e.g. prompt_tuning()) used as well
  decoder: bool = False  # also prefixes in the decoder's self-attention

  def factory(self, embedding=None, vocabulary=None, config=None):
    if self.input_prompt is None:
      return None
    return build_factories(self.input_prompt, config, embedding, vocabulary)[0]

  def method(self, embedding, vocabulary, config):
    return None

  def _hook(self, config, num_layers):
    _check_length(self.length, minimum=0)
    if config is None:
      raise ConfigError("deep prefixes need the T5 config (layers, heads, head_dim)")
    if self.hidden is not None and self.hidden <= 0:
      raise ConfigError(f"prefix reparameterisation hidden size must be > 0, got {self.hidden}")
    return functools.partial(prefix.DeepPrefix, length=self.length, num_layers=num_layers,
                             num_heads=config.num_heads, head_dim=config.head_dim,
                             emb_dim=config.emb_dim, hidden=self.hidden,
                             dropout_rate=self.dropout_rate)

  def layer_factory(self, embedding=None, vocabulary=None, config=None):
    return self._hook(config, config.num_encoder_layers if config else 0)

  def decoder_layer_factory(self, embedding=None, vocabulary=None, config=None):
    if not self.decoder:
      return None
    return self._hook(config, config.num_decoder_layers if config else 0)

  def num_trainable_params(self, config):
    n = prefix.num_trainable_params(self.length, config.num_encoder_layers, config.num_heads,
                                    config.head_dim, config.emb_dim, self.hidden)
    if self.decoder:
      n += prefix.num_trainable_params(self.length, config.num_decoder_layers, config.num_heads,
                                       config.head_dim, config.emb_dim, self.hidden)
    if self.input_prompt is not None:
      n += _count(self.input_prompt, config)
    return n


def _count(spec, config) -> int:
  if hasattr(spec, "num_trainable_params"):
    return spec.num_trainable_params(config)
  return spec.length * config.emb_dim  # run_setup.PromptSpec: plain prompt tuning


@gin.configurable(module="prompt_jax")
def deep_prefix(length: int = 10, hidden: Optional[int] = None, dropout_rate: float = 0.0,
                input_prompt=None, decoder: bool = False) -> DeepPrefixSpec:
  """Prefix tuning / P-tuning v2: key/value prefixes in every encoder (and decoder) layer."""
  return DeepPrefixSpec(length=length, hidden=hidden, dropout_rate=dropout_rate,
                        input_prompt=input_prompt, decoder=decoder,
                        trainable_regex=(r"(encoder|decoder)/(prompt|layer_prompts)/.*"
                                         if decoder else DEFAULT_REGEX))


# ===== IDPG =====

@dataclasses.dataclass(frozen=True)
class IDPGSpec(MethodSpec):
  bottleneck: int = 256
  layer_type: str = "dnn"
  phm_n: int = 4
  activation: str = "gelu"
  dropout_rate: float = 0.1
  representation: str = "embedding_mean"
  prompt_init: Any = None  # init of b2, the task prompt [P, H]

  def method(self, embedding, vocabulary, config):
    _check_length(self.length)
    module = functools.partial(
        idpg.IDPG, length=self.length, bottleneck=self.bottleneck, layer_type=self.layer_type,
        phm_n=self.phm_n, activation=self.activation, dropout_rate=self.dropout_rate,
        representation=self.representation,
        prompt_init=_init(self.prompt_init, embedding, vocabulary))
    if config is not None:
      try:
        module(name=None).check(config.emb_dim)
      except ValueError as e:
        raise ConfigError(str(e)) from e
    return module

  def num_trainable_params(self, config):
    return idpg.num_trainable_params(self.length, config.emb_dim, self.bottleneck,
                                     self.layer_type, self.phm_n)


@gin.configurable(module="prompt_jax")
def idpg_prompt(length: int = 5, bottleneck: int = 256, layer_type: str = "dnn",
                phm_n: int = 4, activation: str = "gelu", dropout_rate: float = 0.1,
                representation: str = "embedding_mean", prompt_init=None,
                placement="prefix") -> IDPGSpec:
  """IDPG: a prompt generated per example from M(x) by a bottleneck (dense or PHM) generator."""
  return IDPGSpec(length=length, placement=placement, bottleneck=bottleneck,
                  layer_type=layer_type, phm_n=phm_n, activation=activation,
                  dropout_rate=dropout_rate, representation=representation,
                  prompt_init=prompt_init)


# ===== IPT =====

@dataclasses.dataclass(frozen=True)
class IPTSpec(MethodSpec):
  mode: str = "lookup"
  table_file: Optional[str] = None
  encoder: str = "textcnn"
  rate: float = 1.0
  widths: Sequence[int] = (3, 4, 5)
  filters: int = 100
  hidden: int = 256
  task_prompt_length: int = 0  # > 0: a prompt-tuning prompt before the IPT prompt
  task_prompt_init: Any = None

  @property
  def ipt_length(self) -> int:
    return self.length - self.task_prompt_length

  def method(self, embedding, vocabulary, config):
    _check_length(self.ipt_length)
    if config is None:
      raise ConfigError("IPT needs the T5 config (vocab_size, emb_dim)")
    if self.mode not in ("lookup", "encoder"):
      raise ConfigError(f"IPT mode must be 'lookup' or 'encoder', got {self.mode!r}")
    if self.mode == "encoder" and not self.table_file:
      raise ConfigError("encoder IPT needs IPT_TABLE_FILE (a pretrained table; see "
                        "python -m prompt_jax.prompts.ipt_pretrain)")
    if self.table_file and embedding is not None:
      table = ipt.table_init(self.table_file, config.vocab_size, config.emb_dim)
    else:
      table = initializers.normal_init(0.5)
    module = functools.partial(
        ipt.IPT, length=self.ipt_length, vocab_size=config.vocab_size, mode=self.mode,
        table_init=table, encoder=self.encoder, rate=self.rate, widths=tuple(self.widths),
        filters=self.filters, hidden=self.hidden)
    if not self.task_prompt_length:
      return module
    task = functools.partial(PromptTuning, length=self.task_prompt_length,
                             init=_init(self.task_prompt_init, embedding, vocabulary))
    return functools.partial(seam.Concat, methods=(task, module))

  def num_trainable_params(self, config):
    return (ipt.num_trainable_params(self.ipt_length, config.emb_dim, config.vocab_size,
                                     self.mode, self.encoder, tuple(self.widths), self.filters,
                                     self.hidden)
            + self.task_prompt_length * config.emb_dim)


def ipt_trainable_regex(mode: str, task_prompt_length: int = 0) -> str:
  """The frozen table of encoder IPT must not train: only its text encoder (and task prompt)."""
  if mode != "encoder":
    return DEFAULT_REGEX
  if task_prompt_length:
    return r"encoder/prompt/prompt/(part_0/.*|part_1/text_encoder/.*)"
  return r"encoder/prompt/prompt/text_encoder/.*"


@gin.configurable(module="prompt_jax")
def ipt_prompt(length: int = 5, mode: str = "lookup", table_file: Optional[str] = None,
               encoder: str = "textcnn", rate: float = 1.0, widths: Sequence[int] = (3, 4, 5),
               filters: int = 100, hidden: int = 256, task_prompt_length: int = 0,
               task_prompt_init=None, placement="prefix") -> IPTSpec:
  """IPT: random/pretrained table lookup or encoder IPT (see prompts/ipt.py)."""
  return IPTSpec(length=length, placement=placement,
                 trainable_regex=ipt_trainable_regex(mode, task_prompt_length), mode=mode,
                 table_file=table_file, encoder=encoder, rate=rate, widths=tuple(widths),
                 filters=filters, hidden=hidden, task_prompt_length=task_prompt_length,
                 task_prompt_init=task_prompt_init)


@dataclasses.dataclass(frozen=True)
class MultiLayerIDPGSpec(IDPGSpec):
  version: str = "M"
  generator_input: str = "representation"

  def method(self, embedding, vocabulary, config):
    _check_length(self.length)
    if self.placement != "prefix":
      raise ConfigError("M-IDPG overwrites the first PROMPT_LENGTH positions: placement must be "
                        f"'prefix', got {self.placement!r}")
    return functools.partial(idpg.Placeholder, length=self.length)

  def layer_factory(self, embedding=None, vocabulary=None, config=None):
    if config is None:
      raise ConfigError("M-IDPG needs the T5 config (number of encoder layers)")
    module = functools.partial(
        idpg.MultiLayerIDPG, length=self.length, num_layers=config.num_encoder_layers,
        bottleneck=self.bottleneck, version=self.version, layer_type=self.layer_type,
        phm_n=self.phm_n, activation=self.activation, dropout_rate=self.dropout_rate,
        generator_input=self.generator_input,
        prompt_init=_init(self.prompt_init, embedding, vocabulary))
    try:
      module(name=None).check(config.emb_dim)
    except ValueError as e:
      raise ConfigError(str(e)) from e
    return module

  def num_trainable_params(self, config):
    return idpg.num_trainable_params_multilayer(
        self.length, config.emb_dim, self.bottleneck, config.num_encoder_layers, self.version,
        self.layer_type, self.phm_n)


@gin.configurable(module="prompt_jax")
def idpg_multilayer(length: int = 5, bottleneck: int = 256, version: str = "M",
                    layer_type: str = "dnn", phm_n: int = 4, activation: str = "gelu",
                    dropout_rate: float = 0.1, generator_input: str = "representation",
                    prompt_init=None) -> MultiLayerIDPGSpec:
  """M-IDPG: generated prompts in every encoder layer (versions S, M, L)."""
  return MultiLayerIDPGSpec(length=length, bottleneck=bottleneck, layer_type=layer_type,
                            phm_n=phm_n, activation=activation, dropout_rate=dropout_rate,
                            prompt_init=prompt_init, version=version,
                            generator_input=generator_input)
