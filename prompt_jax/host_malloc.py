"""`PROMPT_JAX_MALLOC=jemalloc` or `=glibc`: `prompt-jax` on CPU with a malloc kept from
returning the pages XLA frees each step.

Why (issue 11, docs/benchmarks.md): XLA CPU allocates each execution's temporary buffer with
malloc (1.43 GB for T5 1.1 small's train step, batch 8 x 612 positions) and YNNPACK allocates a
buffer per fused attention (72 MB, the [8, 6, 612, 612] scores). glibc serves blocks above
32 MB with a fresh mmap and unmaps them on free, so every step faults about 4 GB of zeroed
pages in: 1.0-1.1 million minor faults and 2 s of kernel time per 4.3-4.9 s step on a 2-core
CPU. jemalloc told never to give freed pages back (MALLOC_CONF below) reuses them: no faults
after the first steps, 3.1-3.2 s per step, the numbers computed unchanged
(tests/test_host_malloc.py). PyTorch's CPU launcher offers the same for torch
(`python -m torch.backends.xeon.run_cpu --enable-jemalloc`).

Opt-in, because it keeps freed pages until the next program is compiled (configure_jax): at
one shape the peak RSS is 1.15x the system malloc's; a bucketed RTE epoch peaked at 6.5 GB
(10.3 GB without that purge; about 5.4 GB under the system malloc), and runs that alternate
between more programs (eval inside train, sweeps of shapes) are not measured yet.

`PROMPT_JAX_MALLOC=glibc` needs no library: glibc's own malloc, set by mallopt(3) in the
process (`keep_glibc_memory`) to serve no block by mmap, keep its heap untrimmed and use one
arena; the compile listener calls malloc_trim. Measured on a 2-core Xeon without jemalloc
(docs/benchmarks.md): T5 1.1 small's step 3.26 -> 2.68 s at 2434 -> 2151 MB, the bucketed RTE
epoch 329.9 -> 293.1 s at 5371 -> 5149 MB. Opt-in too: one arena serialises the malloc calls
of every thread (tf.data's among them), which a 2-core machine does not show and a many-core
host might.

A malloc can only be replaced before the process starts, so the `prompt-jax` program
(`console_main`, `python -m prompt_jax`) starts itself again, once, with jemalloc in
LD_PRELOAD, when the environment says PROMPT_JAX_MALLOC=jemalloc (Linux, with
`libjemalloc.so.2` installed: `apt install libjemalloc2`, or conda's `jemalloc`). An allocator
the user preloads themselves wins; a MALLOC_CONF of their own is kept. Processes the command
starts (bench sides, local sweep jobs) inherit the allocator; `system_environ` gives an
environment without it. This module imports no other prompt_jax module, and JAX only in
`configure_jax`.
"""
import ctypes
import ctypes.util
import os
import sys
from typing import Callable, Dict, Mapping, Optional, Sequence

CHOICE = "PROMPT_JAX_MALLOC"  # "system" (the default), "jemalloc" or "glibc"
CHOICES = ("system", "jemalloc", "glibc")
# mallopt(3) parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_glibc_kept = False  # set by keep_glibc_memory in this process
# Set in the restarted process: the library prompt-jax preloaded, and whether MALLOC_CONF is ours.
GUARD = "_PROMPT_JAX_PRELOADED_MALLOC"
OWN_CONF = "_PROMPT_JAX_MALLOC_CONF"
# Freed pages stay with the process (no decay), and large blocks stay in the arenas that reuse
# them (no dedicated oversize arena). PyTorch's launcher sets oversize_threshold:1 with a 9e9 ms
# decay; measured here, that still faulted the 1.43 GB temporary buffer in every step.
MALLOC_CONF = "oversize_threshold:0,dirty_decay_ms:-1,muzzy_decay_ms:-1"
_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")
_LIBRARY = "libjemalloc.so.2"
_LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                 "/usr/lib", "/usr/local/lib")


def find_jemalloc() -> Optional[str]:
  """Path of an installed libjemalloc.so.2 (this Python's prefix first, e.g. a conda env), or
  None."""
  for d in (os.path.join(sys.prefix, "lib"),) + _LIBRARY_DIRS:
    path = os.path.join(d, _LIBRARY)
    if os.path.isfile(path):
      return path
  name = ctypes.util.find_library("jemalloc")  # ldconfig's cache: a name the loader resolves
  return name or None


def choice(environ: Mapping[str, str]) -> str:
  """PROMPT_JAX_MALLOC's value; ValueError (one line) for one we do not know."""
  value = environ.get(CHOICE, "").strip().lower() or "system"
  if value not in CHOICES:
    raise ValueError(f"{CHOICE}={environ[CHOICE]!r}: use one of {', '.join(CHOICES)}")
  return value


def jemalloc_environ(environ: Mapping[str, str], platform: str = sys.platform,
                     find: Callable[[], Optional[str]] = find_jemalloc) -> Dict[str, str]:
  """`environ` for a process to start under prompt-jax's jemalloc; ValueError (one line) when
  that cannot be had here."""
  if not platform.startswith("linux"):
    raise ValueError(f"{CHOICE}=jemalloc works on Linux only (here: {platform})")
  library = find()
  if not library:
    raise ValueError(f"{CHOICE}=jemalloc: no {_LIBRARY} found (apt install libjemalloc2, or "
                     f"conda install jemalloc; or unset {CHOICE})")
  env = dict(environ)
  preload = env.get("LD_PRELOAD", "")
  env["LD_PRELOAD"] = f"{library} {preload}".strip()
  env[GUARD] = library
  env[CHOICE] = "jemalloc"
  if "MALLOC_CONF" not in environ:
    env["MALLOC_CONF"] = MALLOC_CONF
    env[OWN_CONF] = "1"
  return env


def restart_environ(environ: Mapping[str, str], platform: str = sys.platform,
                    find: Callable[[], Optional[str]] = find_jemalloc
                    ) -> Optional[Dict[str, str]]:
  """The environment to start `prompt-jax` again in, under jemalloc; None to go on as is.
  ValueError (one line) for a PROMPT_JAX_MALLOC that cannot be honoured."""
  if choice(environ) != "jemalloc" or GUARD in environ:
    return None
  if any(name in environ.get("LD_PRELOAD", "") for name in _ALLOCATORS):
    return None  # the user's own allocator
  return jemalloc_environ(environ, platform, find)


def restart_under_jemalloc(argv: Optional[Sequence[str]] = None) -> None:
  """Replaces this process by the same command under jemalloc when `restart_environ` says so
  (the program's own entry points only: never from code that imported prompt_jax). `argv`:
  the interpreter's command line (default sys.orig_argv)."""
  env = restart_environ(os.environ)
  if env is None:
    return
  argv = list(sys.orig_argv if argv is None else argv)
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, argv, env)


def keep_glibc_memory(environ: Optional[Mapping[str, str]] = None,
                      platform: str = sys.platform) -> bool:
  """PROMPT_JAX_MALLOC=glibc: glibc's own malloc told to keep what is freed, in this process,
  from now on (no restart: mallopt(3) before JAX starts its threads): no block is served by
  mmap (M_MMAP_MAX 0: the temporary buffer and YNNPACK's attention buffers come from the heap
  and go back to it, where the next step finds them), the heap's top is not trimmed on free,
  and every thread allocates from one arena (threads' own arenas are mmap'd heaps of at most
  64 MiB, which cannot hold a 1.4 GB block). On T5 1.1 small's float32 step (batch 8 x 612,
  2-core Xeon, docs/benchmarks.md): 3.26-3.29 s -> 2.63-2.64 s per step. Needs no library;
  False (nothing done) off glibc, or under another choice or allocator."""
  global _glibc_kept
  environ = os.environ if environ is None else environ
  if choice(environ) != "glibc" or not platform.startswith("linux"):
    return False
  if any(name in environ.get("LD_PRELOAD", "") for name in _ALLOCATORS):
    return False  # the user's own allocator
  libc = ctypes.CDLL(None)
  mallopt = getattr(libc, "mallopt", None)
  if mallopt is None or not hasattr(libc, "malloc_trim"):
    return False  # not glibc (musl has neither)
  ok = all(mallopt(param, value) == 1 for param, value in (
      (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1), (_M_ARENA_MAX, 1)))
  _glibc_kept = ok
  return ok


def configure_jax() -> None:
  """Under prompt-jax's jemalloc or its kept glibc memory (PROMPT_JAX_MALLOC=glibc: set here),
  before JAX starts its CPU backend (with any other malloc, nothing):
    - run each computation to its end before the next is dispatched. With asynchronous dispatch
      XLA allocates the next step's temporary buffer while the previous step still holds its
      own; jemalloc keeps both (measured: peak RSS 2.7 or 4.4 GB from run to run instead of
      2.6 GB, same speed);
    - give the kept pages back once each time JAX compiles (or loads) a program, before it
      first runs: a new program's buffers rarely fit in the pages of the ones before, which
      jemalloc would keep beside them (a bucketed RTE epoch: 9.2 GB peak after 16 steps, 5.9 GB
      with this; programs run before reuse the new one's pages after it)."""
  if preloaded() or keep_glibc_memory():
    import jax  # pylint: disable=g-import-not-at-top
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jax.monitoring.register_event_duration_secs_listener(_after_compile)


# jax/_src/dispatch.py's BACKEND_COMPILE_EVENT: recorded after each compile or cache load of a
# program, before it runs.
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def _after_compile(event: str, unused_seconds: float, **unused_kwargs) -> None:
  if event == _COMPILE_EVENT:
    release_freed_pages()


def release_freed_pages() -> bool:
  """Under prompt-jax's jemalloc or kept glibc memory: hands the pages freed so far (all
  arenas; glibc: malloc_trim) back to the kernel; True if it did."""
  if _glibc_kept:
    ctypes.CDLL(None).malloc_trim(ctypes.c_size_t(0))
    return True
  if not preloaded():
    return False
  mallctl = getattr(ctypes.CDLL(None), "mallctl", None)  # jemalloc's, preloaded
  if mallctl is None:
    return False
  # arena.<MALLCTL_ARENAS_ALL = 4096>.purge: every arena's unused dirty pages.
  return mallctl(b"arena.4096.purge", None, None, None, ctypes.c_size_t(0)) == 0


def preloaded() -> Optional[str]:
  """The jemalloc library prompt-jax started this process under, or None."""
  return os.environ.get(GUARD) or None


def system_environ(environ: Mapping[str, str]) -> Dict[str, str]:
  """`environ` without what prompt-jax's jemalloc added (a user's own LD_PRELOAD and MALLOC_CONF
  stay), and PROMPT_JAX_MALLOC=system."""
  env = dict(environ)
  library = env.pop(GUARD, None)
  if library:
    rest = [p for p in env.get("LD_PRELOAD", "").split() if p != library]
    if rest:
      env["LD_PRELOAD"] = " ".join(rest)
    else:
      env.pop("LD_PRELOAD", None)
  if env.pop(OWN_CONF, None):
    env.pop("MALLOC_CONF", None)
  env[CHOICE] = "system"
  return env


def describe(environ: Optional[Mapping[str, str]] = None) -> str:
  """One phrase naming the allocator a process started in `environ` runs under."""
  environ = os.environ if environ is None else environ
  library = environ.get(GUARD)
  if library:
    conf = "prompt-jax's MALLOC_CONF" if environ.get(OWN_CONF) else "your MALLOC_CONF"
    return f"jemalloc ({library}, {conf})"
  preload = environ.get("LD_PRELOAD", "")
  for name in _ALLOCATORS:
    if name in preload:
      return f"{name} (your LD_PRELOAD)"
  if environ.get(CHOICE, "").strip().lower() == "glibc" and sys.platform.startswith("linux"):
    return "the system malloc (glibc), kept from returning memory (PROMPT_JAX_MALLOC=glibc)"
  return "the system malloc"
