import hashlib
import importlib.metadata
import json
import re
from pathlib import Path

import jsonschema
import pytest
from nodus.core.errors import InvalidParameters, NodusError
from nodus_env_json_schema import JsonSchema
from nodus_env_json_schema.datafile import DataFileError
from nodus_env_json_schema.validation import FORMAT_PACKAGES, unchecked_formats, validator_for

# sha256 of the first 8 tasks of each split for seed 42 with default parameters. If this fails, what
# json-schema@1 generates has changed: put the new behaviour in json-schema@2 and restore @1.
GOLDEN = {
    "train": "0e87e1e2a2202152378599c35430c5648716df7c20de8253f540424c130c0490",
    "heldout": "890bfbcd4f1a6d7112043b616e1b5dd6c5840c823c32cd9bedc250cd4c4a9d2a",
}


def digest(env: JsonSchema, split: str) -> str:
    tasks = [[t.id, env.prompt_text(t), t.data] for t in env.tasks(split, 42, 8)]  # type: ignore[arg-type]
    return hashlib.sha256(json.dumps(tasks, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_golden_tasks_for_seed_42(split: str) -> None:
    assert digest(JsonSchema(), split) == GOLDEN[split]


def keywords(schema: object) -> set[str]:
    if isinstance(schema, dict):
        return set(schema) | {k for value in schema.values() for k in keywords(value)}
    if isinstance(schema, list):
        return {k for value in schema for k in keywords(value)}
    return set()


@pytest.mark.parametrize("depth", [1, 3])
def test_generated_schemas_are_valid_and_their_references_satisfy_them(depth: int) -> None:
    env = JsonSchema({"depth": depth, "fixed_values": 3})
    tasks = env.tasks("train", 3, 200) + env.tasks("heldout", 3, 64)
    used: set[str] = set()
    for task in tasks:
        schema = task.data["schema"]
        jsonschema.Draft202012Validator.check_schema(schema)
        jsonschema.Draft202012Validator(schema).validate(task.data["reference"])
        used |= keywords(schema)
    assert sum(bool(task.data["expected"]) for task in tasks) > 0.9 * len(tasks)  # few have no scalar to fix
    assert {"required", "enum", "pattern", "minimum", "maximum", "minItems", "maxItems", "items"} <= used


def test_the_request_states_every_fixed_value() -> None:
    for task in JsonSchema({"fixed_values": 4}).tasks("heldout", 1, 20):
        for pointer, value in task.data["expected"].items():
            assert f"{pointer[1:].replace('/', '.')} must be {json.dumps(value)}" in task.data["request"]


def test_bounds_are_enforced() -> None:
    with pytest.raises(InvalidParameters, match="depth=4"):
        JsonSchema({"depth": 4})


def write_jsonl(path: Path, records: list[object]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
}
RECORDS = [{"prompt": f"A person called P{n}.", "schema": PERSON, "expected": {"/name": f"P{n}"}} for n in range(120)]


def test_a_task_file_loads_with_synthesised_references(tmp_path: Path) -> None:
    env = JsonSchema({"data": write_jsonl(tmp_path / "t.jsonl", RECORDS)})
    task = env.tasks("train", 0, 1)[0]
    assert task.data["reference"] == {"name": task.data["expected"]["/name"], "age": 0}
    assert env.grade(task, env.reference(task)).passed


def test_reordering_the_file_changes_nothing_and_editing_it_changes_the_draws(tmp_path: Path) -> None:
    original = JsonSchema({"data": write_jsonl(tmp_path / "a.jsonl", RECORDS)})
    reordered = JsonSchema({"data": write_jsonl(tmp_path / "b.jsonl", RECORDS[::-1])})
    edited = JsonSchema({"data": write_jsonl(tmp_path / "c.jsonl", RECORDS[1:])})
    first = [t.data for t in original.tasks("train", 5, 10)]
    assert first == [t.data for t in reordered.tasks("train", 5, 10)]
    assert first != [t.data for t in edited.tasks("train", 5, 10)]


DRAFT4 = "http://json-schema.org/draft-04/schema#"  # its meta-schema does not check patternProperties' names


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"prompt": "p", "schema": {"type": "strnig"}}, r"t.jsonl:2: the schema is invalid \('strnig' is not valid"),
        ({"prompt": "p", "schema": {"minimum": "0"}}, r"t.jsonl:2: the schema is invalid"),
        (
            {"prompt": "p", "schema": {"$schema": DRAFT4, "patternProperties": {"[": {}}}},
            r"t.jsonl:2: the schema is invalid \('\[' in patternProperties is not a valid regular expression \(unterm",
        ),
        (  # under a property named like a data keyword
            {"prompt": "p", "schema": {"$schema": DRAFT4, "properties": {"enum": {"patternProperties": {"(": {}}}}}},
            r"t.jsonl:2: the schema is invalid \('\(' in patternProperties is not a valid regular expression",
        ),
        ({"prompt": "p"}, r"t.jsonl:2: needs a string 'prompt' and an object 'schema'"),
        ({"prompt": "p", "schema": PERSON, "expected": {"name": "x"}}, r"t.jsonl:2: 'expected' must map JSON Pointers"),
        ({"prompt": "p", "schema": PERSON, "reference": {"name": 1}}, r"t.jsonl:2: the reference answer is not valid"),
        ({"prompt": "p", "schema": {"type": "string", "pattern": "^a$"}}, r"t.jsonl:2: cannot build a valid answer"),
        ({"prompt": "p", "schema": PERSON, "extra": 1}, r"t.jsonl:2: unknown field 'extra'"),
    ],
)
def test_a_bad_task_is_the_authors_one_line_error_at_load_time(tmp_path: Path, record: object, message: str) -> None:
    env = JsonSchema({"data": write_jsonl(tmp_path / "t.jsonl", [RECORDS[0], record])})
    with pytest.raises(DataFileError, match=message) as raised:
        env.tasks("train", 0, 1)
    assert isinstance(raised.value, NodusError) and "\n" not in str(raised.value)


def test_the_schemas_own_dialect_is_used(tmp_path: Path) -> None:
    # In draft-04 exclusiveMaximum is a boolean; in 2020-12 that schema would be invalid.
    draft4 = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "object",
        "properties": {"n": {"type": "integer", "maximum": 5, "exclusiveMaximum": True}},
        "required": ["n"],
    }
    records = [{"prompt": f"Pick n ({i}).", "schema": draft4, "reference": {"n": 3}} for i in range(20)]
    env = JsonSchema({"data": write_jsonl(tmp_path / "t.jsonl", records)})
    task = env.tasks("train", 0, 1)[0]
    assert env.grade(task, '```json\n{"n": 4}\n```').passed
    assert "5 is greater than or equal to the maximum of 5" in env.grade(task, '{"n": 5}').details


def test_generated_tasks_have_no_format_and_their_references_pass_the_stricter_validator() -> None:
    for task in JsonSchema({"depth": 3, "fixed_values": 3}).tasks("heldout", 7, 64):
        assert "format" not in keywords(task.data["schema"])
        validator_for(task.data["schema"]).validate(task.data["reference"])


def test_formats_are_checked_and_one_that_cannot_be_is_refused_at_load_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked = {
        "type": "object",
        "properties": {"email": {"type": "string", "format": "email"}, "ip": {"type": "string", "format": "ipv4"}},
        "required": ["email", "ip"],
    }
    records = [
        {"prompt": f"Contact {n}.", "schema": checked, "reference": {"email": f"p{n}@x.org", "ip": "10.0.0.1"}}
        for n in range(20)
    ]
    env = JsonSchema({"data": write_jsonl(tmp_path / "t.jsonl", records)})
    task = env.tasks("train", 0, 1)[0]
    assert env.grade(task, env.reference(task)).passed
    grade = env.grade(task, '```json\n{"email": "not an email", "ip": "::::"}\n```')
    assert (
        not grade.passed and "'not an email' is not a 'email'" in grade.details and "is not a 'ipv4'" in grade.details
    )
    # A format jsonschema cannot check here would accept anything: the file is refused, naming what to do. The
    # plugin's dependencies check uri; without rfc3986-validator jsonschema has no checker for it, as here.
    monkeypatch.delitem(jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers, "uri")
    cases = {
        "phone": r"t.jsonl:2: format 'phone' is not one jsonschema can check in this schema's dialect",
        "uri": re.escape(
            "t.jsonl:2: format 'uri' cannot be checked without the rfc3986-validator package; "
            "pip install 'jsonschema[format-nongpl]' (it brings rfc3986-validator), or remove the format"
        ),
    }
    for name, message in cases.items():
        schema = {"type": "object", "properties": {"x": {"type": "string", "format": name}}}
        bad = {"prompt": "p", "schema": schema, "reference": {}}
        with pytest.raises(DataFileError, match=message) as raised:
            JsonSchema({"data": write_jsonl(tmp_path / "t.jsonl", [records[0], bad])}).tasks("train", 0, 1)
        assert "\n" not in str(raised.value)


def test_the_packages_named_for_missing_formats_are_the_nongpl_extras() -> None:
    # jsonschema checks uri and iri with rfc3987 too, but that one is GPL: the plugin depends on format-nongpl.
    requirements = importlib.metadata.requires("jsonschema") or []
    nongpl = {re.split("[ ;<>=!]", line)[0] for line in requirements if "extra == 'format-nongpl'" in line}
    assert set(FORMAT_PACKAGES.values()) <= nongpl, set(FORMAT_PACKAGES.values()) - nongpl
    assert "rfc3987" not in FORMAT_PACKAGES.values()
    assert FORMAT_PACKAGES["uri"] == "rfc3986-validator" and FORMAT_PACKAGES["iri"] == "rfc3987-syntax"


def test_the_formats_data_files_use_most_are_checkable_with_the_plugins_dependencies() -> None:
    # jsonschema[format-nongpl] brings their checkers; without them these data files were refused.
    for name in ("date-time", "date", "time", "uri", "hostname", "duration", "json-pointer", "email", "uuid"):
        assert unchecked_formats({"format": name}) == [], name


def test_only_format_keywords_count_not_data_or_property_names() -> None:
    schema = {
        "properties": {"format": {"type": "string"}, "enum": {"format": "phone"}},
        "enum": [{"format": "phone"}],
        "const": {"format": "x"},
        "default": {"format": "y"},
        "items": {"format": "email"},
        "$defs": {"a": {"anyOf": [{"format": "z"}]}},
    }
    assert unchecked_formats(schema) == ["phone", "z"]
