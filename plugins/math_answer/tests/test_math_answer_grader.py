import signal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nodus.core import Task
from nodus_env_math_answer import MathAnswer
from nodus_env_math_answer.equivalence import equivalent, time_limit
from nodus_env_math_answer.extract import asks_for_percent, counted_words, final_answer

ENV = MathAnswer()


def task_with(answer: str, question: str = "q") -> Task:
    return Task(env="math-answer@1", id="t", split="train", seed=0, index=0, draw=0,
                data={"question": question, "answer": answer, "source": "generated", "family": "x"})


@pytest.mark.parametrize(
    ("gold", "completion"),
    [
        ("1000", "\\boxed{1,000}"),
        ("1/2", "\\boxed{\\frac{1}{2}}"),
        ("1/2", "#### 0.5"),
        ("0.5", "The answer is 1/2."),
        ("0.5", "<answer>50\\%</answer>"),
        ("-7/4", "so x = \\boxed{-\\frac{7}{4}}"),
        ("-3", "The final answer is: -3"),
        ("12.5", "#### $12.50"),
        ("\\text{Monday}", "\\boxed{\\text{Monday}}"),
        ("\\frac{\\pi}{2}", "\\boxed{\\frac{\\pi}{2}}"),
    ],
)
def test_equivalent_forms_pass(gold: str, completion: str) -> None:
    grade = ENV.grade(task_with(gold), completion)
    assert grade.passed and grade.score == 1.0, grade.details


@pytest.mark.parametrize(
    ("gold", "completion", "reason"),
    [
        ("-3", "\\boxed{3}", "is not equivalent"),
        ("7/3", "\\boxed{2.333}", "is not equivalent"),
        ("5", "I think it's 5.", "no final answer"),
        ("5", "\\boxed{}", "is empty"),
        ("5", "\\boxed{" + "1" * 300 + "}", "over 200 chars"),
        ("5", "\\boxed{\\}", "cannot be read"),
        ("5", "\\boxed{5} no wait, the answer is 6", "is not equivalent"),  # the last marked answer counts
    ],
)
def test_wrong_or_missing_answers_fail_with_the_reason(gold: str, completion: str, reason: str) -> None:
    grade = ENV.grade(task_with(gold), completion)
    assert not grade.passed and grade.score == 0.0
    assert reason in grade.details, grade.details


@pytest.mark.parametrize(
    "completion",
    [
        "65/5 = 13.\n\n\\boxed{13}\n\nNote: the answer is independent of the order of the games.\n",
        "65/5 = 13.\n\n\\boxed{13}\n\n#### Verification\nSum is 65 and 65/5 = 13.\n",
        "The answer is 13.\n#### Step 2: check the sum",
    ],
)
def test_a_marker_in_prose_after_the_answer_does_not_replace_it(completion: str) -> None:
    grade = ENV.grade(task_with("13"), completion)
    assert grade.passed and grade.score == 1.0, grade.details


@pytest.mark.parametrize(
    ("completion", "passes"),
    [
        ("\\boxed{12}\nThe answer is $x = 13$ where x is the count.", True),  # it graded the boxed 12
        ("\\boxed{12}\nThe answer is $13$, counting both ends.", True),
        ("\\boxed{13}\nThe answer is $12$ or $13$.", True),  # two spans: a hedge, not math; the boxed 13 stands
        ("\\boxed{12}\nThe answer is $12$ or $13$.", False),
        ("\\boxed{13}\nNote: the answer is $n$-independent.", True),
        ("\\boxed{13}\nThe answer is 14 if we count twice.", False),  # a hedge: graded, and it fails
    ],
)
def test_a_prose_marker_that_starts_with_a_math_span_reads_as_math(completion: str, passes: bool) -> None:
    grade = ENV.grade(task_with("13"), completion)
    assert grade.passed is passes, grade.details


@pytest.mark.parametrize(
    ("completion", "passes"),
    [
        ("The answer is 13, which is the mean of the five scores.", True),
        ("The answer is $x = 13$ where $x$ is the count.", True),
        ("The answer is 13 because the sum is split evenly.", True),
        ("#### 13, since each game counts once", True),
        ("The answer is 13, which could also be 12.", False),  # another value: a hedge
        ("The answer is 13, which is wrong.", False),
        ("The answer is 13, which is not correct.", False),
        ("The answer is 13, which is about a dozen.", False),
        ("The answer is 13 thousand, which is the total.", False),  # the scale stays with the number
        ("The answer is 13 if we count twice, which is the rule.", False),
        ("The answer is 13, which is a typo for twelve.", False),  # a retraction: a number word, "typo"
        ("The answer is 13 when n is even, otherwise twelve.", False),
        ("The answer is 13, which can't be right.", False),
        ("The answer is 13, which doesn't hold.", False),
    ],
)
def test_an_explanatory_clause_after_a_written_answer_is_not_part_of_it(completion: str, passes: bool) -> None:
    grade = ENV.grade(task_with("13"), completion)
    assert grade.passed is passes, grade.details


def test_a_long_run_of_spaces_after_a_written_answer_is_graded_at_once() -> None:
    # The clause search backtracked quadratically over whitespace: 30,000 spaces timed out the grader (10 s).
    grade = ENV.grade(task_with("13"), "#### 13" + " " * 30_000 + "x")
    assert not grade.passed and "over 200 chars" in grade.details, grade.details


@pytest.mark.parametrize("completion", ["The answer is **13**.", "**The answer is 13.**", "#### _13_"])
def test_markdown_emphasis_around_a_written_answer_is_ignored(completion: str) -> None:
    grade = ENV.grade(task_with("13"), completion)
    assert grade.passed and grade.score == 1.0, grade.details


@pytest.mark.parametrize(
    ("gold", "completion"),
    [
        ("13", "\\boxed{13 points}"),
        ("42", "\\boxed{42 muffins}"),
        ("42", "The answer is 42 marbles."),
        ("-5", "\\boxed{-5 degrees}"),
        ("7/6", "\\boxed{\\frac{7}{6} pizzas each}"),
        ("31.24", "The answer is 31.24 dollars."),
        ("13", "\\boxed{13 months}"),
        ("13", "The answer is 13 more apples."),  # "how many more": math-verify drops "more"
    ],
)
def test_a_unit_word_after_a_number_is_ignored(gold: str, completion: str) -> None:
    grade = ENV.grade(task_with(gold), completion)
    assert grade.passed and grade.score == 1.0, grade.details


@pytest.mark.parametrize(
    ("gold", "completion", "passes"),
    [
        ("7/6", "\\boxed{1.166667}", False),  # the problems ask for the exact value
        ("7/3", "\\boxed{2.333333}", False),
        ("7/3", "\\boxed{2.3333333333333333333}", False),
        ("13", "\\boxed{13.0000001}", False),
        ("16/5", "\\boxed{3.2}", True),  # a terminating decimal is exact
        ("27.3", "\\boxed{27.30}", True),
        ("13", "\\boxed{13.0}", True),
    ],
)
def test_a_decimal_passes_only_when_it_is_the_exact_value(gold: str, completion: str, passes: bool) -> None:
    grade = ENV.grade(task_with(gold), completion)
    assert grade.passed is passes and grade.score == float(passes), grade.details


@pytest.mark.parametrize(
    ("completion", "passes"),
    [
        ("\\boxed{12 = 13}", False),
        ("\\boxed{2+2=5=13}", False),
        ("\\boxed{x = 13}", True),
        ("\\boxed{65/5 = 13}", True),
    ],
)
def test_an_equation_passes_only_when_it_is_true(completion: str, passes: bool) -> None:
    grade = ENV.grade(task_with("13"), completion)
    assert grade.passed is passes, grade.details
    assert passes or "is a false equation" in grade.details


@pytest.mark.parametrize(
    "completion",
    [
        "\\boxed{13} or \\boxed{12}",  # the last boxed answer counts
        "\\boxed{12, 13}",
        "\\boxed{\\{12, 13\\}}",
        "\\boxed{[12, 14]}",
        "\\boxed{13 thousand}",  # a word that changes the value is not a unit
    ],
)
def test_hedged_or_changed_answers_still_fail(completion: str) -> None:
    assert not ENV.grade(task_with("13"), completion).passed


@pytest.mark.parametrize(
    "completion",
    ["#### 13 grand", "#### 13 lakhs", "#### 13 pairs", "#### 13 max", "#### 13 rounded", "#### 13 per cent"]
    + ["#### 13 pct", "#### 13 percents"],
)
def test_scales_bounds_and_percent_spellings_are_not_units(completion: str) -> None:
    # Each passed for 13 as a unit word; a percent where none is asked is 0.13.
    assert not ENV.grade(task_with("13"), completion).passed


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        ("13 dozen", "dozen"),
        ("13 trillion", "trillion"),  # math-verify itself reads "13 trillion" as 13
        ("13 factorial", "factorial"),
        ("13 hundredths", "hundredths"),
        ("13 is wrong", "is wrong"),
        ("13 is not correct", "is not correct"),
        ("13 at most", "at most"),
        ("13 approximately", "approximately"),
        ("13 or more", "or"),
        ("13 untrue", "untrue"),
        ("13 is my guess but could be fourteen", "is guess but"),
    ],
)
def test_words_that_change_or_negate_the_number_are_not_units(answer: str, words: str) -> None:
    # Stripped as units, each of these passed for 13 (all but "13 trillion" failed before units were stripped).
    for completion in (f"\\boxed{{{answer}}}", f"The answer is {answer}."):
        grade = ENV.grade(task_with("13"), completion)
        assert not grade.passed and grade.score == 0.0, (completion, grade.details)
        assert f"is not a number alone: {words!r} changes or qualifies it" in grade.details, grade.details
    assert not ENV.grade(task_with("0.13"), "\\boxed{13 hundredths}").passed


def test_last_number_fallback_is_a_grading_parameter() -> None:
    lenient = MathAnswer({"last_number_fallback": True})
    assert lenient.grade(task_with("5"), "so we get 5").passed
    assert not ENV.grade(task_with("5"), "so we get 5").passed
    assert lenient.tasks("heldout", 42, 4) == ENV.tasks("heldout", 42, 4)


def test_extraction_is_linear_on_hostile_input() -> None:
    import time

    for text in ("\\boxed{" * 100_000, "<answer>" * 100_000, "{" * 500_000 + "\\boxed{1}", "the answer is " * 50_000):
        started = time.perf_counter()
        final_answer(text, last_number_fallback=True)
        assert time.perf_counter() - started < 1.0


def test_the_parse_timer_keeps_the_sandbox_workers_wall_time_guard() -> None:
    # The worker arms ITIMER_REAL for the whole job; math-verify's own alarm(0) would cancel it.
    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    signal.setitimer(signal.ITIMER_REAL, 30.0)
    try:
        assert equivalent("1/2", "0.5") == (True, "'0.5' is equivalent to '1/2'")
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25.0 < left <= 30.0
        assert signal.getsignal(signal.SIGALRM) is not None and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_the_parse_timer_stops_slow_work_and_reports_it() -> None:
    import time

    started = time.perf_counter()
    with pytest.raises(BaseException) as raised, time_limit(0.2):
        while True:
            pass
    assert type(raised.value).__name__ == "ParseTimeout"
    assert time.perf_counter() - started < 2.0
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0.0


TASKS = ENV.tasks("heldout", 42, 12)
WRAPPERS = ["\\boxed{{{}}}", "#### {}", "<answer>{}</answer>", "The answer is {}.", "Thus $x = \\boxed{{{}}}$"]


def written(answer: str, style: int) -> str:
    value = Fraction(answer)
    if style == 1 and value.denominator != 1:
        return f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
    if style == 2:
        return f"{float(value):.6g}" if len(str(float(value))) < 10 else answer
    return answer


@settings(max_examples=40, deadline=None)
@given(index=st.integers(0, len(TASKS) - 1), wrapper=st.sampled_from(WRAPPERS), style=st.integers(0, 2),
       prose=st.text(alphabet="abc ,.\n", max_size=40))
def test_the_right_answer_in_any_marked_form_passes(index: int, wrapper: str, style: int, prose: str) -> None:
    task = TASKS[index]
    completion = prose + "\n" + wrapper.format(written(task.data["answer"], style))
    grade = ENV.grade(task, completion)
    assert grade.passed, (completion, grade.details)


@settings(max_examples=40, deadline=None)
@given(index=st.integers(0, len(TASKS) - 1), offset=st.integers(-50, 50).filter(bool))
def test_an_answer_off_by_any_amount_fails(index: int, offset: int) -> None:
    task = TASKS[index]
    wrong = Fraction(task.data["answer"]) + offset
    assert not ENV.grade(task, f"\\boxed{{{wrong}}}").passed


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=300))
def test_grader_never_raises_and_scores_in_range(text: str) -> None:
    grade = ENV.grade(TASKS[0], text)
    assert grade.score in (0.0, 1.0) and grade.details


def test_a_shorter_outer_deadline_still_fires_after_the_parse_timer() -> None:
    import time

    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    signal.setitimer(signal.ITIMER_REAL, 0.2)  # the worker's job deadline, shorter than the 3 s parse limit
    try:
        with pytest.raises(BaseException) as raised, time_limit(3.0):
            while True:
                pass
        assert type(raised.value).__name__ == "ParseTimeout"
        time.sleep(0.05)
        assert fired == [signal.SIGALRM]  # the job deadline was passed on, not swallowed
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# Held-out task 0 for seed 42: "The scores of a team in 5 games were 2, 20, 33, 1, 9. What is the mean score? ..." = 13.
MEAN_13 = TASKS[0]
WHAT_PERCENT = "A bag has 100 marbles and 13 are red. What percent of the marbles are red?"
HOW_MANY_QUARTERS = "Bo has $3.25, all in quarters. How many quarters does Bo have?"


def test_held_out_task_0_is_a_mean_of_13() -> None:
    assert MEAN_13.data["answer"] == "13" and "mean score" in MEAN_13.data["question"]


@pytest.mark.parametrize(
    ("gold", "completion", "values"),
    [
        ("13", "The answer is $x = 12$ if even else $x = 13$", "12, 13"),
        ("12", "The answer is $x=13$ if even else $x = 12$", "13, 12"),
        ("13", "\\boxed{x = 12 \\text{ if even else } x = 13}", "12, 13"),
        ("13", "The answer is $12$ (or $13$ if counting the ends).", "12, 13"),
        ("13", "The answer is \\(x = 12\\) if even else \\(x = 13\\).", "12, 13"),
        ("13", "\\boxed{12 \\lor 13}", "12, 13"),
        ("12", "\\boxed{12 \\text{ if even}, 13 \\text{ if odd}}", "12, 13"),
        ("13", "\\boxed{12} or \\boxed{13}", "12, 13"),  # two boxes on the final line: two final answers
        ("13", "The answer is $\\boxed{12}$ or $\\boxed{13}$.", "12, 13"),
        ("\\sqrt{2}", "The answer is $\\sqrt{2}$, about $1.414$.", "sqrt(2), 707/500"),
    ],
)
def test_several_different_final_answers_fail(gold: str, completion: str, values: str) -> None:
    # math-verify grades the last piece of math, so each of these passed for its last value.
    grade = ENV.grade(task_with(gold), completion)
    assert not grade.passed and grade.score == 0.0, grade.details
    assert f"gives several answers ({values}): commit to one" in grade.details, grade.details


@pytest.mark.parametrize(
    "completion",
    [
        "x = 13, so the answer is \\boxed{13}",
        "The answer is $13$, i.e. $x = 13$.",
        "The answer is $13$ (that is, $65/5$).",
        "The answer is $x = 65/5 = 13$.",
        "\\boxed{13 \\text{ (since } 65/5 = 13)}",
        "\\boxed{13} = \\boxed{13}",
        "\\boxed{13 \\text{ points}}",
        "\\boxed{12}\nWait, that double-counts a game.\n\\boxed{13}",  # a box on an earlier line is replaced
        # Boxes on the final line without a word that makes them alternatives: steps to the last one.
        "The sum is \\boxed{65}, so the mean is \\boxed{13}.",
        "Alice has \\boxed{5} apples, so the total is \\boxed{13}.",
        "\\boxed{13} \\boxed{13}",
    ],
)
def test_restating_the_same_final_answer_passes(completion: str) -> None:
    grade = ENV.grade(MEAN_13, completion)
    assert grade.passed and grade.score == 1.0, grade.details


NOT_ASKED = "(the question does not ask for a percentage, so a percent is its number over 100)"


@pytest.mark.parametrize(
    ("gold", "question", "completion", "passes"),
    [
        # A percent is its value (13% = 0.13) unless the question asks for a percentage ...
        ("13", MEAN_13.data["question"], "The answer is 13 percent.", False),
        ("13", MEAN_13.data["question"], "\\boxed{13\\%}", False),
        ("0.13", "q", "The answer is 13 percent.", True),
        ("0.13", "q", "\\boxed{13\\%}", True),
        ("15", "A $20 shirt is 25% off. How many dollars does it cost?", "\\boxed{15\\%}", False),
        # ... when it is the number of percent, with or without the sign: 13, not 0.13.
        ("13", WHAT_PERCENT, "The answer is 13 percent.", True),
        ("13", WHAT_PERCENT, "\\boxed{13\\%}", True),
        ("13", WHAT_PERCENT, "\\boxed{13}", True),
        ("13", WHAT_PERCENT, "\\boxed{0.13}", False),
        ("12.5", WHAT_PERCENT, "\\boxed{12.5\\%}", True),
        ("13\\%", "q", "\\boxed{13}", True),  # an expected answer written as a percent asks for one
        ("13\\%", "q", "\\boxed{13 percent}", True),
        ("13\\%", "q", "\\boxed{0.13}", False),
    ],
)
def test_a_percent_is_the_value_the_question_asks_for(gold: str, question: str, completion: str, passes: bool) -> None:
    # Before, "13 percent" and "13%" passed both for 13 and for 0.13 (and 0.13 for "13\%").
    grade = ENV.grade(task_with(gold, question), completion)
    assert grade.passed is passes and grade.score == float(passes), grade.details


def test_a_percent_where_none_is_asked_says_why() -> None:
    grade = ENV.grade(MEAN_13, "The answer is 13 percent.")
    assert grade.details == f"'the answer is': '13 percent' is not equivalent to the expected answer {NOT_ASKED}"
    grade = ENV.grade(task_with("13", WHAT_PERCENT), "\\boxed{0.13}")
    assert grade.details == "boxed: '0.13' is not equivalent to the expected answer"


@pytest.mark.parametrize(
    ("question", "asks"),
    [
        (WHAT_PERCENT, True),
        ("What is the percentage increase in price?", True),
        ("Express 1/4 as a percent.", True),
        ("What is the interest rate (in %)?", True),
        ("A shirt is 25% off. How many dollars does it cost?", False),
        ("A 25 percent tip was added. What was the bill?", False),
        ("The tax is $8\\%$. What is the total?", False),
        (MEAN_13.data["question"], False),
    ],
)
def test_asks_for_percent(question: str, asks: bool) -> None:
    assert asks_for_percent(question) is asks


@pytest.mark.parametrize(
    "completion",
    [
        "The answer is 13 correct.",
        "\\boxed{13 correct answers}",
        "\\boxed{13 youths}",
        "\\boxed{13 truths}",
        "\\boxed{13 strengths}",
        "\\boxed{13 months}",
    ],
)
def test_ordinary_words_after_the_number_are_units(completion: str) -> None:
    # Each failed: "correct" was listed as changing the value, and every word ending in "ths" as a plural ordinal.
    grade = ENV.grade(MEAN_13, completion)
    assert grade.passed and grade.score == 1.0, grade.details


@pytest.mark.parametrize(
    ("gold", "question", "completion", "words"),
    [
        ("13", HOW_MANY_QUARTERS, "\\boxed{13 quarters}", None),  # the coins the question counts
        ("1", "How many quarters make 25 cents?", "\\boxed{1 quarter}", None),
        ("13", "How many dozen eggs does Ana buy?", "\\boxed{13 dozen}", None),
        ("39", "How many thirds are in 13 cakes?", "\\boxed{39 thirds}", None),
        ("13", MEAN_13.data["question"], "\\boxed{13 quarters}", "quarters"),  # elsewhere, 13 quarters is 13/4
        ("13/4", "q", "\\boxed{13 quarters}", "quarters"),  # ... and not credited as 13/4 either
        ("24", "Ana buys 2 dozen eggs. How many eggs does she buy?", "\\boxed{24 dozen}", "dozen"),
        ("13", MEAN_13.data["question"], "\\boxed{13 thousand}", "thousand"),
        ("13", MEAN_13.data["question"], "\\boxed{13 halves}", "halves"),
        ("13", MEAN_13.data["question"], "\\boxed{13 thirds}", "thirds"),
        ("13", MEAN_13.data["question"], "\\boxed{13 dozen}", "dozen"),
        ("13", MEAN_13.data["question"], "\\boxed{13 twentieths}", "twentieths"),
        ("13", HOW_MANY_QUARTERS, "\\boxed{13 quarters at most}", "at most"),
    ],
)
def test_a_scale_word_is_a_unit_only_where_the_question_counts_in_it(
    gold: str, question: str, completion: str, words: str | None
) -> None:
    grade = ENV.grade(task_with(gold, question), completion)
    assert grade.passed is (words is None), grade.details
    assert words is None or grade.details.endswith(f"is not a number alone: {words!r} changes or qualifies it")


def test_counted_words() -> None:
    assert counted_words(HOW_MANY_QUARTERS) == {"quarter", "quarters"}
    assert counted_words("How many dozen eggs? How many apples?") == {"dozen", "dozens"}
    assert counted_words(MEAN_13.data["question"]) == frozenset()


@pytest.mark.parametrize(
    ("gold", "completion", "passes"),
    [
        ("\\sqrt{2}", "\\boxed{1.41421356}", False),  # the exact value is asked, as for 7/6
        ("2\\sqrt{3}", "\\boxed{3.4641016}", False),
        ("\\frac{\\pi}{2}", "\\boxed{1.5707963}", False),
        ("\\sqrt{2}", "\\boxed{\\sqrt{2}}", True),
        ("\\sqrt{2}", "\\boxed{\\frac{2}{\\sqrt{2}}}", True),
        ("2\\sqrt{3}", "\\boxed{\\sqrt{12}}", True),
        ("\\frac{3}{2}\\sqrt{2}", "\\boxed{1.5\\sqrt{2}}", True),  # a terminating decimal is exact
        ("\\sqrt{2}", "\\boxed{\\sqrt{2} units}", True),
    ],
)
def test_a_decimal_does_not_pass_for_an_irrational_answer(gold: str, completion: str, passes: bool) -> None:
    grade = ENV.grade(task_with(gold), completion)
    assert grade.passed is passes and grade.score == float(passes), grade.details
    assert passes or grade.details.endswith(
        "is not equivalent to the expected answer (only close to it: a decimal is the exact number it writes, and "
        "the exact value is asked)"
    )
