"""The code in a completion: the last fenced block (```python, ```py or bare ```), else the whole text."""

from __future__ import annotations

import re

_FENCED = re.compile(r"```(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(completion: str) -> str:
    blocks = _FENCED.findall(completion)
    return blocks[-1] if blocks else completion
