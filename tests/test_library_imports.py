"""The library (`attend`, the NNX layer, the transformer from a ModelConfig, generation) imports and runs
with the application's dependencies unimportable: `pip install .` (core) is enough to use it.

flax itself imports optax and absl (flax needs them), so those cannot be blocked; everything of the
application's own is (ml_collections, orbax, grain, matplotlib, tokenizers, tensorboardX, etils, tqdm).
"""

import os
import subprocess
import sys

from helpers import subprocess_env

BLOCKED = ("ml_collections", "orbax", "grain", "matplotlib", "tokenizers", "tensorboardX", "etils", "tqdm")

SCRIPT = f"""
import sys

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ModuleNotFoundError("blocked: " + name, name=name)  # as if not installed

sys.meta_path.insert(0, Blocker())
import jax.numpy as jnp
from flax import nnx
from freeatten_jax import attention
from freeatten_jax.nn import Attention, ModelConfig, Transformer, generate, preset

q = jnp.ones((1, 8, 2, 16))
assert attention.attend(q, q, q, variant="lssar").shape == (1, 8, 2, 16)
layer = Attention(32, 2, variant="ssmax", rngs=nnx.Rngs(0))
assert layer(jnp.ones((1, 8, 32))).shape == (1, 8, 32)
cfg = ModelConfig(vocab_size=40, num_layers=1, num_heads=2, d_model=32, mlp_dim=64, attention="lssa")
model = Transformer(cfg, rngs=nnx.Rngs(0))
assert model(jnp.zeros((2, 8), jnp.int32)).shape == (2, 8, 40)
assert generate(model, jnp.zeros((1, 3), jnp.int32), 2, temperature=0.0).shape == (1, 5)
assert Transformer(preset("tiny", num_layers=1), rngs=nnx.Rngs(0)) is not None
loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({BLOCKED!r}))
assert not loaded, loaded
print("ok")
"""


def test_library_runs_without_the_application_dependencies():
    env = subprocess_env(1, JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_a_command_without_its_extra_names_the_extra_in_one_line():
    script = SCRIPT.split("import jax.numpy")[0] + "from freeatten_jax.cli import scripts\nscripts.train()\n"
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert result.returncode == 1
    assert (
        result.stderr.strip() == "error: ml_collections is not installed; this command needs pip install 'freeatten_jax[train]'"
    )


def test_the_wheel_lists_every_package():
    """pyproject names the packages one by one: a new subpackage left off that list would be missing from
    `pip install .`."""
    import pathlib
    import tomllib

    setuptools = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join(p.parent.parts) for p in pathlib.Path("freeatten_jax").rglob("__init__.py")}
    assert set(setuptools["packages"]) == found and "freeatten_jax.configs" in found and "package-dir" not in setuptools


def test_the_harness_extra_admits_no_hub_that_the_test_extras_transformers_refuses():
    """`pip install '.[harness]'` into a `[test]` environment resolves only the harness's requirements: a newer
    huggingface-hub than transformers 4 accepts broke lm-eval's start (its environment report imports transformers)."""
    import tomllib
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    extras = tomllib.loads(open("pyproject.toml", "rb").read().decode())["project"]["optional-dependencies"]
    hub = lambda requirements: next(r.specifier for r in map(Requirement, requirements) if r.name == "huggingface-hub")  # noqa: E731
    harness = hub(extras["harness"])
    transformers = hub(r for r in requires("transformers") if "extra ==" not in r)
    assert [v for v in ("0.34.0", "0.36.2", "0.99.0", "1.0.0", "1.33.0") if v in harness and v not in transformers] == []
