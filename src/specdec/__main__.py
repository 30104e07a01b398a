import sys

from .cli import main

if __name__ == "__main__":  # vLLM starts workers with spawn, which re-imports this module
    sys.exit(main())
