"""The spike: mixed short and long requests against vLLM, straight and through the sidecar, side by side.

The benchmark's code is ``tests/harness/spike.py`` (shared with the e2e tests, which never import ``bench/``).
"""

from tests.harness.spike import main

if __name__ == "__main__":
    main()
