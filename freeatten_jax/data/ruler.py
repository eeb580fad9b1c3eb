"""RULER-style long-context tasks (Hsieh et al. 2024), generated in-process with no download: needle retrieval in noise
(niah_single), among distractor needles (niah_multikey), in the run's held-out text (niah_multivalue, niah_multiquery),
variable tracking (vt), and common and frequent word extraction (cwe, fwe) over a built-in word list.

Each prompt is exactly `length` tokens as the run's tokenizer counts them: its pieces (opening, haystack, needles,
question) are encoded on their own and the haystack is cut to the tokens left, so every needle's tokens are known. The
prompt ends with an answer prefix (a base model answers by continuing it). Example `index` draws its keys, values and
needle depths from (seed, task, index) alone: the same facts at every length, only the haystack grows.

Glossary: H haystack tokens, T prompt tokens.
"""

import dataclasses
import zlib
from collections.abc import Callable

import numpy as np

from freeatten_jax.data.retrieval import filler_tokens, largest_that_fits

DEPTHS = np.linspace(0, 1, 40)  # RULER's 40 evenly spaced needle depths; each needle draws one (several: distinct)
NEEDLES = 4  # needles of niah_multivalue and niah_multiquery
HOPS = 4  # vt: a chain of HOPS + 1 variables
CWE_COMMON = 5  # cwe asks for these many most common words (RULER asks for 10; 5 fit shorter prompts)
FWE_VOCAB, FWE_TOP, FWE_ALPHA = 20, 3, 2.0  # fwe: word i of FWE_VOCAB appears in proportion to 1 / i^FWE_ALPHA

WORDS = tuple(
    """
    apple river stone cloud garden window silver candle forest market bridge letter mountain pencil rabbit ocean
    basket engine feather harbor island jacket kitten ladder meadow needle orange pepper quilt rocket saddle ticket
    umbrella valley wagon yellow zebra anchor bottle cactus dragon falcon guitar hammer insect jungle kettle lantern
    magnet napkin oyster parrot quiver ribbon shadow tunnel violin walnut bamboo blanket button camera carpet castle
    cherry circle copper cotton desert dinner doctor dollar donkey drawer eagle estate fabric farmer fiddle finger
    flower fossil friend galaxy ginger glove goblet gravel hunter jigsaw kernel kingdom lemon lizard locket marble
    meteor mirror monkey muffin nickel noodle office onion palace panda pillow planet pocket poodle potato puzzle
    rainbow raisin record saucer scarf school shovel singer sister spider spirit statue summer sunset sweater tablet
    temple thunder tiger timber tomato tower travel turtle velvet village walrus weasel whistle winter wizard wolf
    yogurt beacon blossom canyon chimney compass crystal dolphin emerald fountain glacier hammock horizon iceberg
    jasmine lagoon lobster mango orchard pebble pelican penguin pyramid quartz reindeer sapphire scooter sparrow
    tractor trumpet tulip vulture waffle acorn badger barrel beetle biscuit bucket cabin canoe carrot cobweb cricket
    daisy elbow ferret goose hazel igloo jelly koala leopard mitten nutmeg otter pumpkin radish salmon thimble
    """.split()
)


@dataclasses.dataclass
class Example:
    tokens: np.ndarray  # the prompt [T], T = the length exactly
    answers: list[str]  # the references (a generation scores the fraction of them it contains)
    wrong: list[str]  # wrong answers of the same kind, each reference's likelihood is ranked against
    needles: list[slice]  # each needle's tokens in `tokens`, in text order
    depths: list[float]  # each needle's depth: the fraction of the haystack's tokens before it


@dataclasses.dataclass
class _Spec:
    """What a task asks: the prompt's text pieces, the answers, and the haystack of `budget` tokens
    `haystack(budget) -> (tokens [H], offsets a needle may start at, or None: any)`."""

    opening: str
    needles: list[tuple[float, str]]  # (depth, text), in the order they must appear
    question: str
    answers: list[str]
    wrong: list[str]
    haystack: Callable[[int], tuple[np.ndarray, np.ndarray | None]]


def _encode(tokenizer, text: str) -> np.ndarray:
    return np.asarray(tokenizer.encode(text), np.int32)


def _unique(draw: Callable[[], str], count: int, exclude=()) -> list[str]:
    """`count` distinct values of `draw()` not in `exclude`, in the order drawn."""
    seen, out = set(exclude), []
    while len(out) < count:
        if (value := draw()) not in seen:
            seen.add(value)
            out.append(value)
    return out


def _numbers(rng, count: int, digits: int, exclude=()) -> list[str]:
    """`count` distinct `digits`-digit numbers."""
    return _unique(lambda: str(rng.integers(10 ** (digits - 1), 10**digits)), count, exclude)


def _keys(rng, count: int, exclude=()) -> list[str]:
    """`count` distinct keys of two words, e.g. "silver-kettle"."""
    return _unique(lambda: "-".join(rng.choice(WORDS, 2, replace=False)), count, exclude)


def _names(rng, count: int, exclude=()) -> list[str]:
    """`count` distinct variable names of five capital letters."""
    return _unique(lambda: "".join(chr(65 + c) for c in rng.integers(0, 26, 5)), count, exclude)


def _depths(rng, count: int) -> list[float]:
    """`count` distinct depths from RULER's grid, ascending."""
    return sorted(float(d) for d in rng.choice(DEPTHS, count, replace=False))


def _noise(tokenizer):
    """The noise haystack: the passkey filler sentences repeated (RULER's niah_single_1 haystack)."""
    return lambda budget: (filler_tokens(tokenizer, budget)[:budget], None)


def _text(text_T):
    """The held-out text haystack: `budget` tokens of `text_T` from an offset the fill generator draws."""

    def haystack(budget, rng):
        if text_T is None or len(text_T) < budget:
            have = 0 if text_T is None else len(text_T)
            raise ValueError(f"the haystack needs {budget} tokens of held-out text; there are {have}")
        start = int(rng.integers(0, len(text_T) - budget + 1))
        return np.asarray(text_T[start : start + budget], np.int32), None

    return haystack


NIAH_OPENING = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the numbers afterwards.\n"
)
NEEDLE = " One of the special magic numbers for {key} is: {value}. "


def _one(key: str) -> str:
    return (
        f"\nWhat is the special magic number for {key} mentioned in the provided text? "
        f"The special magic number for {key} mentioned in the provided text is"
    )


def _all(keys: str) -> str:
    return (
        f"\nWhat are all the special magic numbers for {keys} mentioned in the provided text? "
        f"The special magic numbers for {keys} mentioned in the provided text are"
    )


def niah_single(tokenizer, facts, fill, text_T, wrong: int) -> _Spec:
    """One needle in noise."""
    (key,), (value,) = _keys(facts, 1), _numbers(facts, 1, 7)
    needles = [(_depths(facts, 1)[0], NEEDLE.format(key=key, value=value))]
    return _Spec(NIAH_OPENING, needles, _one(key), [value], _numbers(facts, wrong, 7, {value}), _noise(tokenizer))


def niah_multikey(tokenizer, facts, fill, text_T, wrong: int) -> _Spec:
    """One needle among distractor needles of other keys (RULER's niah_multikey_2: the haystack is the distractors);
    the wrong answers are the first distractors' values, in the text wherever it holds that many."""
    (key,), (value,) = _keys(facts, 1), _numbers(facts, 1, 7)
    depth, seed = _depths(facts, 1)[0], int(facts.integers(2**32))

    def distractors(count):
        keys, values = (np.random.default_rng((seed, i)) for i in range(2))  # the same first ones however many
        return list(zip(_keys(keys, count, {key}), _numbers(values, count, 7, {value})))

    def haystack(budget):
        count, units = 8, []
        while sum(map(len, units)) < budget:
            units = [_encode(tokenizer, NEEDLE.format(key=k, value=v)) for k, v in distractors(count)]
            count *= 2
        return np.concatenate(units)[:budget], np.cumsum([0] + [len(u) for u in units])

    wrong_values = [v for _, v in distractors(wrong)]
    return _Spec(NIAH_OPENING, [(depth, NEEDLE.format(key=key, value=value))], _one(key), [value], wrong_values, haystack)


def niah_multivalue(tokenizer, facts, fill, text_T, wrong: int) -> _Spec:
    """NEEDLES needles of one key with different values, in held-out text; every value is an answer."""
    (key,), values = _keys(facts, 1), _numbers(facts, NEEDLES, 7)
    needles = [(d, NEEDLE.format(key=key, value=v)) for d, v in zip(_depths(facts, NEEDLES), values)]
    text = _text(text_T)
    return _Spec(NIAH_OPENING, needles, _all(key), values, _numbers(facts, wrong, 7, values), lambda b: text(b, fill))


def niah_multiquery(tokenizer, facts, fill, text_T, wrong: int) -> _Spec:
    """NEEDLES needles of different keys, in held-out text; the question asks for every key's value."""
    keys, values = _keys(facts, NEEDLES), _numbers(facts, NEEDLES, 7)
    order = facts.permutation(NEEDLES)  # the needles' order in the text is not the question's
    needles = [(d, NEEDLE.format(key=keys[i], value=values[i])) for d, i in zip(_depths(facts, NEEDLES), order)]
    asked = ", ".join(keys[:-1]) + f" and {keys[-1]}"
    text = _text(text_T)
    return _Spec(NIAH_OPENING, needles, _all(asked), values, _numbers(facts, wrong, 7, values), lambda b: text(b, fill))


def vt(tokenizer, facts, fill, text_T, wrong: int) -> _Spec:
    """Variable tracking: `VAR A = 12345.`, then `VAR B = VAR A.` ... (HOPS hops) in noise; the answers are every name."""
    names, (value,) = _names(facts, HOPS + 1), _numbers(facts, 1, 5)
    lines = [f" VAR {names[0]} = {value}. "] + [f" VAR {b} = VAR {a}. " for a, b in zip(names, names[1:])]
    question = (
        f"\nQuestion: Find all variables that are assigned the value {value} in the text above. Answer: According to the "
        f"chain(s) of variable assignment in the text above, {HOPS + 1} variables are assigned the value {value}, they are:"
    )
    opening = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n"
    needles = list(zip(_depths(facts, HOPS + 1), lines))
    return _Spec(opening, needles, question, names, _names(facts, wrong, names), _noise(tokenizer))


def _word_list(tokenizer, fill, counts_of: Callable[[int], dict[str, int]], top: list[str]):
    """A haystack of space-separated words: the most items N whose words (`counts_of(N)`: word -> count, shuffled)
    fit the budget, the tokens left over filled with noise; a ValueError unless each word of `top` then appears more
    often than every other word."""
    sizes = {w: len(_encode(tokenizer, " " + w)) for w in WORDS}
    size = lambda n: sum(sizes[w] * c for w, c in counts_of(n).items())

    def haystack(budget):
        low = largest_that_fits(size, budget)  # the list grows with N
        counts = counts_of(low)
        if min(counts.get(w, 0) for w in top) <= max((c for w, c in counts.items() if w not in top), default=0):
            raise ValueError(f"a list of {low} words is too short to rank its {len(top)} most frequent words")
        items = [w for w, c in counts.items() for _ in range(c)]
        listed = [_encode(tokenizer, " " + w) for w in fill.permutation(np.asarray(items, object))]
        words_H = np.concatenate([np.zeros(0, np.int32), *listed])
        return np.concatenate([words_H, filler_tokens(tokenizer, budget)[: budget - len(words_H)]]), None

    return haystack


def cwe(tokenizer, facts, fill, text_T, wrong: int) -> _Spec:
    """Common words: in a list of N words, CWE_COMMON words share half of it; the others (round-robin over the rest of
    the word list) appear fewer times each. The wrong answers are rare words of the list."""
    chosen = [str(w) for w in facts.permutation(np.asarray(WORDS, object))]
    common, rare = chosen[:CWE_COMMON], chosen[CWE_COMMON:]

    def counts_of(n):
        each = n // (2 * CWE_COMMON)
        counts = dict.fromkeys(common, each)
        for i in range(n - each * CWE_COMMON):
            counts[rare[i % len(rare)]] = counts.get(rare[i % len(rare)], 0) + 1
        return counts

    opening = "Below is a list of words. Some of them appear more often than others. Memorize the ones that appear most often.\n"
    question = (
        f"\nQuestion: What are the {CWE_COMMON} most common words in the above list? "
        f"Answer: The top {CWE_COMMON} words that appear most often in the list are:"
    )
    return _Spec(opening, [], question, common, rare[:wrong], _word_list(tokenizer, fill, counts_of, common))


def fwe(tokenizer, facts, fill, text_T, wrong: int) -> _Spec:
    """Frequent words: N words drawn as Zipf(FWE_ALPHA) over FWE_VOCAB words (counts rounded, the remainder to the most
    frequent); the answers are the FWE_TOP most frequent, the wrong answers the others."""
    vocab = [str(w) for w in facts.choice(np.asarray(WORDS, object), FWE_VOCAB, replace=False)]
    weights = 1 / np.arange(1, FWE_VOCAB + 1) ** FWE_ALPHA
    weights /= weights.sum()

    def counts_of(n):
        counts = np.floor(n * weights).astype(int)
        counts[0] += n - counts.sum()
        return {w: int(c) for w, c in zip(vocab, counts) if c}

    opening = (
        "Read the following coded text and track the frequency of each coded word. "
        "Find the three most frequently appeared coded words.\n"
    )
    question = (
        "\nQuestion: What are the three most frequently appeared words in the above coded text? "
        "Answer: According to the coded text above, the three most frequently appeared words are:"
    )
    top = vocab[:FWE_TOP]
    return _Spec(opening, [], question, top, vocab[FWE_TOP:][:wrong], _word_list(tokenizer, fill, counts_of, top))


TASKS = {
    "niah_single": niah_single,
    "niah_multikey": niah_multikey,
    "niah_multivalue": niah_multivalue,
    "niah_multiquery": niah_multiquery,
    "vt": vt,
    "cwe": cwe,
    "fwe": fwe,
}


def example(task: str, tokenizer, length: int, seed: int, index: int, text_T=None, wrong: int = 9) -> Example:
    """Example `index` of `task` at exactly `length` tokens, with up to `wrong` wrong answers; `text_T`: the held-out
    tokens the niah_multivalue / niah_multiquery haystack is cut from. ValueError if the task does not fit the length."""
    stream = (seed, zlib.crc32(task.encode()), index)
    facts, fill = np.random.default_rng(stream), np.random.default_rng((*stream, length))
    spec = TASKS[task](tokenizer, facts, fill, text_T, wrong)
    opening, question = _encode(tokenizer, spec.opening), _encode(tokenizer, spec.question)
    needles = [(depth, _encode(tokenizer, text)) for depth, text in spec.needles]
    budget = length - len(opening) - len(question) - sum(len(n) for _, n in needles)
    if budget < 0:
        raise ValueError(f"the {task} prompt without haystack is {length - budget} tokens, longer than the length {length}")
    hay_H, starts = spec.haystack(budget)
    pieces, slices, depths, at, done = [opening], [], [], len(opening), 0
    for depth, needle in needles:
        cut = round(depth * budget) if starts is None else int(starts[np.argmin(np.abs(starts - depth * budget))])
        cut = min(max(cut, done), budget)  # needles keep their order
        pieces += [hay_H[done:cut], needle]
        slices.append(slice(at + cut - done, at + cut - done + len(needle)))
        depths.append(cut / budget if budget else depth)
        at, done = at + cut - done + len(needle), cut
    tokens = np.concatenate([*pieces, hay_H[done:], question]).astype(np.int32)
    return Example(tokens, list(spec.answers), list(spec.wrong), slices, depths)
