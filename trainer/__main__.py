import sys

from trainer.train import main

sys.exit(main())
