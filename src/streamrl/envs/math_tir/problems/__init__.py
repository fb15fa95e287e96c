"""The embedded calculation-problem generator (``calc_word_problems``): nine families with
exact answers, difficulty knobs, a fixed 1,500-problem evaluation set and seeded training draws.

Splits are disjoint by seed: training problem ``s`` uses seed ``s`` (``0 <= s < 10**12``) and
evaluation problem ``i`` uses seed ``10**12 + i``. Training never uses a held-out template; the
evaluation set's OOD slice uses only those.
"""

from __future__ import annotations

import functools
import random

from streamrl.envs.math_tir.problems import discrete, everyday, finance
from streamrl.envs.math_tir.problems.exact import RejectDraw
from streamrl.envs.math_tir.problems.model import Draft, Family, Knobs, MathProblem

FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        everyday.FAMILIES[0],  # inventory (shopping)
        finance.FAMILIES[0],  # compound_interest
        finance.FAMILIES[1],  # loan_payment
        everyday.FAMILIES[1],  # unit_conversion
        finance.FAMILIES[2],  # percent_chain
        discrete.FAMILIES[0],  # number_theory
        discrete.FAMILIES[1],  # statistics
        discrete.FAMILIES[2],  # dates
        discrete.FAMILIES[3],  # linear_system
    )
}
FAMILY_NAMES = tuple(FAMILIES)

TRAIN_SEED_LIMIT = 10**12
TEST_SEED_BASE = 10**12
TEST_SIZE = 1500
#: within each family's run of test problems, every fifth uses a held-out template
OOD_PERIOD = 5
_MAX_ATTEMPTS = 200

DISTRACTORS = (
    "The building was renovated {n} years ago.",
    "There are {n} parking spaces next door.",
    "A poster on the wall lists {n} upcoming events.",
    "The nearest bus stop is {n} meters away.",
    "{n} people visited the website yesterday.",
    "The coffee machine in the back room makes about {n} cups a day.",
)


def generate(
    family: str,
    seed: int,
    *,
    knobs: Knobs | None = None,
    held_out: bool = False,
    task_id: str = "",
    redraw: int = 0,
) -> MathProblem:
    """One problem of ``family`` from ``seed`` (deterministic). ``held_out`` draws from the
    family's held-out templates instead of its training ones; ``redraw`` > 0 gives another
    problem for the same seed."""
    if family not in FAMILIES:
        raise ValueError(f"unknown math_tir family {family!r} (known: {', '.join(FAMILY_NAMES)})")
    spec, knobs = FAMILIES[family], knobs or Knobs()
    rng = random.Random(seed if redraw == 0 else f"{seed}/redraw-{redraw}")
    template = rng.choice(spec.held_out if held_out else spec.templates)
    for _ in range(_MAX_ATTEMPTS):
        try:
            draft = spec.build(rng, knobs, template)
            break
        except RejectDraw:
            continue
    else:  # pragma: no cover - every family accepts far more than 1 draw in 200
        raise RuntimeError(f"math_tir family {family!r} rejected {_MAX_ATTEMPTS} draws for seed {seed}")
    return MathProblem(
        task_id=task_id,
        family=family,
        template=f"{family}/{template}",
        question=_with_distractors(draft, rng, knobs.distractors),
        answer=draft.answer,
        params=draft.params,
        held_out=held_out,
    )


def _with_distractors(draft: Draft, rng: random.Random, count: int) -> str:
    sentences = list(draft.context)
    for template in rng.sample(DISTRACTORS, count):
        sentences.insert(rng.randint(1, len(sentences)), template.format(n=rng.randint(2, 99)))
    return " ".join(sentences + [draft.ask])


def train_problem(seed: int, knobs: Knobs | None = None) -> MathProblem:
    """Training problem ``seed``: families cycle with the seed, templates are in-distribution.

    Small families (``C(n, k)`` has a few hundred questions) can repeat an evaluation problem
    by chance; such a draw is replaced, so no training question is ever an evaluation one.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < TRAIN_SEED_LIMIT:
        raise ValueError(f"math_tir train seed must be an int in [0, {TRAIN_SEED_LIMIT}), got {seed!r}")
    family, redraw = FAMILY_NAMES[seed % len(FAMILY_NAMES)], 0
    while True:
        problem = generate(family, seed, knobs=knobs, task_id=f"train/{seed}", redraw=redraw)
        if problem.question not in _eval_questions():
            return problem
        redraw += 1


def is_ood_index(index: int) -> bool:
    return (index // len(FAMILY_NAMES)) % OOD_PERIOD == OOD_PERIOD - 1


@functools.lru_cache(maxsize=1)
def eval_set() -> tuple[MathProblem, ...]:
    """The fixed 1,500-problem evaluation set (default knobs), family-stratified round-robin."""
    return tuple(
        generate(
            FAMILY_NAMES[index % len(FAMILY_NAMES)],
            TEST_SEED_BASE + index,
            held_out=is_ood_index(index),
            task_id=f"test/{index}",
        )
        for index in range(TEST_SIZE)
    )


@functools.lru_cache(maxsize=1)
def _eval_questions() -> frozenset[str]:
    return frozenset(problem.question for problem in eval_set())


def ood_indices() -> tuple[int, ...]:
    """Indices of the evaluation problems that use held-out templates (the OOD slice)."""
    return tuple(index for index in range(TEST_SIZE) if is_ood_index(index))


__all__ = [
    "FAMILIES",
    "FAMILY_NAMES",
    "TEST_SIZE",
    "TRAIN_SEED_LIMIT",
    "Knobs",
    "MathProblem",
    "eval_set",
    "generate",
    "ood_indices",
    "train_problem",
]
