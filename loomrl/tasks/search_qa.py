"""Questions about a generated world that only a search tool can answer (Search-R1 style).

A seeded generator builds a fictional world: countries with capitals, cities in countries, and
people with a profession, a birth year and a birth city. Every fact is written once into a small
encyclopedia (``corpus()``: one document per person, city and country) that the search tool
indexes; the names are invented, so a model cannot know the answers and must look them up.

  hop 1: "In which city was Tamsin Orvel born?"     -> the person's document
  hop 2: "In which country was Tamsin Orvel born?"  -> the person's, then the city's document

The world is a pure function of ``world_seed``; training items a pure function of (seed, index).
People are split by a hash of their name: questions about held-out people never appear in
training, while their documents stay in the corpus (the tool can find them at evaluation).
Answers are read from the last ``<answer>...</answer>`` and compared after normalisation
(lower case, punctuation, articles and extra spaces removed): exact match, as Search-R1 scores.

No torch, no tokenizer.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

from loomrl.errors import ConfigError
from loomrl.reward import RewardResult
from loomrl.tasks.base import Example, check_index, in_eval_split

# The tags of the tool protocol: the model writes <search> q </search> or <answer> a </answer>;
# the rollout inserts the results between <information> and </information>.
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
MAX_ANSWER_CHARS = 200

_ONSETS = "b br c ch d dr f g gr h j k l m n p pr qu r s st t tr v w z".split()
_VOWELS = "a e i o u ai ea io ou y".split()
_CODAS = "l n r s th m nd rk ck x".split() + [""] * 4
PROFESSIONS = (
    "baker sailor weaver potter painter carpenter astronomer glassblower blacksmith cartographer "
    "violinist botanist jeweller engraver shipwright tailor chemist surveyor bookbinder clockmaker"
).split()
QUESTION_KINDS = {
    "city": (1, "In which city was {name} born?"),
    "year": (1, "In what year was {name} born?"),
    "profession": (1, "What was the profession of {name}?"),
    "country": (2, "In which country was {name} born?"),
}


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (SQuAD's normalisation)."""
    text = _ARTICLES.sub(" ", text.lower().translate(_PUNCT))
    return " ".join(text.split())


def extract_answer(text: str) -> str | None:
    """The content of the last complete ``<answer>...</answer>`` in ``text`` (None: none): from
    the last opening tag before the last closing one."""
    # Searched from the end, not with a regex: ".*?" from every "<answer>" scans to the end of
    # the text when no tag closes, quadratic in a response that repeats the opening tag.
    if not isinstance(text, str):
        return None
    end = text.rfind(ANSWER_CLOSE)
    start = text.rfind(ANSWER_OPEN, 0, end) if end >= 0 else -1
    if start < 0:
        return None
    return text[start + len(ANSWER_OPEN) : end].strip()


def _article(noun: str) -> str:
    return "an" if noun[0] in "aeiou" else "a"


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(
        rng.choice(_ONSETS)
        + rng.choice(_VOWELS)
        + (rng.choice(_CODAS) if i == syllables - 1 else "")
        for i in range(syllables)
    ).capitalize()


def _unique_words(
    rng: random.Random, n: int, syllables: tuple[int, ...], taken: set[str]
) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        w = _word(rng, rng.choice(syllables))
        if w not in taken and len(w) >= 4:
            taken.add(w)
            out.append(w)
    return out


@dataclass(frozen=True)
class World:
    """The generated facts: country -> capital, city -> country, person -> (job, year, city)."""

    countries: dict[str, str]
    cities: dict[str, str]
    people: dict[str, tuple[str, int, str]]

    def documents(self) -> list[dict[str, str]]:
        docs = []
        for name, (job, year, city) in self.people.items():
            docs.append(
                {
                    "title": name,
                    "text": f"{name} was {_article(job)} {job} born in {year} in the city of {city}.",
                }
            )
        for city, country in self.cities.items():
            docs.append({"title": city, "text": f"{city} is a city in the country of {country}."})
        for country, capital in self.countries.items():
            docs.append(
                {"title": country, "text": f"{country} is a country whose capital is {capital}."}
            )
        return docs


def build_world(world_seed: int, people: int, countries: int, cities_per_country: int) -> World:
    rng = random.Random(f"loomrl-search-world-{world_seed}")
    taken: set[str] = set()
    country_names = _unique_words(rng, countries, (2, 3), taken)
    cities: dict[str, str] = {}
    capitals: dict[str, str] = {}
    for c in country_names:
        mine = _unique_words(rng, cities_per_country, (2, 3), taken)
        capitals[c] = mine[0]
        cities.update(dict.fromkeys(mine, c))
    city_list = list(cities)
    firsts = _unique_words(rng, max(8, int(people**0.5) * 2), (2,), taken)
    lasts = _unique_words(rng, max(8, int(people**0.5) * 2), (2, 3), taken)
    folks: dict[str, tuple[str, int, str]] = {}
    while len(folks) < people:
        name = f"{rng.choice(firsts)} {rng.choice(lasts)}"
        if name not in folks:
            folks[name] = (rng.choice(PROFESSIONS), rng.randint(1700, 1999), rng.choice(city_list))
    return World(capitals, cities, folks)


@dataclass
class SearchQATask:
    """Questions about generated people; answers need the search tool (see the module docstring).

    ``hops``: 1 (city, year, profession), 2 (country: two look-ups) or "mixed" (all four kinds).
    """

    seed: int = 0
    world_seed: int = 0
    people: int = 1000
    countries: int = 24
    cities_per_country: int = 6
    hops: Any = "mixed"
    eval_size: int = 64
    eval_fraction: float = 0.1
    name: str = field(default="search_qa", init=False)

    HOPS: ClassVar[tuple[Any, ...]] = (1, 2, "mixed")

    def __post_init__(self) -> None:
        problems = []
        if self.hops not in self.HOPS:
            problems.append(f"hops: {self.hops!r} is not one of 1, 2, 'mixed'")
        if self.people < 10:
            problems.append(f"people: must be >= 10, got {self.people}")
        if self.countries < 2:
            problems.append(f"countries: must be >= 2, got {self.countries}")
        if self.cities_per_country < 1:
            problems.append(f"cities_per_country: must be >= 1, got {self.cities_per_country}")
        if not 0 < self.eval_fraction < 1:
            problems.append(f"eval_fraction: must be in (0, 1), got {self.eval_fraction}")
        if self.eval_size < 1:
            problems.append(f"eval_size: must be >= 1, got {self.eval_size}")
        if problems:
            raise ConfigError(problems, source="task 'search_qa'")
        kinds = [k for k, (h, _) in QUESTION_KINDS.items() if self.hops in ("mixed", h)]
        self._kinds = kinds
        held = [p for p in self.world.people if in_eval_split(p, self.eval_fraction)]
        self._train_people = [p for p in self.world.people if p not in set(held)]
        self._eval_people = held
        if not self._train_people or not self._eval_people:
            raise ConfigError(
                [
                    f"people={self.people} with eval_fraction={self.eval_fraction} leaves "
                    f"{len(self._train_people)} training and {len(self._eval_people)} held-out "
                    "people; use more people"
                ],
                source="task 'search_qa'",
            )

    @cached_property
    def world(self) -> World:
        return build_world(self.world_seed, self.people, self.countries, self.cities_per_country)

    def corpus(self) -> list[dict[str, str]]:
        """The encyclopedia the search tool indexes: ``{"title", "text"}`` per document."""
        return self.world.documents()

    def _example(self, person: str, kind: str) -> Example:
        job, year, city = self.world.people[person]
        answer = {
            "city": city,
            "year": str(year),
            "profession": job,
            "country": self.world.cities[city],
        }[kind]
        hops, template = QUESTION_KINDS[kind]
        return Example(
            template.format(name=person), answer, {"kind": kind, "hops": hops, "person": person}
        )

    def train_item(self, index: int) -> Example:
        check_index(index)
        rng = random.Random(f"search-qa-{self.seed}-{index}")
        return self._example(rng.choice(self._train_people), rng.choice(self._kinds))

    def eval_set(self) -> list[Example]:
        rng = random.Random(f"search-qa-eval-{self.world_seed}")
        people = sorted(self._eval_people)
        rng.shuffle(people)
        out = []
        for i in range(self.eval_size):
            out.append(self._example(people[i % len(people)], self._kinds[i % len(self._kinds)]))
        return out

    def score(self, response_text: str, example: Example) -> RewardResult:
        parsed = extract_answer(response_text)
        if parsed is None:
            return RewardResult(0.0, None, True, reason="no_answer")
        if len(parsed) > MAX_ANSWER_CHARS:
            return RewardResult(0.0, parsed[:MAX_ANSWER_CHARS], True, reason="too_long")
        ok = normalize_answer(parsed) == normalize_answer(example.answer)
        return RewardResult(float(ok), parsed, False, ok, "correct" if ok else "wrong")
