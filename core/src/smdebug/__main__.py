import sys

from smdebug.cli import main

sys.exit(main())
