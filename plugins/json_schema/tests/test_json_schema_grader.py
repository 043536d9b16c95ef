import copy
import json
import re

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nodus.core import Task
from nodus_env_json_schema import JsonSchema
from nodus_env_json_schema.answer import NoJson, extract_json
from nodus_env_json_schema.validation import ecma_end_anchors

ENV = JsonSchema()
TASKS = ENV.tasks("heldout", 42, 16)
SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "maximum": 3},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 1},
    },
    "required": ["n", "ok"],
    "additionalProperties": False,
}


def task_for(expected: dict[str, object]) -> Task:
    data = {"schema": SCHEMA, "expected": expected, "reference": {}, "request": "r", "source": "file"}
    return Task(env="json-schema@1", id="t", split="train", seed=0, index=0, draw=0, data=data)


@pytest.mark.parametrize(
    ("completion", "value", "where"),
    [
        ('Sure:\n```json\n{"a": 1}\n```', {"a": 1}, "fenced block"),
        ('```json\n{"a": 1}\n```\nbetter:\n```\n{"a": 2}\n```', {"a": 2}, "fenced block"),  # last block wins
        ('```json\n{"a": 1}\n```\n```json\n{broken\n```', {"a": 1}, "fenced block"),  # last that parses
        ('I propose {"a": [1, 2]} and then {"b": 3}.', {"a": [1, 2]}, "prose"),  # first complete value
        ('Set {curly} aside; use [1, {"x": null}]', [1, {"x": None}], "prose"),
    ],
)
def test_json_is_extracted_from_fences_or_prose(completion: str, value: object, where: str) -> None:
    assert extract_json(completion) == (value, where)


def test_every_violation_is_listed() -> None:
    grade = ENV.grade(task_for({"/n": 2, "/ok": True}), '{"n": 5, "tags": ["a", 1, "c"], "extra": 0}')
    assert not grade.passed and grade.score == 0.0
    for problem in (
        "at /: 'ok' is a required property",
        "at /: Additional properties are not allowed",
        "at /n: 5 is greater than the maximum of 3",
        "at /tags: ['a', 1, 'c'] is too long",
        "at /tags/1: 1 is not of type 'string'",
        "at /n: the request asks for 2, got 5",
        "at /ok: missing, the request asks for true",
    ):
        assert problem in grade.details, (problem, grade.details)
    assert grade.details.startswith("JSON from the prose: 7 violations:")


def test_requested_values_are_type_strict() -> None:
    task = task_for({"/n": 1, "/ok": True})
    assert ENV.grade(task, '{"n": 1, "ok": true}').passed
    assert "the request asks for true, got 1" in ENV.grade(task, '{"n": 1, "ok": 1}').details  # schema catches too
    loose = task.model_copy(update={"data": {**task.data, "schema": {}}})
    assert not ENV.grade(loose, '{"n": true, "ok": true}').passed  # true is not 1
    assert ENV.grade(loose, '{"n": 1.0, "ok": true}').passed  # 1.0 and 1 are the same JSON number


def test_no_json_is_a_zero_with_the_reason() -> None:
    assert ENV.grade(TASKS[0], "I'd rather not.").details.startswith("no JSON found")
    assert "not valid JSON" in ENV.grade(TASKS[0], "```json\n{nope}\n```").details


def independent_verdict(task: Task, instance: object) -> bool:
    """A second implementation: jsonschema's own validate() and a plain walk for the requested values."""
    try:
        jsonschema.validate(instance, task.data["schema"], cls=jsonschema.Draft202012Validator)
    except jsonschema.ValidationError:
        return False
    for pointer, value in task.data["expected"].items():
        node = instance
        for key in pointer.split("/")[1:]:
            if not isinstance(node, dict) or key not in node:
                return False
            node = node[key]
        if type(node) is not type(value) and not (isinstance(node, int | float) and isinstance(value, int | float)):
            return False
        if node != value or isinstance(node, bool) != isinstance(value, bool):
            return False
    return True


def leaves(value: object, path: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in leaves(item, (*path, key))] or [path]
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in leaves(item, (*path, i))] or [path]
    return [path]


@settings(max_examples=100, deadline=None)
@given(index=st.integers(0, len(TASKS) - 1), data=st.data())
def test_grader_agrees_with_an_independent_check_on_perturbed_references(index: int, data: st.DataObject) -> None:
    task = TASKS[index]
    instance = copy.deepcopy(task.data["reference"])
    path = data.draw(st.sampled_from(leaves(instance)))
    if path:  # change or delete one leaf (or leave it as it is: the reference must then pass)
        parent = instance
        for key in path[:-1]:
            parent = parent[key]  # type: ignore[index]
        new = data.draw(
            st.one_of(
                st.integers(-1000, 1000), st.booleans(), st.text(max_size=6), st.none(), st.just(parent[path[-1]])
            )
        )  # type: ignore[index]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = new  # type: ignore[index]
    grade = ENV.grade(task, f"```json\n{json.dumps(instance)}\n```")
    assert grade.passed == independent_verdict(task, instance), grade.details


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=300))
def test_grader_never_raises_and_scores_in_range(text: str) -> None:
    grade = ENV.grade(TASKS[0], text)
    assert grade.score in (0.0, 1.0) and grade.details


@pytest.mark.parametrize(
    ("completion", "reason"),
    [
        ('```json\n{"n": NaN, "ok": true}\n```', "the fenced block is not valid JSON (NaN is not a JSON value)"),
        ('```json\n{"n": -Infinity, "ok": true}\n```', "(-Infinity is not a JSON value)"),
        ('```json\n{"n": 1, "ok": true, "tags": [Infinity]}\n```', "(Infinity is not a JSON value)"),
        ('```json\n{"n": 9, "n": 1, "ok": true}\n```', 'the fenced block is not valid JSON (duplicate key "n")'),
        ('```json\n{"n": 1, "ok": true} {"n": 9, "ok": true}\n```', "the fenced block holds more than one JSON value"),
        ('```json\n{"n": 9, "ok": true}\n{"n": 1, "ok": true}\n```', "the fenced block holds more than one JSON value"),
        # in prose, the nested object must not stand in for the refused one
        ('Here: {"n": NaN, "x": {"n": 1, "ok": true}}', "the JSON in the prose is not valid JSON (NaN is"),
        ('Here: {"y": 1, "y": {"n": 1, "ok": true}}', 'the JSON in the prose is not valid JSON (duplicate key "y")'),
    ],
)
def test_what_only_python_reads_as_json_is_refused(completion: str, reason: str) -> None:
    # NaN passes every numeric bound, the last of duplicate keys wins and a block with two values passed via
    # the prose fallback: each let an answer the schema rejects score 1.
    with pytest.raises(NoJson) as raised:
        extract_json(completion)
    assert reason in str(raised.value)
    grade = ENV.grade(task_for({"/n": 1, "/ok": True}), completion)
    assert grade.score == 0.0 and reason in grade.details, grade.details


@pytest.mark.parametrize(
    ("pattern", "translated"),
    [
        ("^[A-Z]{3}-[0-9]{4}$", r"^[A-Z]{3}-[0-9]{4}\Z"),
        ("^(a|b$)$", r"^(a|b\Z)\Z"),
        (r"^\$[0-9]+$", r"^\$[0-9]+\Z"),  # an escaped dollar is a dollar
        (r"^\\$", r"^\\\Z"),  # an escaped backslash, then the anchor
        ("^[$]+$", r"^[$]+\Z"),  # in a class, a dollar
        ("^[]$]x$", r"^[]$]x\Z"),  # Python reads "]" right after "[" as a member
        ("^[^]$]$", r"^[^]$]\Z"),
        (r"^[\]$]$", r"^[\]$]\Z"),
        ("^no anchor", "^no anchor"),
    ],
)
def test_pattern_dollar_anchors_only_the_very_end_as_in_ecma_262(pattern: str, translated: str) -> None:
    assert ecma_end_anchors(pattern) == translated
    re.compile(translated)


def test_a_final_newline_does_not_satisfy_an_anchored_pattern() -> None:
    schema = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
            "price": {"type": "string", "pattern": r"^\$[0-9]+$"},
            "sign": {"type": "string", "pattern": "^[$]$"},
        },
    }
    task = task_for({}).model_copy(update={"data": {**task_for({}).data, "schema": schema}})
    assert ENV.grade(task, json.dumps({"code": "FDJ-3593", "price": "$12", "sign": "$"})).passed
    for wrong in ({"code": "FDJ-3593\n"}, {"price": "$12\n"}, {"sign": "$\n"}, {"code": "FDJ-35934"}):
        grade = ENV.grade(task, json.dumps(wrong))
        assert not grade.passed and "does not match" in grade.details, (wrong, grade.details)
