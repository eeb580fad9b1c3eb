"""The docs pages the README links to: their Python examples run as written and do what the page says of them, the
README stays a page, and every relative link of the README and of docs/ reaches a file (and its heading)."""

import pathlib
import re

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README_LIMIT = 15_000  # bytes: the README is one page; every other topic has its page in docs/


def _model(ns):
    """Model building: logits [1, 16, 256] float32 as its comment says; the prompt followed by 8 generated ids."""
    assert ns["logits"].shape == (1, 16, 256) and ns["logits"].dtype == np.float32
    tokens = np.asarray(ns["tokens"])
    assert tokens.shape == (1, 12) and (tokens[:, :4] == 0).all() and ((0 <= tokens) & (tokens < 256)).all()


def _switches(ns):
    """The eval-time switches: the layer is then plain LSSA with the new RoPE base and scaling, parameters unchanged
    (held on random tokens: the page's all-ones input has one value vector, which any weights reproduce)."""
    from flax import nnx

    def built(variant, **options):
        layer = ns["Attention"](64, 4, num_kv_heads=2, variant=variant, **options, rope_theta=500_000.0, rngs=nnx.Rngs(0))
        layer.set_rope_scaling(ns["Scaling"]("linear", 4.0))
        return layer

    x_BTE, positions_BT = np.random.default_rng(0).normal(size=(2, 16, 64)), np.arange(16)[None].repeat(2, 0)
    switched = ns["attn"](x_BTE, positions_BT=positions_BT)
    np.testing.assert_allclose(switched, built("lssa")(x_BTE, positions_BT=positions_BT), atol=1e-6)
    assert not np.allclose(switched, built("lssar", options={"p": 15.0})(x_BTE, positions_BT=positions_BT), atol=1e-4)


def _sharded(ns):
    """FSDP over every device: every parameter matrix is split over the devices, the logits cover the batch."""
    import jax

    assert ns["logits_BTV"].shape[:2] == (8, 64)
    sharded = [x for x in jax.tree.leaves(ns["nnx"].state(ns["model"], ns["nnx"].Param)) if x.ndim == 2]
    assert sharded and all(len(x.sharding.device_set) == jax.device_count() for x in sharded)


def _kernels(ns):
    """The Pallas kernels (interpret mode on this CPU) equal the reference."""
    attention, q = ns["attention"], ns["q"]
    np.testing.assert_allclose(ns["out"], attention.attend(q, q, q, variant="lssa", implementation="reference"), atol=1e-5)


CHECKS = {  # page: {a line that names the block: what the page says it does, checked on its namespace}
    "docs/library.md": {
        "attn.set_attention(": _switches,
        "sharding.build_sharded(": _sharded,
        "ModelConfig(vocab_size=256": _model,
    },
    "docs/kernels.md": {'implementation="pallas"': _kernels},
}
BLOCKS = [(page, block) for page in CHECKS for block in re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), re.S)]


def test_every_python_block_of_the_pages_has_its_check():
    named = [[line for line in CHECKS[page] if line in block] for page, block in BLOCKS]
    assert [len(n) for n in named] == [1] * len(BLOCKS) and len(BLOCKS) == sum(map(len, CHECKS.values()))


@pytest.mark.parametrize("page, block", BLOCKS, ids=[f"{p}:{i}" for i, (p, _) in enumerate(BLOCKS)])
def test_page_block_runs_and_does_what_the_page_says(page, block):
    (check,) = [check for line, check in CHECKS[page].items() if line in block]
    namespace = {"__name__": "docs"}
    exec(compile(block, str(ROOT / page), "exec"), namespace)
    check(namespace)


def test_the_readme_is_one_page():
    assert len((ROOT / "README.md").read_bytes()) <= README_LIMIT


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code, whose brackets are not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(text: str) -> set[str]:
    """GitHub's anchors of a markdown file's headings: lower case, punctuation but `-` and `_` dropped, spaces to
    `-`; a repeated heading gets `-1`, `-2`, ..."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def broken_links(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """The relative links of a markdown file (images too) whose file, or heading in it, does not exist; each named
    relative to `root`."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(path.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(f"{path.relative_to(root)}: {target} (no such file)")
        elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked.read_text())):
            broken.append(f"{path.relative_to(root)}: {target} (no such heading)")
    return broken


def test_every_relative_link_of_the_readme_and_the_docs_reaches_its_file_and_heading():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    links = sum(len(re.findall(r"\]\(", _prose(p.read_text()))) for p in pages)
    assert links > 40 and [b for p in pages for b in broken_links(p)] == []


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "a.md").write_text("# A page\n## The `x` option, twice\n## The `x` option, twice\n")
    (tmp_path / "b.md").write_text(
        "[ok](a.md#a-page) [ok](a.md#the-x-option-twice-1) [ok](#here) `[code](nowhere.md)`\n## Here\n"
        "[gone](c.md) [gone](a.md#the-y-option) [web](https://example.com/x.md)\n"
    )
    assert [line.split(": ", 1)[1] for line in broken_links(tmp_path / "b.md", tmp_path)] == [
        "c.md (no such file)",
        "a.md#the-y-option (no such heading)",
    ]
