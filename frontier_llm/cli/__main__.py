import sys

from frontier_llm.cli import main

sys.exit(main())
