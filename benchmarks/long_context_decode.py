"""Long-context decoding compiled without the chips: a gpt2_small prompt of T tokens prefilled into a KV cache split
over the 'context' axis (round the ring), then one greedy decoding step (sharded_decode_attend).

    python benchmarks/long_context_decode.py [--case v5p-32:1048576:16] [--variant lssar] [--implementation auto]

The program is freeatten-eval's passkey path (nn.decoding: the cache made inside the jit, laid out by the rule
'cache_length', the prompt cut at its last multiple of 2n), bf16 compute, batch 1, parameters replicated. Prints
per-device memory (XLA's memory analysis) against the chip's HBM. Compiles take minutes on 2 cores.
"""

import argparse
import os
import sys
import time


def lower(target: str, t: int, context: int, variant: str, implementation: str):
    """The prefill + one step program on the target's mesh (1 x 1 x 1 x context), lowered on abstract inputs."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from freeatten_jax.compile import targets
    from freeatten_jax.nn import Transformer, preset, sharding
    from freeatten_jax.nn.decoding import prefill

    cfg = preset("gpt2_small", attention=variant, implementation=implementation, dtype=jnp.bfloat16)
    mesh = sharding.make_mesh((1, 1, 1, context), targets.devices(target)[:context])
    rules = sharding.DEFAULT_RULES
    build = lambda: Transformer(cfg, rngs=nnx.Rngs(0))  # noqa: E731
    graphdef = nnx.split(nnx.eval_shape(build))[0]
    state, _ = sharding.abstract(lambda: nnx.state(build()), mesh, rules)
    prompt = jax.ShapeDtypeStruct((1, t), jnp.int32, sharding=sharding.batch_sharding(mesh, rules, (1, t)))

    def prefill_and_step(state, prompt_BT):
        model = nnx.merge(graphdef, state)
        logits_B1V, cache = prefill(model, prompt_BT, model.init_cache(1, t + 1), last=True)
        token_B = jnp.argmax(logits_B1V[:, -1], axis=-1)
        return jnp.argmax(model(token_B[:, None], cache=cache)[0][:, -1], axis=-1)

    with sharding.use_mesh(mesh, rules):
        return jax.jit(prefill_and_step).lower(state, prompt)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="v5p-32:1048576:16", help="target:T:context")
    parser.add_argument("--variant", default="lssar")
    parser.add_argument("--implementation", default="auto")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from freeatten_jax.compile.run import compile_report

    target, t, context = args.case.split(":")
    start = time.time()
    report = compile_report(lambda: lower(target, int(t), int(context), args.variant, args.implementation), target)
    print(*report.lines(), f"compiled in {time.time() - start:.0f} s", sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
