import json
from pathlib import Path

from nodus.core.testing import assert_conforms
from nodus_env_json_schema import JsonSchema


def test_generated_tasks_pass_the_conformance_kit() -> None:
    assert_conforms(JsonSchema({"depth": 3, "fixed_values": 3}), examples=8)


def test_file_tasks_pass_the_conformance_kit(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "minItems": 1}},
              "required": ["id", "tags"]}
    records = [{"prompt": f"Item {n}.", "schema": schema, "expected": {"/id": n}} for n in range(100)]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert_conforms(JsonSchema({"data": str(path)}), examples=4)
