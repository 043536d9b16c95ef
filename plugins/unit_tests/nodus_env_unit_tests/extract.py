"""The code in a completion: the last fenced block (```python, ```py or bare ```) that defines the function, else
the last fenced block, else the whole text."""

from __future__ import annotations

import re

_FENCED = re.compile(r"```(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(completion: str, entry_point: str | None = None) -> str:
    blocks = _FENCED.findall(completion)
    if entry_point is not None:
        # A solution is often followed by an example: a block that only calls it (print(f([1, 2]))) or shows its
        # output. Grading that block scored a correct solution 0 for a NameError.
        defines = re.compile(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(", re.MULTILINE)
        solutions = [block for block in blocks if defines.search(block)]
        if solutions:
            return str(solutions[-1])
    return str(blocks[-1]) if blocks else completion
