"""Imports point down (ARCHITECTURE.md floors) and the prompt seam stays plain, checked on the
sources with `ast` so the rules stay true:
  * models/ imports none of prompts/, run_setup, train/, evaluation/;
  * prompts/ imports nothing from train/, evaluation/, run_setup;
  * train/ imports nothing from evaluation/;
  * no `wants_inputs` attribute protocol, no walking up the Flax parent chain (`.parent`);
  * the spec code and run set-up probe nothing (`getattr`/`hasattr`/`inspect`);
  * one spec base class: every spec in prompts/specs is a `MethodSpec`.
"""
import ast
import importlib
import inspect
import os
import pkgutil

import pytest

import prompt_jax
from prompt_jax.prompts import specs
from prompt_jax.prompts.specs import base

ROOT = os.path.dirname(prompt_jax.__file__)


def _sources(*parts):
  top = os.path.join(ROOT, *parts)
  if top.endswith(".py"):
    yield top
    return
  for dirpath, _, files in os.walk(top):
    for f in files:
      if f.endswith(".py"):
        yield os.path.join(dirpath, f)


def _imports(path):
  """Every module name `path` imports (absolute, as written), wherever in the file."""
  tree = ast.parse(open(path).read(), path)
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.add(node.module)
      names.update(f"{node.module}.{a.name}" for a in node.names)
  return names


@pytest.mark.parametrize("floor,forbidden", [
    ("models", ("prompt_jax.prompts", "prompt_jax.run_setup", "prompt_jax.train",
                "prompt_jax.evaluation")),
    ("prompts", ("prompt_jax.train", "prompt_jax.evaluation", "prompt_jax.run_setup",
                 "prompt_jax.cli")),
    ("train", ("prompt_jax.evaluation", "prompt_jax.cli")),
])
def test_imports_point_down(floor, forbidden):
  bad = {}
  for path in _sources(floor):
    hits = sorted(n for n in _imports(path) if n.startswith(forbidden))
    if hits:
      bad[os.path.relpath(path, ROOT)] = hits
  assert not bad, bad


def _names(path):
  tree = ast.parse(open(path).read(), path)
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute):
      yield node.attr
    elif isinstance(node, ast.Name):
      yield node.id
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
      yield node.value


def test_no_wants_inputs_and_no_parent_chain_walk():
  for path in _sources("."):
    names = set(_names(path))
    assert "wants_inputs" not in names, path
  for path in list(_sources("prompts")) + list(_sources("models")):
    tree = ast.parse(open(path).read(), path)
    parents = [n.lineno for n in ast.walk(tree)
               if isinstance(n, ast.Attribute) and n.attr == "parent"]
    assert not parents, (path, parents)


def test_spec_code_and_run_setup_probe_nothing():
  for path in list(_sources("prompts", "specs")) + list(_sources("run_setup.py")):
    tree = ast.parse(open(path).read(), path)
    calls = [n.func.id for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id in ("getattr", "hasattr")]
    assert not calls, (path, calls)
    assert "inspect" not in _imports(path), path
  for path in _sources("prompts"):
    assert "inspect" not in _imports(path), path


def test_one_spec_base_class():
  spec_classes = []
  for info in pkgutil.iter_modules(specs.__path__):
    module = importlib.import_module(f"{specs.__name__}.{info.name}")
    for _, cls in inspect.getmembers(module, inspect.isclass):
      if cls.__module__ == module.__name__ and cls.__name__.endswith("Spec"):
        spec_classes.append(cls)
  assert base.MethodSpec in spec_classes and len(spec_classes) >= 7
  assert all(issubclass(c, base.MethodSpec) for c in spec_classes), spec_classes
  # ... and the run set-up has no prompt spec of its own.
  from prompt_jax import run_setup  # pylint: disable=g-import-not-at-top
  assert not [n for n, c in inspect.getmembers(run_setup, inspect.isclass)
              if n.endswith("Spec") and c.__module__ == run_setup.__name__ and n != "ModelSpec"]
