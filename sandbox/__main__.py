"""``python -m nodus.sandbox '<json config>'`` starts one jailed grading worker (see worker.py).

Not ``python -m nodus.sandbox.worker``: the package imports that module, and runpy then warns on every start
("found in sys.modules"), a line that used to open every worker's stderr and so every diagnostic quoting it.
"""

import sys

from nodus.sandbox.worker import main

sys.exit(main(sys.argv))
