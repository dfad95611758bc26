"""One rank of a calibration (`workers.run_ranks` starts these)."""

import sys

from stratagem.calibrate.workers import main

main(sys.argv[1:])
