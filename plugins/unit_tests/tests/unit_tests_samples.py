"""Problem records in the HumanEval and MBPP formats (written for these tests, in the datasets' style)."""

HUMANEVAL = [
    {
        "task_id": "Sample/0",
        "prompt": "from typing import List\n\n\n"
        "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        '    """Check if any two numbers are closer to each other than the threshold."""\n',
        "canonical_solution": "    for i, a in enumerate(numbers):\n        for j, b in enumerate(numbers):\n"
        "            if i != j and abs(a - b) < threshold:\n                return True\n    return False\n",
        "test": "\n\nMETADATA = {'author': 'jt', 'dataset': 'test'}\n\n\ndef check(candidate):\n"
        "    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True\n"
        "    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False\n"
        "    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) == True\n"
        "    assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 1.0) == True\n",
        "entry_point": "has_close_elements",
    },
    {
        "task_id": "Sample/1",
        "prompt": 'def strlen(string: str) -> int:\n    """Return the length of the given string."""\n',
        "canonical_solution": "    return len(string)\n",
        "test": "\n\ndef check(candidate):\n    assert candidate('') == 0\n    assert candidate('x') == 1\n"
        "    assert candidate('asdasnakj') == 9\n",
        "entry_point": "strlen",
    },
    {
        "task_id": "Sample/2",
        "prompt": "def truncate_number(number: float) -> float:\n"
        '    """Return the decimal part of a positive floating point number."""\n',
        "canonical_solution": "    return number % 1.0\n",
        "test": "\n\ndef check(candidate):\n    assert candidate(3.5) == 0.5\n"
        "    assert abs(candidate(1.33) - 0.33) < 1e-6\n    assert abs(candidate(123.456) - 0.456) < 1e-6\n",
        "entry_point": "truncate_number",
    },
]
HUMANEVAL_COMPUTED_ARGS = {
    "task_id": "Sample/3",
    "prompt": "def double(x: int) -> int:\n",
    "canonical_solution": "    return 2 * x\n",
    "test": "\n\ndef check(candidate):\n    for x in range(5):\n        assert candidate(x) == 2 * x\n",
    "entry_point": "double",
}
MBPP = [
    {
        "task_id": 2,
        "text": "Write a function to find the shared elements from the given two lists.",
        "code": "def similar_elements(test_tup1, test_tup2):\n  res = tuple(set(test_tup1) & set(test_tup2))\n"
        "  return (res) ",
        "test_list": [
            "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
            "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))",
            "assert set(similar_elements((11, 12, 14, 13),(17, 15, 14, 13))) == set((13, 14))",
        ],
        "test_setup_code": "",
    },
    {
        "task_id": 3,
        "text": "Write a python function to identify non-prime numbers.",
        "code": "import math\ndef is_not_prime(n):\n    result = False\n"
        "    for i in range(2,int(math.sqrt(n)) + 1):\n        if n % i == 0:\n            result = True\n"
        "    return result",
        "test_list": ["assert is_not_prime(2) == False", "assert is_not_prime(10) == True",
                      "assert is_not_prime(35) == True", "assert is_not_prime(37) == False"],
    },
    {
        "task_id": 4,
        "text": "Write a function to find the n largest integers from a given list of numbers, in descending order.",
        "code": "import heapq as hq\ndef heap_queue_largest(nums,n):\n  largest_nums = hq.nlargest(n, nums)\n"
        "  return largest_nums",
        "test_list": [
            "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],3)==[85, 75, 65]",
            "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],2)==[85, 75]",
        ],
    },
]
