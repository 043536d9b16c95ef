import pytest
from hypothesis import given
from hypothesis import strategies as st
from nodus.core.errors import InvalidEnvironmentId
from nodus.core.ids import EnvId, format_env_id, parse_env_id

word = st.from_regex(r"[a-z0-9]+(-[a-z0-9]+){0,2}", fullmatch=True)


@given(namespace=word, name=word, version=st.none() | st.integers(min_value=1, max_value=10**6))
def test_parse_and_format_are_inverses(namespace: str, name: str, version: int | None) -> None:
    env_id = EnvId(namespace, name, version)
    assert parse_env_id(format_env_id(env_id)) == env_id
    assert format_env_id(parse_env_id(format_env_id(env_id))) == format_env_id(env_id)


def test_default_namespace_is_dropped() -> None:
    assert parse_env_id("nodus/graph-coloring@1") == parse_env_id("graph-coloring@1")
    assert format_env_id(parse_env_id("nodus/graph-coloring@1")) == "graph-coloring@1"
    assert format_env_id(parse_env_id("acme/graph-coloring")) == "acme/graph-coloring"


@pytest.mark.parametrize(
    "text", ["Graph", "graph--coloring@1", "graph-coloring@0", "graph-coloring@01", "a/b/c@1", "x@v1", ""]
)
def test_invalid_ids_say_the_grammar(text: str) -> None:
    with pytest.raises(InvalidEnvironmentId) as error:
        parse_env_id(text)
    assert f"invalid environment id {text!r}" in str(error.value)
    assert "e.g." in str(error.value)
