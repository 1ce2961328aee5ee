"""Run set-up shared by train, eval, infer and describe: the model of a run, built from gin.

  prompt_jax.t5_config.preset = 't5_1_1_large'           (gin/models/*.gin)
  prompt_jax.prompt_tuning.length = %PROMPT_LENGTH       (gin/runs/defaults.gin)
  prompt_jax.model_spec.prompt = @prompt_jax.dpt()       (gin/prompts/<method>.gin; default:
                                                          prompt tuning, prompts/specs/tuning.py)

The prompt is a method spec (`prompts.specs.MethodSpec`): it says what trains, what input length
it needs, how many parameters it has and which modules the model gets; nothing here knows a
method by name.

`prepare(...)` validates the configuration and restores the frozen backbone (sharded, never a
whole-model init) *before* anything is written to MODEL_DIR, so a bad configuration leaves no
trace. It sits above models/, prompts/ and checkpoints/ and below train/ and evaluation/.
"""
import contextlib
import dataclasses
import logging
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
from jax.extend import core as jax_core
import numpy as np
from jax.sharding import Mesh

from prompt_jax import checkpoints
from prompt_jax import partitioning
from prompt_jax import trees
from prompt_jax import vocab as vocab_lib
from prompt_jax.errors import ConfigError, check_integer
from prompt_jax.models import T5, T5Config, float32_params, get_config
from prompt_jax.models import layers
from prompt_jax.models import random_init
from prompt_jax.prompts import specs

Array = jax.Array
PyTree = Any
DEFAULT_TRAINABLE_REGEX = specs.DEFAULT_REGEX

# float64 is for reference computations (tests derive float32 error bounds from a float64 run).
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16,
           "float64": jnp.float64}


def dtype_of(name) -> Any:
  if not isinstance(name, str):
    return name
  if name not in _DTYPES:
    raise ConfigError(f"unknown dtype {name!r}; choose one of {sorted(_DTYPES)}")
  if name == "float64" and not jax.config.jax_enable_x64:
    raise ConfigError("dtype 'float64' needs 64-bit JAX: set JAX_ENABLE_X64=1")
  return _DTYPES[name]


AUTO = "auto"


def frozen_dtypes(name, config: T5Config) -> Tuple[Any, Dict[str, Any]]:
  """FROZEN_DTYPE's (dtype, {path: dtype} exceptions) for the frozen weights.

  'auto' (the default) holds each in the dtype the model uses it in: the activation dtype
  `config.dtype` (bfloat16 for the presets, as t5x's activations, so on accelerators), and at
  least float32 for the few it uses in float32 (`models.float32_params`: T5 1.1's output
  projection). The model casts every other weight to the activation dtype before use, so this
  changes no result and halves the frozen weights' memory under bfloat16 (T5 1.1 XXL: 22 GB
  instead of 44 GB) with no cast of them inside each step. A named dtype applies to all.
  """
  if name != AUTO:
    return dtype_of(name), {}
  wide = jnp.promote_types(config.dtype, jnp.float32).type
  return jnp.dtype(config.dtype).type, {path: wide for path in float32_params(config)}


@gin.configurable(module="prompt_jax")
def t5_config(preset: str = gin.REQUIRED, dropout_rate: Optional[float] = None,
              dtype: str = "bfloat16", vocab_size: Optional[int] = None,
              **overrides) -> T5Config:
  """A T5 preset (models/config.py PRESETS) with run-level overrides."""
  if dropout_rate is not None:
    overrides["dropout_rate"] = dropout_rate
  if vocab_size is not None:
    overrides["vocab_size"] = vocab_size
  try:
    return get_config(preset, dtype=dtype_of(dtype), **overrides)
  except (ValueError, TypeError) as e:
    raise ConfigError(str(e)) from e


def build_model(config: T5Config, prompt: Optional[specs.MethodSpec], embedding=None,
                vocabulary=None, params=None) -> T5:
  """T5 with the modules of the method spec `prompt` (input-level prompt, per-layer hooks);
  `embedding`/`vocabulary`/`params` (the frozen backbone) None: shapes only."""
  return T5(config, **specs.model_kwargs(prompt, config, embedding, vocabulary, params))


DEFAULT_PROMPT = "prompt_tuning"  # model_spec's default: Lester et al.'s prompt tuning


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """The model of a run (t5x's MODEL): backbone config, prompt, what trains, frozen dtype."""
  config: T5Config
  prompt: Optional[specs.MethodSpec]
  trainable_regex: str
  frozen_dtype: str = AUTO


@gin.configurable(module="prompt_jax")
def model_spec(config: Optional[T5Config] = None, prompt: Any = DEFAULT_PROMPT,
               trainable_regex: Optional[str] = None,
               frozen_dtype: str = AUTO, visibility: Any = None) -> ModelSpec:
  """`config` defaults to the gin-configured `t5_config()` (set by gin/models/*.gin).

  `prompt` defaults to the gin-configured `prompt_tuning()` (runs/defaults.gin binds it, so a
  run's config.gin names its method); a method's gin file (gin/prompts/<method>.gin) binds
  another spec, `runs/model_finetune.gin` binds None. The CLI parses defaults.gin first and
  method files after run files, so a method file works whatever its position among the
  --gin_file flags.
  `trainable_regex` (TRAINABLE_REGEX) None: the prompt method's own regex.
  `visibility` (gin/prompts/visibility.gin): the encoder's prompt/input attention visibility
  (prompts/visibility.py names); None: the method's own (full visibility).
  """
  if prompt is DEFAULT_PROMPT:
    prompt = specs.prompt_tuning()
  if visibility is not None:
    if prompt is None or not prompt.input_positions:
      raise ConfigError("attention visibility needs an input-level prompt; drop "
                        "prompts/visibility.gin (or PROMPT_VISIBILITY) for this method")
    prompt = dataclasses.replace(prompt, visibility=visibility)
    prompt.check(None)
  if trainable_regex is None:
    trainable_regex = prompt.trainable_regex if prompt is not None else DEFAULT_TRAINABLE_REGEX
  return ModelSpec(config if config is not None else t5_config(), prompt, trainable_regex,
                   frozen_dtype)


# ===== The parameters of a run =====

def model_inputs(batch_size: int, feature_lengths: Mapping[str, int]) -> Tuple[Array, ...]:
  """Dummy (encoder_input_tokens, decoder_input_tokens, decoder_target_tokens) for init."""
  enc = jnp.ones((batch_size, feature_lengths["inputs"]), jnp.int32)
  dec = jnp.ones((batch_size, feature_lengths["targets"]), jnp.int32)
  return enc, dec, dec


def abstract_variables(model: nn.Module, feature_lengths: Mapping[str, int]) -> PyTree:
  """Boxed abstract `params` of `model` (shapes and logical axes, nothing allocated)."""
  inputs = model_inputs(1, feature_lengths)
  with layers.accelerator_products():  # the same parameters, a cheaper trace (bfloat16 on CPU)
    return jax.eval_shape(
        lambda: model.init(jax.random.PRNGKey(0), *inputs, enable_dropout=False))["params"]


def param_shardings(boxed_params: PyTree, mesh: Mesh) -> PyTree:
  """NamedShardings of every parameter from its logical axes (t5x rules + prompt rules)."""
  specs = partitioning.logical_specs(boxed_params)
  return partitioning.logical_to_sharding(specs, mesh)


@dataclasses.dataclass
class Run:
  """Everything built for one run. Trees are nested dicts of (sharded) jax.Arrays."""
  mesh: Mesh
  config: T5Config
  model: nn.Module
  trainable: PyTree
  frozen: PyTree
  trainable_shardings: PyTree
  frozen_shardings: PyTree
  # Trainable parameters `prepare(init_trainable=False)` did not initialise, because a
  # checkpoint of the run will overwrite them (resume, eval): in `trainable` they are placed
  # shapes (jax.ShapeDtypeStruct, which no jitted function accepts) until `initialise_deferred`.
  deferred: Tuple[str, ...] = ()
  deferred_init: Optional[Callable[[], Dict[str, Array]]] = dataclasses.field(
      default=None, repr=False)


def initialise_deferred(run: Run) -> Run:
  """`run` with its deferred trainable parameters initialised: the values `prepare` with
  `init_trainable=True` gives (the same initialisers and key). A run resuming from a checkpoint
  it could not restore falls back to this."""
  if run.deferred:
    flat = trees.flatten(run.trainable)
    flat.update(run.deferred_init())
    run.trainable = trees.unflatten(flat)
    run.deferred, run.deferred_init = (), None
  return run


def backbone_paths(config: T5Config) -> set:
  return set(trees.flatten(checkpoints.expected_shapes(config)))


def check_batch(batch_size: int, mesh: Optional[Mesh]) -> None:
  """One ConfigError unless BATCH_SIZE is a positive integer the mesh and processes divide
  (mesh None: the value alone, before the run's devices are known, as `sweep` checks it)."""
  check_integer(batch_size, "BATCH_SIZE", 1)
  if mesh is None:
    return
  data_parallel = mesh.shape["data"]
  if batch_size % data_parallel:
    raise ConfigError(
        f"BATCH_SIZE={batch_size} is not divisible by the data-parallel size {data_parallel} "
        f"({jax.device_count()} devices / {mesh.shape['model']} model partitions)")
  if batch_size % jax.process_count():
    raise ConfigError(f"BATCH_SIZE={batch_size} is not divisible by the "
                      f"{jax.process_count()} processes")


EMBEDDING = "token_embedder/embedding"


@dataclasses.dataclass(frozen=True)
class Layout:
  """A run's parameters before any is read or initialised: nested jax.ShapeDtypeStructs (model
  paths) with the shapes, dtypes and shardings `prepare` gives the arrays, so the train step
  can be compiled while the checkpoint is read. `layout()` builds it; `prepare` fills it."""
  trainable: PyTree
  frozen: PyTree
  abstract_model: nn.Module
  shardings: Mapping[str, Any]  # flat, every parameter
  dtypes: Mapping[str, Any]  # flat, every parameter: the dtype it is held in


def layout(*, config: T5Config, prompt: Optional[specs.MethodSpec],
           feature_lengths: Mapping[str, int], trainable_regex: str, mesh: Mesh,
           frozen_dtype: str = AUTO) -> Layout:
  """The `Layout` of a run (one abstract init of the model: nothing allocated)."""
  if prompt is not None:
    prompt.check_fits(feature_lengths["inputs"])
  abstract_model = build_model(config, prompt)
  boxed = abstract_variables(abstract_model, feature_lengths)
  shardings = trees.flatten(param_shardings(boxed, mesh))
  shapes = trees.flatten(trees.unbox(boxed))
  partitioning.check_divisible(shapes, shardings)
  frozen_dt, frozen_exceptions = frozen_dtypes(frozen_dtype, config)
  # Trainable parameters and their optimizer state in float32 (float64 in a float64 run).
  trainable_dt = jnp.promote_types(jnp.float32, config.dtype)
  dtypes = {p: (trainable_dt if trees.is_trainable(p, trainable_regex)
                else frozen_exceptions.get(p, frozen_dt)) for p in shardings}
  placed = lambda names: trees.unflatten({
      p: jax.ShapeDtypeStruct(shapes[p].shape, dtypes[p], sharding=shardings[p]) for p in names})
  trainable = [p for p in shardings if trees.is_trainable(p, trainable_regex)]
  if not trainable:
    backbone = backbone_paths(config)
    raise ConfigError(f"TRAINABLE_REGEX {trainable_regex!r} matches no parameter; "
                      f"parameters include {sorted(shardings)[:3]}... and "
                      f"{sorted(p for p in shardings if p not in backbone)}")
  return Layout(trainable=placed(trainable),
                frozen=placed([p for p in shardings if p not in trainable]),
                abstract_model=abstract_model, shardings=shardings, dtypes=dtypes)


def step_model(config: T5Config, prompt: Optional[specs.MethodSpec], vocabulary=None) -> T5:
  """The model the train step runs: `build_model` without the backbone's values, which only
  initialisers read (`prepare`'s model holds them to initialise the prompt); the vocabulary,
  which a placement such as 'between:<text>' reads in the forward pass, it has. Its step is
  the same program as with `prepare`'s model (tests/train/test_step_model.py, every method),
  and can be built before the checkpoint is read."""
  return build_model(config, prompt, vocabulary=vocabulary)


def check_sources(config: T5Config, vocabulary, initial_checkpoint_path: Optional[str]) -> None:
  """The ConfigErrors `prepare` raises, in its order, before it reads any weight: a vocabulary
  with more ids than the embedding table has rows, a path that is not a checkpoint of `config`'s
  shapes (read from the checkpoint's metadata alone). `train` calls it before it starts
  compiling the step, so such an error comes at once."""
  _check_vocabulary(vocabulary, config)
  if initial_checkpoint_path:
    with _checkpoint_errors(initial_checkpoint_path):
      checkpoints.check(initial_checkpoint_path, config)


def _check_vocabulary(vocabulary, config: T5Config) -> None:
  if vocabulary is not None:
    try:
      vocab_lib.check_fits(vocabulary, config.vocab_size)
    except ValueError as e:
      raise ConfigError(str(e)) from e


@contextlib.contextmanager
def _checkpoint_errors(path: str):
  try:
    yield
  except checkpoints.CheckpointError as e:
    raise ConfigError(f"INITIAL_CHECKPOINT_PATH: {e}") from e
  except (OSError, ValueError) as e:
    raise ConfigError(f"INITIAL_CHECKPOINT_PATH {path!r} cannot be read: {e}") from e


def prepare(*, config: T5Config, prompt: Optional[specs.MethodSpec],
            feature_lengths: Mapping[str, int], initial_checkpoint_path: Optional[str],
            trainable_regex: str, mesh: Mesh, vocabulary=None, random_seed: int = 0,
            frozen_dtype: str = AUTO, planned: Optional[Layout] = None,
            init_trainable: bool = True, read_inits: bool = True) -> Run:
  """Restores the frozen backbone (sharded) and initialises what it lacks (the prompt).

  The frozen weights are held in `frozen_dtypes(frozen_dtype, config)`; the prompt's
  initialisers that read the vocabulary's embeddings get them in float32 all the same.
  `planned`: the run's `layout(...)` of the same arguments, if the caller already made it.
  `init_trainable=False`: the trainable parameters the checkpoint lacks are left to a checkpoint
  of the run (`Run.deferred`): nothing is compiled for them, and the whole model's init (traced
  to initialise a prompt, the larger part of a restart's set-up after the read) is traced only
  until their initialisers have run, for the errors those raise. Frozen ones the checkpoint
  lacks are initialised all the same: no train checkpoint holds them.
  `read_inits=False` (with `init_trainable=False`: eval / infer of a checkpoint, which has no
  init to fall back to, unlike a resumed `train`): when every parameter outside the backbone
  trains, hence comes from the checkpoint, the method's initialisers are built from shapes only
  (`inits_from_shapes`), so none reads what the run started from (PROMPT_FILE, DPT_PROMPT_FILE,
  IPT_TABLE_FILE, ...: moved, deleted, or on another machine)."""
  _check_vocabulary(vocabulary, config)
  planned = planned or layout(config=config, prompt=prompt, feature_lengths=feature_lengths,
                              trainable_regex=trainable_regex, mesh=mesh,
                              frozen_dtype=frozen_dtype)
  abstract_model, shardings = planned.abstract_model, planned.shardings
  backbone = backbone_paths(config)
  init_rng = jax.random.fold_in(jax.random.PRNGKey(random_seed), 0)
  # What trains is read in its own dtype (full fine-tuning starts from the float32 weights).
  load_dtypes = {p: planned.dtypes[p] for p in backbone}
  # Prompt inits from vocabulary embeddings (Lester et al.) read the checkpoint's float32
  # values, not their bfloat16 rounding: the [vocab, embed] table is read in float32, copied to
  # the host, and only then cast to the dtype it is held in (one read of it, not two).
  held_embedding = load_dtypes.get(EMBEDDING)
  if held_embedding is not None:
    load_dtypes[EMBEDDING] = jnp.promote_types(jnp.float32, held_embedding)

  embedding = None
  if initial_checkpoint_path:
    with _checkpoint_errors(initial_checkpoint_path):
      _, loaded = checkpoints.load(initial_checkpoint_path, config, dtypes=load_dtypes,
                                   shardings=lambda path: shardings[path])
    loaded = trees.flatten(loaded)
    if held_embedding is not None:
      embedding = partitioning.to_host(loaded[EMBEDDING]).astype(np.float32)
      loaded[EMBEDDING] = _as(loaded[EMBEDDING], held_embedding)
  else:
    logging.warning("INITIAL_CHECKPOINT_PATH is empty: the backbone is randomly initialised")
    loaded = random_backbone(abstract_model, feature_lengths, init_rng, shardings,
                             keep=lambda p: p in backbone)

  missing = [p for p in shardings if p not in backbone]
  from_shapes = not read_inits and not init_trainable and inits_from_shapes(missing,
                                                                           trainable_regex)
  if from_shapes:
    model = build_model(config, prompt, None, vocabulary, params=trees.unflatten(loaded))
  else:
    if embedding is None and EMBEDDING in loaded:
      embedding = partitioning.to_host(loaded[EMBEDDING]).astype(np.float32)
    model = build_model(config, prompt, embedding, vocabulary, params=trees.unflatten(loaded))
  deferred = () if init_trainable else tuple(
      p for p in missing if trees.is_trainable(p, trainable_regex))

  def init(names):
    return {k: v.astype(planned.dtypes[k]) for k, v in
            _init(model, feature_lengths, init_rng, shardings, names).items()}

  rest = [p for p in missing if p not in deferred]
  # The deferred initialisers' checks still hold (a PROMPT_FILE of another shape, ...); an init
  # of `rest` traces every initialiser anyway.
  if deferred and not rest and not from_shapes:
    _check_initialisers(model, feature_lengths, init_rng, mesh, deferred)
  params = dict(loaded)
  params.update(init(rest))
  trainable = {k: v for k, v in params.items() if trees.is_trainable(k, trainable_regex)}
  frozen = {k: _as(v, planned.dtypes[k]) for k, v in params.items() if k not in trainable}
  trainable = {k: _as(v, planned.dtypes[k]) for k, v in trainable.items()}
  placed = trees.flatten(planned.trainable)
  trainable.update({p: placed[p] for p in deferred})
  return Run(mesh=mesh, config=config, model=model,
             trainable=trees.unflatten(trainable), frozen=trees.unflatten(frozen),
             trainable_shardings=trees.unflatten({k: shardings[k] for k in trainable}),
             frozen_shardings=trees.unflatten({k: shardings[k] for k in frozen}),
             deferred=deferred,
             deferred_init=(_no_init if from_shapes else lambda: init(list(deferred)))
             if deferred else None)


def _no_init():
  raise ConfigError("prepare(read_inits=False) built the prompt's initialisers from shapes "
                    "only: its parameters must come from a checkpoint")


def inits_from_shapes(non_backbone: Sequence[str], trainable_regex: str) -> bool:
  """Whether a model whose trainable parameters a checkpoint restores may build its method's
  initialisers from shapes only (`build_model` without the embedding table: uniform, reading no
  file): yes unless a parameter outside the backbone is frozen (an encoder IPT's table, a prompt
  TRAINABLE_REGEX leaves out), whose value no checkpoint holds and only its initialiser gives."""
  return all(trees.is_trainable(p, trainable_regex) for p in non_backbone)


def _as(x: Array, dtype) -> Array:
  return x if x.dtype == dtype else x.astype(dtype)


class _Initialised(Exception):
  """Every parameter `_check_initialisers` waits for is initialised: stop tracing."""


def _check_initialisers(model, feature_lengths, rng, mesh, names) -> None:
  """Raises what initialising the parameters `names` would raise (a ConfigError of the prompt's
  initialiser: class labels that do not fit, a PROMPT_FILE of another shape), without the
  whole model's trace: the abstract init stops once every one of them has been initialised
  (for a prompt at the encoder's input, right after the embedding lookup)."""
  waiting = set(names)

  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    module = context.module
    if module.scope is not None:
      prefix = "/".join(module.path)
      for name in trees.flatten(trees.unbox(module.variables.get("params", {}))):
        waiting.discard(f"{prefix}/{name}" if prefix else name)
      if not waiting:
        raise _Initialised()
    return out

  inputs = model_inputs(1, feature_lengths)
  try:
    with partitioning.axis_rules(mesh), layers.accelerator_products(), \
        nn.intercept_methods(interceptor):
      jax.eval_shape(lambda: model.init(rng, *inputs, enable_dropout=False))
  except _Initialised:
    pass


def _init(model, feature_lengths, rng, shardings, names) -> dict:
  """Initialises only the parameters `names` (the prompt's), placed by their shardings.

  The init is traced to a jaxpr once (Python only, like `eval_shape`; the whole model's trace
  is most of this function's time: the caller knows the names from its own abstract init) and
  only the named outputs' slice of it is compiled (jit's DCE drops the backbone and the forward
  pass). Arrays the initialisers close over (e.g. the frozen embedding table a sampled-vocabulary
  prompt draws from, [V, H]) are passed to the program as arguments instead of being baked into
  it as constants (a 98 MB literal for T5 base); the PRNG key is an argument too.
  """
  if not names:
    return {}
  inputs = model_inputs(1, feature_lengths)

  def init(rng):
    params = trees.flatten(trees.unbox(
        model.init(rng, *inputs, enable_dropout=False)["params"]))
    return {k: params[k] for k in names}

  mesh = shardings[next(iter(shardings))].mesh
  # The plain products: the same parameters, a cheaper trace (bfloat16 on CPU; the forward
  # pass is dropped from the compiled slice either way).
  with partitioning.axis_rules(mesh), layers.accelerator_products():
    closed = jax.make_jaxpr(init, return_shape=False)(rng)
    out_tree = jax.tree_util.tree_structure({k: 0 for k in names})
    consts = list(closed.consts)

    def kept(consts, rng):
      leaves = jax_core.jaxpr_as_fun(jax_core.ClosedJaxpr(closed.jaxpr, consts))(rng)
      return jax.tree_util.tree_unflatten(out_tree, leaves)

    return jax.jit(kept, out_shardings={k: shardings[k] for k in names})(consts, rng)


def random_backbone(model: nn.Module, feature_lengths: Mapping[str, int], rng: Array,
                    shardings: Mapping[str, Any], keep) -> dict:
  """Random parameters (tests, bench), filled array by array with the model's own initialisers
  and keys passed as arguments (models/random_init.py): no whole-model init is compiled."""
  inputs = model_inputs(1, feature_lengths)
  with partitioning.axis_rules(shardings[next(iter(shardings))].mesh):
    inits = random_init.initialisers(model, *inputs, enable_dropout=False)
  return random_init.fill(inits, rng, keep, shardings)




def count(tree: PyTree) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(tree)))


def count_by_dtype(tree: PyTree) -> str:
  """'60,511,616 bfloat16, 16,449,536 float32': the parameters of `tree` per dtype."""
  counts: Dict[str, int] = {}
  for x in jax.tree_util.tree_leaves(tree):
    name = np.dtype(x.dtype).name
    counts[name] = counts.get(name, 0) + int(np.prod(x.shape))
  return ", ".join(f"{n:,} {name}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1]))
