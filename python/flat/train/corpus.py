"""The character LM's default text: a toy English written by a probabilistic grammar whose
information content is known, so a model's held-out bits per character can be read against the
floor no model can beat.

The language: paragraphs of sentences "subject verb object [with noun-phrase]." over an invented
lexicon (nouns, verbs, adjectives spelt from syllables, Zipf-distributed). Its structure, from
short to long range:

- spelling: every word is a fixed string, so after a word's first letters the rest is certain;
- agreement: the determiner fixes the number ("a", "the", "this", "each" singular; "some",
  "these", "many", "all" plural), which the noun's "-s" and the verb's "-s" must follow, across an
  optional adjective;
- selection: each noun takes its own few verbs, each verb its own few objects;
- reference: after a paragraph's first sentence, a subject may be "it" or "they", meaning the
  paragraph's first subject: the verb's number and choice then depend on a noun many characters
  back.

Every choice is a token from a set of distinct strings (the determiners of the two numbers are
different words; "it" and "they" are not determiners), so a text determines the choices that wrote
it and its probability is the product of theirs: ``information(text)`` parses it back and sums
-log2 p. Over a long text, that divided by the characters is the source's entropy rate, the lower
bound on any model's expected bits per character given the whole past (a model that sees a window
of 128 characters knows less, so its floor is a little higher).

Fixed seeds make the lexicon and the text the same on every machine and Python version
(``random.Random``'s ``random()`` and ``choices`` for an integer seed are stable).
"""

import random
import re
from functools import lru_cache
from math import log2
from typing import Dict, Generator, List, Optional, Tuple

SINGULAR = ("a", "the", "this", "each")
PLURAL = ("some", "these", "many", "all")
PRONOUN = {"singular": "it", "plural": "they"}
PERIOD, PARAGRAPH, WITH = ".", "\n\n", "with"

# Probabilities of the grammar's optional parts.
P_SINGULAR = 0.6  # a noun phrase is singular
P_ADJECTIVE = 0.3  # a noun phrase has an adjective
P_PRONOUN = 0.5  # a later sentence of a paragraph starts with "it" / "they"
P_WITH = 0.3  # a sentence ends with "with" and a noun phrase
P_PARAGRAPH = 0.25  # a sentence ends its paragraph

Options = Dict[str, float]  # the next token's distribution: distinct strings and their probabilities


def zipf(words, total: float = 1.0) -> Options:
    """Probabilities proportional to 1 / (rank + 2), summing to total."""
    weights = [1.0 / (rank + 2) for rank in range(len(words))]
    scale = total / sum(weights)
    return {w: scale * x for w, x in zip(words, weights)}


def merge(*parts: Options) -> Options:
    """One distribution from parts over disjoint tokens (a shared token would make the text
    ambiguous, so it is refused)."""
    merged: Options = {}
    for part in parts:
        for token, p in part.items():
            if token in merged:
                raise ValueError(f"flat.train.corpus: the token {token!r} is offered twice at one choice")
            merged[token] = p
    return merged


class Lexicon:
    """The invented words and who goes with whom, from a fixed seed."""

    def __init__(self, seed: int = 0, nouns: int = 64, verbs: int = 40, adjectives: int = 32,
                 verbs_per_noun: int = 6, objects_per_verb: int = 10):
        rng = random.Random(seed)
        reserved = set(SINGULAR + PLURAL + tuple(PRONOUN.values()) + (WITH,))
        words: List[str] = []
        while len(words) < nouns + verbs + adjectives:
            word = self.spell(rng)
            # No word may be another's "-s" form or a function word.
            if word not in reserved and word not in words and not word.endswith("s"):
                words.append(word)
        self.nouns = words[:nouns]
        self.verbs = words[nouns:nouns + verbs]
        self.adjectives = words[nouns + verbs:]
        self.verbs_of = {n: rng.sample(self.verbs, verbs_per_noun) for n in self.nouns}
        self.objects_of = {v: rng.sample(self.nouns, objects_per_verb) for v in self.verbs}

    @staticmethod
    def spell(rng: random.Random) -> str:
        syllables = rng.choice((2, 2, 3))
        word = "".join(rng.choice("bdfgklmnprtvz") + rng.choice("aeiou") for _ in range(syllables))
        return word + rng.choice(("", "", "l", "m", "n", "r", "t"))


def noun_form(noun: str, number: str) -> str:
    return noun if number == "singular" else noun + "s"


def verb_form(verb: str, number: str) -> str:
    return verb + "s" if number == "singular" else verb


def determiners() -> Options:
    return merge(zipf(SINGULAR, P_SINGULAR), zipf(PLURAL, 1 - P_SINGULAR))


def number_of(determiner: str) -> str:
    return "singular" if determiner in SINGULAR else "plural"


Grammar = Generator[Options, str, None]


def noun_phrase(lexicon: Lexicon, nouns, first: str) -> Generator[Options, str, Tuple[str, str]]:
    """The rest of a noun phrase whose determiner `first` was chosen; returns its noun and number."""
    number = number_of(first)
    forms = {noun_form(n, number): n for n in nouns}
    token = yield merge(zipf(lexicon.adjectives, P_ADJECTIVE), zipf(list(forms), 1 - P_ADJECTIVE))
    if token not in forms:  # an adjective; the noun follows
        token = yield zipf(list(forms))
    return forms[token], number


def language(lexicon: Lexicon) -> Grammar:
    """The language as a coroutine: it yields the next token's distribution and is sent the token
    chosen (by the sampler) or read (by the parser), forever."""
    token = yield determiners()
    while True:  # a paragraph, starting with a noun phrase's determiner in `token`
        topic = subject = yield from noun_phrase(lexicon, lexicon.nouns, token)
        while True:  # a sentence, from its verb
            noun, number = subject
            forms = {verb_form(v, number): v for v in lexicon.verbs_of[noun]}
            verb = forms[(yield zipf(list(forms)))]
            token = yield determiners()
            yield from noun_phrase(lexicon, lexicon.objects_of[verb], token)
            if (yield {PERIOD: 1 - P_WITH, WITH: P_WITH}) == WITH:
                token = yield determiners()
                yield from noun_phrase(lexicon, lexicon.nouns, token)
                yield {PERIOD: 1.0}
            pronoun = PRONOUN[topic[1]]
            token = yield merge({PARAGRAPH: P_PARAGRAPH}, {pronoun: (1 - P_PARAGRAPH) * P_PRONOUN},
                                {d: (1 - P_PARAGRAPH) * (1 - P_PRONOUN) * p for d, p in determiners().items()})
            if token == PARAGRAPH:
                token = yield determiners()
                break
            if token == pronoun:
                subject = topic
            else:
                subject = yield from noun_phrase(lexicon, lexicon.nouns, token)


def separator(previous: Optional[str], token: str) -> str:
    """What comes before `token` in the text: a space between words, nothing before a period or a
    paragraph break, nor at the start of a paragraph."""
    return " " if previous not in (None, PARAGRAPH) and token not in (PERIOD, PARAGRAPH) else ""


def render(tokens: List[str]) -> Tuple[str, List[int]]:
    """The text (words joined by spaces, a period on its word, paragraphs apart by a blank line,
    each sentence capitalised) and each token's offset in it."""
    out: List[str] = []
    offsets: List[int] = []
    length, previous = 0, None
    for token in tokens:
        out.append(separator(previous, token))
        length += len(out[-1])
        offsets.append(length)
        starts_sentence = previous in (None, PERIOD, PARAGRAPH) and token != PARAGRAPH
        out.append(token.capitalize() if starts_sentence else token)
        length += len(token)
        previous = token
    return "".join(out), offsets


def tokens_of(text: str) -> List[str]:
    return [t.lower() if t != PARAGRAPH else t for t in re.findall(r"\n\n|[^\s.]+|\.", text)]


def information(text: str, lexicon: Lexicon) -> float:
    """-log2 of the text's probability under the language, in bits (a text that ends inside a
    sentence is scored up to where it ends). Raises ValueError if the language cannot write it."""
    grammar = language(lexicon)
    options, bits = next(grammar), 0.0
    for token in tokens_of(text):
        if token not in options:
            raise ValueError(f"flat.train.corpus: {token!r} cannot come here; expected one of {sorted(options)[:8]}")
        bits -= log2(options[token])
        options = grammar.send(token)
    return bits


@lru_cache(maxsize=4)
def generate(characters: int, seed: int = 0) -> Tuple[str, List[Tuple[int, float]]]:
    """At least `characters` characters of the language (whole paragraphs), and each token's
    (offset in the text, bits)."""
    rng = random.Random(seed)
    grammar = language(Lexicon())
    options = next(grammar)
    tokens: List[str] = []
    bits: List[float] = []
    length = 0
    while True:
        token = rng.choices(list(options), weights=list(options.values()))[0]
        if token == PARAGRAPH and length >= characters:
            break
        length += len(separator(tokens[-1] if tokens else None, token)) + len(token)
        tokens.append(token)
        bits.append(-log2(options[token]))
        options = grammar.send(token)
    text, offsets = render(tokens)
    return text, list(zip(offsets, bits))
