"""Test setup: 8 forced host devices for sharding tests, cheap CPU compiles, one compilation cache for the session,
absl flags parsed for Grain workers, the session's shared text corpus and trained runs, and console scripts run in-process.

The tests are compile-bound (tiny shapes): XLA's CPU backend compiles without LLVM's expensive passes, which changes
no semantics (no fast-math either way), and every process of a session (pytest-xdist workers, the subprocesses of
CLI and kill -9 tests) shares one on-disk cache, so a program compiled by one test is loaded by the next.
"""

import contextlib
import io
import os
import shutil
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# unoptimised CPU code from XLA's classic emitters compiles in under half the time of its fusion emitters' code
CHEAP_CPU_COMPILES = (
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true --xla_cpu_use_fusion_emitters=false"
)
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_force_host_platform_device_count=8" + f" {CHEAP_CPU_COMPILES}" * (os.environ["JAX_PLATFORMS"] == "cpu"),
)

import helpers  # noqa: E402
import jax  # noqa: E402
import pytest  # noqa: E402
from absl import app, flags  # noqa: E402, F401 (app: its flags defined before any run_cli)

flags.FLAGS.mark_as_parsed()


def _session_root(tmp_path_factory):
    """A folder every xdist worker of this session sees (the workers' base temps share a parent)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
    """One persistent compilation cache for the session's processes, of programs that took 0.1 s or more to compile
    (tiny eager ops are cheaper to compile than to write; no size cap: jax would scan the folder at every write)."""
    cache = _session_root(tmp_path_factory) / "jax_cache"
    cache.mkdir(exist_ok=True)
    settings = {
        "jax_compilation_cache_dir": str(cache),
        "jax_persistent_cache_min_compile_time_secs": 0.1,
        "jax_persistent_cache_min_entry_size_bytes": 0,
    }
    for name, value in settings.items():
        jax.config.update(name, value)
        os.environ[name.upper()] = str(value)  # subprocesses (CLI, multi-host, kill -9 tests) use it too
    yield str(cache)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """trained_run(name, config) -> the workdir of that training run, trained once per session by whichever process
    asks first (the others wait for it); tests copy it before changing it."""
    import filelock

    from freeatten_jax.training import loop

    root = _session_root(tmp_path_factory) / "runs"
    root.mkdir(exist_ok=True)

    def get(name: str, cfg):
        workdir, done = root / name, root / f"{name}.done"
        with filelock.FileLock(str(root / f"{name}.lock")):
            if not done.exists():
                shutil.rmtree(workdir, ignore_errors=True)
                loop.train_and_evaluate(cfg, workdir)
                done.touch()
        return workdir

    return get


@pytest.fixture(scope="session")
def text_glob(tmp_path_factory):
    """A small pseudo-English corpus with learnable structure, written once per session."""
    return helpers.write_corpus(_session_root(tmp_path_factory) / "text")


@pytest.fixture
def run_cli():
    """Runs a console script's main in this process: (exit status, its output lines)."""

    def run(main, *args):
        before, out = set(flags.FLAGS), io.StringIO()
        argv, sys.argv = sys.argv, ["prog", *args]
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                main()
            code = 0
        except SystemExit as e:
            code = 0 if e.code is None else e.code
            if isinstance(code, str):  # sys.exit("error: ...") prints the message and exits with status 1
                out.write(code + "\n")
                code = 1
        finally:
            sys.argv = argv
            for name in set(flags.FLAGS) - before:
                delattr(flags.FLAGS, name)
            flags.FLAGS.unparse_flags()
            flags.FLAGS.mark_as_parsed()
        return code, out.getvalue().strip().splitlines()

    return run
