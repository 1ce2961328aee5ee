"""prompt_jax: prompt tuning of frozen T5 models in JAX/Flax.

`gin/` and `tasks/` live at the top of the repository, where users look for them, and are
mapped into the distribution as `prompt_jax.gin` (data) and `prompt_jax.tasks` (code), so an
installed (wheel or editable) prompt_jax carries both and no top-level `tasks` module exists.
The shipped sweep specs `launch/sweeps/*.yaml` go in as `prompt_jax.sweeps` (data) the same way.
"""
import setuptools

INSTALL_REQUIRES = [
    "jax>=0.10,<0.13",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.4",
    "orbax-checkpoint>=0.11",
    "tensorstore>=0.1.70",
    "msgpack>=1.0",
    "numpy>=1.26",
    "seqio>=0.0.20",
    "tensorflow>=2.21,<2.23",
    "tensorflow-text>=2.21,<2.23",
    "tensorflow-datasets>=4.9.8",
    "tensorboard>=2.21",
    "importlib_resources>=6.0",
    "clu>=0.0.12",
    "gin-config>=0.5.0",
    "sentencepiece>=0.2.0",
    "PyYAML>=6.0",        # sweep specs
    "matplotlib>=3.8",    # sweep report figures
]

TEST_REQUIRES = [
    "pytest>=8",
    "pytest-xdist>=3.5",   # pytest.ini runs the suite on up to 4 workers, one test file each
    "torch==2.13.0",
    "transformers>=5,<6",
    "safetensors>=0.4",
    "peft>=0.21",          # export --format=peft round trip; the bench's PEFT reference
]

# What t5x needs beyond prompt_jax's own requirements, for `python -m t5x.train` with
# gin/t5x/ (t5x itself is not on PyPI: install it from its repository, README "Under t5x").
T5X_REQUIRES = ["fiddle", "jaxtyping", "chex", "cached_property"]
# The tests run t5x's binaries when its sources are beside the repository (../shared/t5x).
TEST_REQUIRES += T5X_REQUIRES

setuptools.setup(
    name="prompt_jax",
    version="0.1.0",
    description="Parameter-efficient prompt tuning of frozen T5 models in JAX/Flax.",
    python_requires=">=3.11",
    packages=setuptools.find_packages(include=["prompt_jax", "prompt_jax.*"])
    + ["prompt_jax.tasks", "prompt_jax.gin", "prompt_jax.sweeps"],
    package_dir={
        "prompt_jax": "prompt_jax",
        "prompt_jax.tasks": "tasks",
        "prompt_jax.gin": "gin",
        "prompt_jax.sweeps": "launch/sweeps",
    },
    package_data={
        "prompt_jax.gin": ["*.gin", "**/*.gin"],
        "prompt_jax.sweeps": ["*.yaml"],
        # The embedded default's tiny pretrained T5 (t5x legacy layout, ~1.6 MB): the msgpack
        # `checkpoint` file and one zarr dir (`.zarray` + chunk files) per large array.
        "prompt_jax": ["embedded/checkpoint/*/checkpoint", "embedded/checkpoint/*/*/.zarray",
                       "embedded/checkpoint/*/*/*"],
    },
    include_package_data=False,
    install_requires=INSTALL_REQUIRES,
    extras_require={"test": TEST_REQUIRES, "t5x": T5X_REQUIRES},
    entry_points={"console_scripts": ["prompt-jax=prompt_jax.cli:console_main"]},
)
