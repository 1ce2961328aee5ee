"""The one spec type: a prompt method before the frozen model is loaded.

A method is one Flax module (prompts/<method>.py, no gin) + one spec (prompts/specs/<method>.py,
its gin registration) + one gin file (gin/prompts/<method>.gin, the paper's main setting). The
spec is all the rest of the code needs to know about a method:

  spec.trainable_regex          what trains (paths of '/'-joined parameter names)
  spec.input_positions          how many positions it adds to the encoder input (P; 0 for prefixes)
  spec.reads_input_tokens       whether its prompt is read off the first input tokens (IPT) ...
  spec.required_inputs_length   ... and so how long the `inputs` feature must at least be
  spec.check_fits(inputs_length, max_encoder_length=None)   one ConfigError if it does not fit
  spec.representation_pooling   'mean' / 'first' if it reads the frozen encoder's pooled output
                                (IDPG's M(x): the trainer then caches it per example), else None
  spec.num_trainable_params(config)   its parameter-count formula (= what `describe` counts)
  spec.model_kwargs(backbone)   the keyword arguments of `T5(config, **kwargs)`: the input-level
                                `prompt`, the encoder hook `layer_prompts`, the decoder hook
                                `decoder_layer_prompts`, the decoder's cross-attention hook
                                `decoder_cross_prompts`, `representation_pooling` (those it uses)
  spec.summaries(trainable_params) -> {name: scalar}   computed on device at each stats period
                                (e.g. the DPT rank probe's rank); {} by default
  spec.input_dependent          whether the prompt is generated from each input (IDPG, IPT)
  spec.visibility               the encoder's prompt/input attention visibility (None: full)
  spec.auxiliary_loss(backbone) None, or `fn(trainable, frozen) -> scalar` added to the train
                                loss (wayward prompts' distance to a discrete prompt)
  spec.check_features(names)    one ConfigError if the task's features lack what the method reads
                                (before anything is written); no-op
  spec.check_batch(batch)       one ConfigError if a host batch lacks what the method reads
                                (multi-task methods: `task_ids` within [0, num_tasks)); no-op
  spec.fold(params, config)     an input-independent method's trained parameters as plain arrays
                                ('prompt' [P, H], 'prefix' / 'decoder_prefix' / 'cross_prefix'
                                [2, L, P, D]):
                                what `export`, prompt files and ensembles read

`Backbone` is what a spec may read of the frozen model when it builds its modules: the T5 config
and, once restored, the embedding table, the vocabulary and the frozen parameters (None when only
shapes are wanted, e.g. `prompt-jax describe`).
Subclasses implement `check(config)` (bad input -> ConfigError, config may be None), `method`,
and optionally `layer_hook` / `decoder_layer_hook` / `decoder_cross_hook`.
"""
import dataclasses
import functools
from typing import Any, Callable, Dict, Mapping, Optional

import numpy as np

from prompt_jax.errors import ConfigError, check_integer
from prompt_jax.models import T5Config
from prompt_jax.prompts import initializers, seam, visibility

PyTree = Any
ModuleFactory = Callable[..., Any]
DEFAULT_REGEX = r"encoder/(prompt|layer_prompts)/.*"


@dataclasses.dataclass(frozen=True)
class Backbone:
  """The frozen model as far as a spec may read it (None fields: not loaded, shapes only)."""
  config: Optional[T5Config]
  embedding: Optional[np.ndarray] = None  # [V, H] float32
  vocabulary: Any = None
  params: Optional[PyTree] = None  # the frozen backbone's parameters (nested dict)

  @property
  def shapes_only(self) -> bool:
    """True when values do not matter (abstract shapes, `describe`)."""
    return self.embedding is None


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


def resolve_init(init_spec, backbone: Backbone,
                 default=None) -> initializers.PromptInit:
  """The closure of an initialiser spec (`spec(embedding=, vocabulary=) -> closure`, e.g.
  `initializers.from_sampled_vocab()`); any closure when only shapes are wanted."""
  init_spec = init_spec or default or initializers.uniform()
  if backbone.shapes_only:
    return initializers.uniform_init()
  return init_spec(embedding=backbone.embedding, vocabulary=backbone.vocabulary)


def check_length(length: int, minimum: int = 1, what: str = "PROMPT_LENGTH") -> None:
  check_integer(length, what, minimum)


def check_dropout(rate: Any, method: str) -> None:
  """A method's dropout rate in [0, 1): flax drops every unit at 1 and scales by 1 / (1 - rate),
  so a rate of 1.5 trained on silently."""
  if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
    raise ConfigError(f"{method}'s dropout rate must be in [0, 1) (the share of units "
                      f"dropped), got {rate!r}")


def config_error(fn: Callable[[], Any]) -> Any:
  """Runs a module-level check, turning its ValueError into a one-line ConfigError."""
  try:
    return fn()
  except ValueError as e:
    raise ConfigError(str(e)) from e


@dataclasses.dataclass(frozen=True)
class MethodSpec:
  """The one spec base class (see the module docstring)."""
  length: int
  placement: Any = "prefix"
  # The encoder's prompt/input attention visibility (prompts/visibility.py names, a list or a
  # comma-separated string); None: full visibility. Set per run by `model_spec.visibility`.
  visibility: Any = None
  MIN_LENGTH = 1  # the smallest PROMPT_LENGTH the method takes (a class constant, not a field)

  # ----- what the trainer reads -----

  @property
  def trainable_regex(self) -> str:
    return DEFAULT_REGEX

  @property
  def input_positions(self) -> int:
    """Positions added to the encoder input by the input-level prompt."""
    return self.length

  @property
  def reads_input_tokens(self) -> bool:
    return False

  @property
  def required_inputs_length(self) -> int:
    """The shortest `inputs` feature length the method works with (0: any)."""
    return self.input_positions if self.reads_input_tokens else 0

  @property
  def representation_pooling(self) -> Optional[str]:
    return None

  @property
  def input_dependent(self) -> bool:
    """True when the prompt is generated from each input: there is no fixed prompt to fold."""
    return self.reads_input_tokens

  @property
  def no_fixed_prompt(self) -> str:
    """Why an `input_dependent` method has no single [P, H] prompt ('IDPG generates its prompt
    from each input'), for messages."""
    return f"{self.name} generates its prompt from each input"

  @property
  def name(self) -> str:
    """The method's name in messages."""
    return type(self).__name__.removesuffix("Spec")

  def num_trainable_params(self, config: T5Config) -> int:
    raise NotImplementedError

  def fold(self, params: Mapping[str, Any], config: T5Config) -> Dict[str, Any]:
    """{name: array} of the trained method as plain arrays, from the trained parameter tree
    `params` (nested, model paths: params['encoder']['prompt']['prompt'][...])."""
    del params, config
    if self.input_dependent:
      raise ConfigError(f"{self.no_fixed_prompt}: there is no fixed prompt to export (evaluate "
                        f"or infer with its MODEL_DIR instead)")
    raise ConfigError(f"{self.name} cannot be folded into plain prompt arrays")

  def auxiliary_loss(self, backbone: "Backbone") -> Optional[Callable[[PyTree, PyTree], Any]]:
    """None, or `fn(trainable params, frozen params) -> scalar` (nested trees) that the train
    step adds to the task loss (e.g. wayward prompts' gamma * distance)."""
    del backbone
    return None

  def check_features(self, names) -> None:
    """One ConfigError if the task's output features (names) lack what the method reads."""
    del names

  def check_batch(self, batch: Mapping[str, Any]) -> None:
    """One ConfigError if the host batch (numpy, before it goes to the devices) lacks what the
    method reads; most methods read only the tokens."""
    del batch

  def summaries(self, trainable_params: Mapping[str, Any]) -> Dict[str, Any]:
    """{name: scalar} of the trainable parameters (nested dict), computed on device."""
    del trainable_params
    return {}

  def check_fits(self, inputs_length: int, max_encoder_length: Optional[int] = None) -> None:
    """One ConfigError if the prompt does not fit the task's `inputs` feature length."""
    check_length(self.length, self.MIN_LENGTH)  # (before any property computes with it)
    try:
      if self.reads_input_tokens:
        seam.check_prompt_length(self.required_inputs_length, inputs_length,
                                 reads_input_tokens=True)
      seam.check_prompt_length(self.input_positions, inputs_length, max_encoder_length)
    except ValueError as e:
      raise ConfigError(str(e)) from e

  # ----- what subclasses implement -----

  def check(self, config: Optional[T5Config]) -> None:
    """Raises one ConfigError for a bad configuration (config-dependent checks need config)."""
    check_length(self.length, self.MIN_LENGTH)
    config_error(lambda: visibility.parse(self.visibility))

  def method(self, backbone: Backbone) -> Optional[ModuleFactory]:
    """The input-level method's factory (`factory(name=...)`), or None."""
    raise NotImplementedError

  def layer_hook(self, backbone: Backbone) -> Optional[ModuleFactory]:
    return None

  def decoder_layer_hook(self, backbone: Backbone) -> Optional[ModuleFactory]:
    return None

  def decoder_cross_hook(self, backbone: Backbone) -> Optional[ModuleFactory]:
    """The decoder's cross-attention prefix hook (`T5.decoder_cross_prompts`), or None."""
    return None

  # ----- built from the above -----

  def prompt_factory(self, backbone: Backbone) -> Optional[ModuleFactory]:
    method = self.method(backbone)
    if method is None:
      return None
    return seam.prompt_factory(method, self.input_positions,
                               resolve_placement(self.placement, backbone.vocabulary),
                               config_error(lambda: visibility.parse(self.visibility)))

  def model_kwargs(self, backbone: Backbone) -> Dict[str, Any]:
    """`T5(config, **spec.model_kwargs(backbone))`."""
    self.check(backbone.config)
    out = {"prompt": self.prompt_factory(backbone),
           "layer_prompts": self.layer_hook(backbone),
           "decoder_layer_prompts": self.decoder_layer_hook(backbone),
           "decoder_cross_prompts": self.decoder_cross_hook(backbone),
           "representation_pooling": self.representation_pooling}
    return {k: v for k, v in out.items() if v is not None}

  def factory(self, embedding=None, vocabulary=None, config=None) -> Optional[ModuleFactory]:
    """The input-level `prompt` factory alone (checks the spec first)."""
    self.check(config)
    return self.prompt_factory(Backbone(config, embedding, vocabulary))


def model_kwargs(spec: Optional[MethodSpec], config: T5Config, embedding=None,
                 vocabulary=None, params=None) -> Dict[str, Any]:
  """`T5(config, **model_kwargs(spec, config, ...))`; {} for no prompt (full fine-tuning)."""
  if spec is None:
    return {}
  return spec.model_kwargs(Backbone(config, embedding, vocabulary, params))


def check_fits(spec: MethodSpec, inputs_length: int,
               max_encoder_length: Optional[int] = None) -> None:
  spec.check_fits(inputs_length, max_encoder_length)


def input_prompt(params: Mapping[str, Any]) -> Mapping[str, Any]:
  """The input-level method's trained parameters: `encoder/prompt/prompt/...`."""
  return params["encoder"]["prompt"]["prompt"]


def partial(cls, **kwargs) -> ModuleFactory:
  """A module factory `factory(name=...)`."""
  return functools.partial(cls, **kwargs)
