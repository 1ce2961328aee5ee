"""`prompt-jax inspect`: what a prompt looks like next to the frozen model's vocabulary.

  prompt-jax inspect --gin.MODEL_DIR="'/tmp/run'"                 a run (latest checkpoint, folded)
  prompt-jax inspect --prompt=/p/prompt.npy --gin_file=models/t5_1_1_base.gin \\
      --gin.INITIAL_CHECKPOINT_PATH="'/ckpt'" --vocabulary=/spm/spiece.model

For a [P, H] prompt (a .npy, or the input-level prompt of a run's checkpoint folded by its spec:
prompt tuning, DPT, the rank probe, residual):

  nearest neighbours   per prompt position, the top-k rows of the frozen embedding table
                       (token_embedder/embedding, INITIAL_CHECKPOINT_PATH) by cosine similarity,
                       shown as the run's vocabulary's pieces ('▁yes'; its task's, or
                       --vocabulary)
  singular values      of the prompt matrix (float64 SVD), with two effective ranks:
                       entropy rank  exp(H(p)), p_i = s_i / sum_j s_j  (Roy & Vetterli 2007,
                                     "The effective rank: a measure of effective dimensionality");
                                     1 for a rank-one prompt, r for r equal singular values
                       numerical rank  #{s_i > tol}, tol = s_max * max(P, H) * eps(float32)
                                     (numpy.linalg.matrix_rank's tolerance at float32, the
                                     precision prompts are stored in)
  <stem>_spectrum.png  the singular values (log scale), the tolerance drawn
  <stem>_rank_probe.png  for a DPT rank-probe run: the positive-entry count of s over the training
                       steps, read from the TensorBoard events in MODEL_DIR/train (tag
                       `dpt_rank_probe/positive_singular_values`, prompts/specs/dpt.py)
  <stem>_inspect.md / .json   the tables above

Files go next to the prompt: beside a .npy (`<name>_...`), or MODEL_DIR/inspect/ for a run
(`prompt_step<N>_...`). Input-dependent methods (IDPG, IPT) have no fixed prompt and key/value
prefixes are not embeddings: both are refused in one line.
"""
import dataclasses
import json
import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from prompt_jax import console
from prompt_jax import errors
from prompt_jax import npy
from prompt_jax.errors import ConfigError

INSPECT_DIR = "inspect"  # MODEL_DIR/inspect/ for a run's prompt
RANK_PROBE_TAG = "dpt_rank_probe/positive_singular_values"  # RankProbeSpec.summaries
TRAIN_EVENTS_DIR = "train"  # summaries.TRAIN_DIR
DEFAULT_TOP_K = 5
_TINY = 1e-30  # norm floor: an all-zero row (a padded vocabulary row) has cosine 0 with anything


# ===== the numbers =====

def cosine_neighbours(prompt: np.ndarray, table: np.ndarray,
                      k: int) -> Tuple[np.ndarray, np.ndarray]:
  """(ids [P, k], cosines [P, k]): the k rows of `table` [V, H] most cosine-similar to each row
  of `prompt` [P, H], best first (ties: the lower id first)."""
  prompt = np.asarray(prompt, np.float64)
  table = np.asarray(table, np.float32)
  if prompt.ndim != 2 or table.ndim != 2 or prompt.shape[1] != table.shape[1]:
    raise ConfigError(f"the prompt has shape {prompt.shape} but the embedding table has shape "
                      f"{table.shape}: a prompt must be [P, {table.shape[-1]}] for this model")
  k = max(1, min(k, table.shape[0]))
  unit_table = table / np.maximum(np.linalg.norm(table, axis=1, keepdims=True), _TINY)
  unit_prompt = prompt / np.maximum(np.linalg.norm(prompt, axis=1, keepdims=True), _TINY)
  sims = unit_prompt.astype(np.float32) @ unit_table.T  # [P, V]
  top = np.argpartition(-sims, k - 1, axis=1)[:, :k]  # [P, k] unordered
  top_sims = np.take_along_axis(sims, top, axis=1)
  order = np.lexsort((top, -top_sims), axis=1)  # by cosine descending, then id
  ids = np.take_along_axis(top, order, axis=1)
  # Cosines of the chosen rows recomputed in float64 (the ranking is float32's).
  rows = table[ids].astype(np.float64)  # [P, k, H]
  rows /= np.maximum(np.linalg.norm(rows, axis=-1, keepdims=True), _TINY)
  cos = np.einsum("ph,pkh->pk", unit_prompt, rows)
  return ids, cos


def singular_values(prompt: np.ndarray) -> np.ndarray:
  """Singular values of the [P, H] prompt, descending (float64 SVD)."""
  return np.linalg.svd(np.asarray(prompt, np.float64), compute_uv=False)


def entropy_effective_rank(s: np.ndarray) -> float:
  """Roy & Vetterli (2007): exp of the Shannon entropy of the normalised singular values."""
  s = np.asarray(s, np.float64)
  total = s.sum()
  if total <= 0:
    return 0.0
  p = s[s > 0] / total
  return float(math.exp(-(p * np.log(p)).sum()))


def rank_tolerance(s: np.ndarray, shape: Sequence[int], eps: Optional[float] = None) -> float:
  """numpy.linalg.matrix_rank's tolerance, s_max * max(shape) * eps, at float32's eps."""
  eps = float(np.finfo(np.float32).eps) if eps is None else eps
  return float(np.max(s, initial=0.0)) * max(shape) * eps


def numerical_rank(s: np.ndarray, shape: Sequence[int]) -> int:
  return int((np.asarray(s) > rank_tolerance(s, shape)).sum())


# ===== the rank probe's curve =====

def scalar_curve(events_dir: str, tag: str) -> Tuple[List[int], List[float]]:
  """(steps, values) of a scalar summary in the TensorBoard event files of `events_dir`
  (tensorboard's EventAccumulator; tf2 scalars are stored as tensors), sorted by step."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  acc = event_accumulator.EventAccumulator(
      events_dir, size_guidance={event_accumulator.TENSORS: 0, event_accumulator.SCALARS: 0})
  acc.Reload()
  tags = acc.Tags()
  points: Dict[int, float] = {}
  if tag in tags.get(event_accumulator.TENSORS, ()):
    for e in acc.Tensors(tag):
      points[e.step] = float(tensor_util.make_ndarray(e.tensor_proto))
  elif tag in tags.get(event_accumulator.SCALARS, ()):
    for e in acc.Scalars(tag):
      points[e.step] = float(e.value)
  steps = sorted(points)
  return steps, [points[s] for s in steps]


# ===== plots (matplotlib's Agg canvas: no display, no pyplot state) =====

def _figure():
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = Figure(figsize=(6.4, 4.0))
  FigureCanvasAgg(fig)
  return fig


def _save(fig, path: str) -> None:
  with console.missing_glyphs_quiet():
    fig.tight_layout()
    fig.savefig(path + ".tmp.png", dpi=110)
  os.replace(path + ".tmp.png", path)


def plot_spectrum(s: np.ndarray, tolerance: float, path: str, title: str) -> None:
  fig = _figure()
  ax = fig.add_subplot()
  index = np.arange(1, len(s) + 1)
  positive = np.asarray(s) > 0
  ax.semilogy(index[positive], np.asarray(s)[positive], marker="o", markersize=3)
  if tolerance > 0:
    ax.axhline(tolerance, color="grey", linestyle="--", linewidth=1,
               label=f"tolerance {tolerance:.2g}")
    ax.legend(loc="best")  # (upper right covered the curve's start)
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.set_xlabel("index i")
  ax.set_ylabel("singular value s_i")
  ax.set_title(title)
  ax.grid(True, which="both", alpha=0.3)
  _save(fig, path)


def plot_curve(steps: Sequence[int], values: Sequence[float], path: str, title: str,
               ylabel: str) -> None:
  fig = _figure()
  ax = fig.add_subplot()
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  ax.plot(steps, values, marker="o", markersize=3, drawstyle="steps-post")
  ax.set_ylim(0, max(max(values, default=0), 1) * 1.08)  # a count: from 0, integer ticks
  ax.yaxis.set_major_locator(MaxNLocator(integer=True))
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.set_xlabel("training step")
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.grid(True, alpha=0.3)
  _save(fig, path)


# ===== one inspection =====

def token_text(vocabulary, token_id: int) -> str:
  """How a vocabulary row reads: its SentencePiece piece ('▁yes': ▁ starts a word; special ids
  as '</s>', '<extra_id_0>'), else its decoded text (byte vocabularies), else `<id N>` (a row
  past the vocabulary: T5's table is padded to 32128, or an id that decodes to nothing)."""
  if vocabulary is None or token_id >= vocabulary.vocab_size:
    return f"<id {token_id}>"
  pieces = getattr(vocabulary, "tokenizer", None)
  if pieces is not None and hasattr(pieces, "id_to_piece"):
    if token_id < pieces.get_piece_size():
      return pieces.id_to_piece(int(token_id))
  try:
    text = vocabulary.decode([int(token_id)])
  except Exception:  # pylint: disable=broad-except
    text = ""
  if not text.strip():
    return f"<id {token_id}>"
  return text if text.isprintable() else repr(text)[1:-1]  # control bytes as '\x0e'



@dataclasses.dataclass
class Inspection:
  """What `inspect_prompt` found and where it wrote it."""
  shape: Tuple[int, int]
  neighbour_ids: np.ndarray  # [P, k]
  neighbour_cosines: np.ndarray  # [P, k]
  neighbour_texts: List[List[str]]  # [P][k]
  singular_values: np.ndarray  # [min(P, H)]
  entropy_rank: float
  numerical_rank: int
  tolerance: float
  rank_probe: Optional[Tuple[List[int], List[float]]] = None
  files: List[str] = dataclasses.field(default_factory=list)

  def summary_lines(self, shown: int = 3) -> List[str]:
    p, h = self.shape
    shown = min(shown, len(self.neighbour_texts[0]) if self.neighbour_texts else shown)
    lines = [f"prompt [{p}, {h}]: nearest vocabulary rows by cosine (top {shown} per position)"]
    for i in range(p):
      lines.append(f"  {i:4d}  " + "  ".join(
          f"{t!r} {c:.3f}" for t, c in zip(self.neighbour_texts[i][:shown],
                                            self.neighbour_cosines[i][:shown])))
    s = self.singular_values
    lines.append("singular values: " + " ".join(f"{v:.4g}" for v in s[:8])
                 + (" ..." if len(s) > 8 else ""))
    lines.append(f"effective rank: {self.entropy_rank:.2f} (Roy & Vetterli entropy rank) of "
                 f"min(P, H) = {min(p, h)}; numerical rank {self.numerical_rank} "
                 f"(s > {self.tolerance:.3g} = s_max * max(P, H) * eps32)")
    if self.rank_probe is not None:
      steps, values = self.rank_probe
      lines.append(f"rank probe: positive singular values {values[0]:g} at step {steps[0]} -> "
                   f"{values[-1]:g} at step {steps[-1]} ({len(steps)} points)")
    return lines

  def to_json(self) -> Dict[str, Any]:
    return {
        "shape": list(self.shape),
        "neighbours": [[{"id": int(i), "text": t, "cosine": float(c)}
                        for i, t, c in zip(ids, texts, coss)]
                       for ids, texts, coss in zip(self.neighbour_ids, self.neighbour_texts,
                                                   self.neighbour_cosines)],
        "singular_values": [float(v) for v in self.singular_values],
        "entropy_effective_rank": self.entropy_rank,
        "entropy_effective_rank_definition": "exp(-sum p_i log p_i), p_i = s_i / sum s "
                                             "(Roy & Vetterli 2007)",
        "numerical_rank": self.numerical_rank,
        "numerical_rank_tolerance": self.tolerance,
        "numerical_rank_definition": "#{s_i > s_max * max(P, H) * eps(float32)}",
        "rank_probe": (None if self.rank_probe is None else
                       {"tag": RANK_PROBE_TAG, "steps": self.rank_probe[0],
                        "positive_singular_values": self.rank_probe[1]}),
    }

  def markdown(self, title: str) -> str:
    p, h = self.shape
    k = self.neighbour_ids.shape[1]
    out = [f"# {title}", "",
           f"Prompt [{p}, {h}]. Effective rank {self.entropy_rank:.3f} (Roy & Vetterli entropy "
           f"rank, of min(P, H) = {min(p, h)}); numerical rank {self.numerical_rank} "
           f"(singular values above {self.tolerance:.3g} = s_max * max(P, H) * eps32).", "",
           "## Nearest vocabulary rows (cosine)", "",
           "| position | " + " | ".join(f"#{j + 1}" for j in range(k)) + " |",
           "|---|" + "---|" * k]
    for i in range(p):
      cells = [f"`{t}` ({int(n)}) {c:.3f}".replace("|", "\\|") for t, n, c in zip(
          self.neighbour_texts[i], self.neighbour_ids[i], self.neighbour_cosines[i])]
      out.append(f"| {i} | " + " | ".join(cells) + " |")
    out += ["", "## Singular values", "",
            ", ".join(f"{v:.6g}" for v in self.singular_values), ""]
    if self.rank_probe is not None:
      out += ["## Rank probe", "", "| step | positive singular values |", "|---|---|"]
      out += [f"| {s} | {v:g} |" for s, v in zip(*self.rank_probe)] + [""]
    return "\n".join(out)


def inspect_prompt(prompt: np.ndarray, table: np.ndarray, vocabulary, out_stem: str,
                   top_k: int = DEFAULT_TOP_K, title: Optional[str] = None,
                   events_dir: Optional[str] = None) -> Inspection:
  """Inspects `prompt` [P, H] against the embedding table [V, H]; writes
  `<out_stem>_{inspect.md,inspect.json,spectrum.png}` (+ `_rank_probe.png` when `events_dir`
  holds the rank probe's summaries)."""
  prompt = np.asarray(prompt, np.float32)
  if prompt.ndim != 2:
    raise ConfigError(f"a prompt to inspect is a [P, H] matrix, got shape {prompt.shape}")
  if not np.all(np.isfinite(prompt)):
    raise ConfigError("the prompt has non-finite entries (NaN or inf): nothing to inspect")
  if not np.any(prompt):  # every cosine 0: the neighbours would be arbitrary rows
    raise ConfigError(f"the prompt [{prompt.shape[0]}, {prompt.shape[1]}] is all zeros: it has "
                      f"no direction to compare with the vocabulary (was it trained?)")
  ids, cos = cosine_neighbours(prompt, table, top_k)
  s = singular_values(prompt)
  tol = rank_tolerance(s, prompt.shape)
  result = Inspection(
      shape=tuple(prompt.shape), neighbour_ids=ids, neighbour_cosines=cos,
      neighbour_texts=[[token_text(vocabulary, int(i)) for i in row] for row in ids],
      singular_values=s, entropy_rank=entropy_effective_rank(s),
      numerical_rank=numerical_rank(s, prompt.shape), tolerance=tol)
  if events_dir is not None and os.path.isdir(events_dir):
    steps, values = scalar_curve(events_dir, RANK_PROBE_TAG)
    if steps:
      result.rank_probe = (steps, values)
  title = title or os.path.basename(out_stem)
  errors.make_dirs(os.path.dirname(out_stem), f"inspect output {out_stem}_*")
  spectrum = out_stem + "_spectrum.png"
  plot_spectrum(s, tol, spectrum, f"{title}: singular values")
  result.files.append(spectrum)
  if result.rank_probe is not None:
    curve = out_stem + "_rank_probe.png"
    plot_curve(*result.rank_probe, curve, f"{title}: DPT rank probe",
               "positive singular values")
    result.files.append(curve)
  for suffix, text in (("_inspect.json", json.dumps(result.to_json(), indent=1) + "\n"),
                       ("_inspect.md", result.markdown(title))):
    with open(out_stem + suffix + ".tmp", "w") as f:
      f.write(text)
    os.replace(out_stem + suffix + ".tmp", out_stem + suffix)
    result.files.append(out_stem + suffix)
  return result


# ===== a prompt file or a run =====

def check_inputs(top_k: int, prompt_file: Optional[str] = None) -> Optional[np.ndarray]:
  """--top_k, then --prompt's file (read: returned), each one ConfigError line; the CLI checks
  them before the vocabulary, so a missing file is not found only once that is fixed."""
  if top_k < 1:
    raise ConfigError(f"--top_k must be >= 1, got {top_k}")
  return load_prompt_file(prompt_file) if prompt_file else None


def load_prompt_file(path: str) -> np.ndarray:
  prompt = npy.load(path, f"--prompt {path}", "give a .npy prompt file [P, H]")
  if prompt.ndim != 2:
    raise ConfigError(f"--prompt {path} has shape {prompt.shape}: inspect reads a [P, H] prompt "
                      f"(a deep prefix [2, L, P, D] holds key/value activations, not embeddings)")
  if prompt.shape[0] == 0 or prompt.shape[1] == 0:
    raise ConfigError(f"--prompt {path} has shape {prompt.shape}: an empty prompt has nothing "
                      f"to inspect")
  return prompt


def run_prompt(model, run) -> np.ndarray:
  """The [P, H] input-level prompt of a run's checkpoint, folded by its spec."""
  from prompt_jax.evaluation import export as export_lib  # pylint: disable=g-import-not-at-top
  from prompt_jax.evaluation import run as run_lib  # pylint: disable=g-import-not-at-top
  if model.prompt is None:
    raise ConfigError("this run trains no prompt (full fine-tuning): nothing to inspect")
  if model.prompt.input_dependent:
    raise ConfigError(f"{model.prompt.no_fixed_prompt}: there is no fixed prompt to inspect")
  if model.prompt.input_positions == 0:  # a deep prefix alone (with an input prompt: that one)
    raise ConfigError(f"{model.prompt.name} trains key/value prefixes, not input embeddings: "
                      f"nothing to compare with the vocabulary")
  params = export_lib._nested(run_lib.checkpoint_params(run.checkpoint))  # pylint: disable=protected-access
  return export_lib.fold(model.prompt, model.config, params)["prompt"]


def embedding_table(initial_checkpoint_path: Optional[str]) -> np.ndarray:
  """The frozen model's token_embedder/embedding [V, H] (only that array is read)."""
  from prompt_jax import checkpoints  # pylint: disable=g-import-not-at-top
  if not initial_checkpoint_path:
    raise ConfigError("inspect compares the prompt with the frozen model's embedding table: set "
                      "INITIAL_CHECKPOINT_PATH (a trained MODEL_DIR's config.gin has it)")
  try:
    return checkpoints.load_array(initial_checkpoint_path, "token_embedder/embedding")
  except checkpoints.CheckpointError as e:
    raise ConfigError(f"INITIAL_CHECKPOINT_PATH: {str(e).splitlines()[0]}") from e
  except (OSError, ValueError) as e:
    raise ConfigError(f"INITIAL_CHECKPOINT_PATH {initial_checkpoint_path!r} cannot be read: "
                      f"{str(e).splitlines()[0]}") from e


def vocabulary_of(spm_path: Optional[str] = None, task: Optional[str] = None,
                  task_module: Optional[str] = None):
  """--vocabulary (a SentencePiece model), else the task's `targets` vocabulary, else
  $PROMPT_JAX_SPM_PATH's (never T5's public GCS file behind the user's back: one line instead)."""
  from prompt_jax import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  if not (spm_path or task or os.environ.get(vocab_lib.SPM_PATH_ENV)):
    raise ConfigError(f"inspect decodes the neighbours with a vocabulary: give "
                      f"--vocabulary=spiece.model (or set ${vocab_lib.SPM_PATH_ENV}), or a run's "
                      f"MODEL_DIR / MIXTURE_OR_TASK_NAME")
  try:
    if spm_path:
      vocabulary = vocab_lib.get_vocabulary(spm_path)
    elif task:
      from prompt_jax.train import data as data_lib  # pylint: disable=g-import-not-at-top
      return data_lib.get_task(task, task_module).output_features["targets"].vocabulary
    else:
      vocabulary = vocab_lib.get_vocabulary()
  except FileNotFoundError as e:
    raise ConfigError(f"--vocabulary: {e}") from e
  # seqio loads a SentencePiece model lazily: read it now, so that a file that is not one (a
  # directory, another format) is one line here, not an exception from the first decode.
  env = os.environ.get(vocab_lib.SPM_PATH_ENV)
  where = (f"--vocabulary {spm_path}" if spm_path else f"${vocab_lib.SPM_PATH_ENV} {env}" if env
           else f"T5's vocabulary {vocab_lib.DEFAULT_SPM_PATH}")
  return vocab_lib.check_readable(vocabulary, where)


def inspect(*, prompt_file: Optional[str] = None, model_dir: Optional[str] = None,
            checkpoint_path: Optional[str] = None, initial_checkpoint_path: Optional[str] = None,
            vocabulary=None, top_k: int = DEFAULT_TOP_K, output_dir: Optional[str] = None,
            model=None) -> Inspection:
  """`prompt-jax inspect`: PROMPT (a .npy) or the run in MODEL_DIR (latest or CHECKPOINT_PATH's
  checkpoint), against INITIAL_CHECKPOINT_PATH's embedding table; see the module docstring."""
  from prompt_jax import run_setup  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import run_dir  # pylint: disable=g-import-not-at-top
  loaded = check_inputs(top_k, prompt_file)
  events_dir = None
  if prompt_file:
    prompt = loaded
    stem = os.path.splitext(os.path.basename(prompt_file))[0]
    out_stem = os.path.join(output_dir or os.path.dirname(os.path.abspath(prompt_file)), stem)
    title = os.path.basename(prompt_file)
  elif model_dir:
    run = run_dir.resolve(model_dir, checkpoint_path)
    if run.checkpoint is None:
      raise ConfigError(f"MODEL_DIR {model_dir} has no checkpoint to inspect: train first, set "
                        f"CHECKPOINT_PATH, or give --prompt=FILE.npy")
    prompt = run_prompt(model or run_setup.model_spec(), run)
    out_stem = os.path.join(output_dir or os.path.join(model_dir, INSPECT_DIR),
                            f"prompt_{run.label}")
    title = f"{os.path.basename(model_dir.rstrip('/'))} step {run.step}"
    events_dir = os.path.join(model_dir, TRAIN_EVENTS_DIR)
  else:
    raise ConfigError("nothing to inspect: give --prompt=FILE.npy or --gin.MODEL_DIR of a "
                      "trained run")
  table = embedding_table(initial_checkpoint_path)
  if prompt.shape[1] != table.shape[1]:
    raise ConfigError(f"the prompt is [{prompt.shape[0]}, {prompt.shape[1]}] but the frozen "
                      f"model's embeddings are {table.shape[1]}-d: inspect it with the model it "
                      f"was trained for")
  size = getattr(vocabulary, "vocab_size", None)
  if size is not None and size > table.shape[0]:  # ids past the table: another model's pieces
    raise ConfigError(f"the vocabulary has {size} entries but the frozen model's embedding table "
                      f"only {table.shape[0]} rows: it is not this model's vocabulary; give the "
                      f"one it was trained with (--vocabulary, or the run's task)")
  return inspect_prompt(prompt, table, vocabulary, out_stem, top_k=top_k, title=title,
                        events_dir=events_dir)
