"""The admission suite: five traffic shapes, each straight to vLLM and through a fresh ``kv-sidecar run``.

The benchmark's code is ``tests/harness/admission_suite.py`` (shared with the e2e tests, which never import ``bench/``).
"""

from tests.harness.admission_suite import main

if __name__ == "__main__":
    main()
