"""DPT (Xiao et al. 2023) and its rank probe (their Section 2).

gin: `prompt_jax.dpt` (gin/prompts/dpt.gin), `prompt_jax.dpt_rank_probe`
(gin/prompts/dpt_rank_probe.gin).
"""
import dataclasses
import math
from typing import Any, Optional

import gin

from prompt_jax.errors import ConfigError
from prompt_jax.prompts import initializers, low_rank
from prompt_jax.prompts.specs import base

INITS = ("normal", "uniform", "svd")
# XYaoooo/DPT modeling_t5.py init_prefix_weights: A and B drawn from U(-0.5, 0.5).
REFERENCE_HALF_WIDTH = 0.5


def _check_rank(rank: int, length: int, config, what: str) -> None:
  if rank <= 0:
    raise ConfigError(f"{what} must be > 0, got {rank}")
  if config is not None:
    base.config_error(lambda: low_rank.check_rank(rank, length, config.emb_dim, what))


@dataclasses.dataclass(frozen=True)
class DPTSpec(base.MethodSpec):
  rank: int = 10
  init: str = "normal"  # 'normal' (the paper), 'uniform' (the reference code) or 'svd'
  # normal: stddev; uniform: half-width. None: the reference code's spread, U(-0.5, 0.5) (var 1/12),
  # so normal's stddev is 0.5/sqrt(3) (std(A·B) = sqrt(r)/12 either way).
  scale: Optional[float] = None
  prompt_file: Optional[str] = None  # init 'svd': the [P, H] prompt whose truncated SVD starts A, B

  def check(self, config):
    super().check(config)
    _check_rank(self.rank, self.length, config, "DPT rank r")
    if self.init not in INITS:
      raise ConfigError(f"DPT init must be one of {INITS}, got {self.init!r}")
    if self.scale is not None and (isinstance(self.scale, bool)
                                   or not isinstance(self.scale, (int, float)) or self.scale <= 0):
      raise ConfigError(f"DPT_INIT_SCALE must be a number > 0 or None (the reference code's "
                        f"spread), got {self.scale!r}")
    if self.init == "svd" and not self.prompt_file:
      raise ConfigError("DPT init 'svd' needs DPT_PROMPT_FILE (a [PROMPT_LENGTH, emb_dim] .npy)")

  def _inits(self, backbone):
    if self.init == "normal":
      std = REFERENCE_HALF_WIDTH / math.sqrt(3) if self.scale is None else self.scale
      return initializers.normal_init(std), initializers.normal_init(std)
    if self.init == "uniform":
      half = REFERENCE_HALF_WIDTH if self.scale is None else self.scale
      return (initializers.symmetric_uniform_init(half),
              initializers.symmetric_uniform_init(half))
    if backbone.shapes_only:  # 'svd': values do not matter for shapes
      return initializers.uniform_init(), initializers.uniform_init()
    prompt = initializers.load_prompt_file(self.prompt_file, "DPT_PROMPT_FILE")
    want = (self.length, backbone.config.emb_dim)
    if prompt.shape != want:
      raise ConfigError(f"DPT_PROMPT_FILE {self.prompt_file!r} has shape {prompt.shape}, DPT "
                        f"needs {want} (PROMPT_LENGTH, emb_dim)")
    a, b = low_rank.svd_factors(prompt, self.rank)
    return (initializers.array_init(a, "DPT A from SVD"),
            initializers.array_init(b, "DPT B from SVD"))

  def method(self, backbone):
    init_a, init_b = self._inits(backbone)
    return base.partial(low_rank.LowRankPrompt, length=self.length, rank=self.rank,
                        init_a=init_a, init_b=init_b)

  def num_trainable_params(self, config):
    return low_rank.num_trainable_params(self.length, config.emb_dim, self.rank)

  def fold(self, params, config):
    return {"prompt": low_rank.fold(base.input_prompt(params))}  # [P, H] = A·B


@gin.configurable(module="prompt_jax")
def dpt(length: int = 100, rank: int = 10, init: str = "normal", scale: Optional[float] = None,
        prompt_file: Optional[str] = None, placement="prefix") -> DPTSpec:
  """Decomposed prompt tuning: prompt = A [P, r] · B [r, H]."""
  return DPTSpec(length=length, placement=placement, rank=rank, init=init, scale=scale,
                 prompt_file=prompt_file)


@dataclasses.dataclass(frozen=True)
class RankProbeSpec(base.MethodSpec):
  rank: Optional[int] = None  # k; None = min(P, H) (full rank)
  init: Any = None  # initialiser spec of the prompt whose SVD starts U, s, V

  def rank_for(self, config) -> int:
    return self.rank if self.rank is not None else min(self.length, config.emb_dim)

  def check(self, config):
    super().check(config)
    if self.rank is not None:
      _check_rank(self.rank, self.length, config, "rank-probe rank k")

  def method(self, backbone):
    return base.partial(low_rank.RankProbe, length=self.length,
                        rank=self.rank_for(backbone.config),
                        prompt_init=base.resolve_init(self.init, backbone))

  def num_trainable_params(self, config):
    return low_rank.num_trainable_params_probe(self.length, config.emb_dim, self.rank_for(config))

  def fold(self, params, config):
    return {"prompt": low_rank.fold(base.input_prompt(params))}  # [P, H] = U·ReLU(s)·Vᵀ

  def summaries(self, trainable_params):
    probe = trainable_params["encoder"]["prompt"]["prompt"]
    return {"dpt_rank_probe/positive_singular_values": low_rank.positive_count(probe)}


@gin.configurable(module="prompt_jax")
def dpt_rank_probe(length: int = 100, rank: Optional[int] = None, init=None,
                   placement="prefix") -> RankProbeSpec:
  """DPT's rank probe: prompt = U · ReLU(diag(s)) · Vᵀ, logging the number of positive s."""
  return RankProbeSpec(length=length, placement=placement, rank=rank, init=init)
