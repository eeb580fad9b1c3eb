"""Test setup: 8 forced host devices for sharding tests, absl flags parsed for Grain workers."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import flags  # noqa: E402

flags.FLAGS.mark_as_parsed()
